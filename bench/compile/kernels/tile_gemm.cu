// A realistic "larger" kernel for the compile benchmark: a bf16 tensor-core GEMM tile loop with a cp.async
// multi-stage pipeline, ldmatrix and mma.sync, templated on its tile shape like kiln's GEMM templates.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda/std/cstdint>

namespace bench {

template <int BM, int BN, int BK, int WM, int WN, int STAGES>
struct Tile {
  static constexpr int kWarpsM = BM / WM;
  static constexpr int kWarpsN = BN / WN;
  static constexpr int kThreads = kWarpsM * kWarpsN * 32;
  static constexpr int kMmaM = WM / 16;
  static constexpr int kMmaN = WN / 8;
  static constexpr int kSmemA = BM * BK;
  static constexpr int kSmemB = BN * BK;
};

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool pred) {
  unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  int bytes = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* smem) {
  unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
__device__ __forceinline__ void ldmatrix_x2(unsigned (&r)[2], const void* smem) {
  unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(s));
}
__device__ __forceinline__ void mma_bf16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ float gelu(float x) {
  const float k = 0.7978845608028654f;
  return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

template <int BM, int BN, int BK, int WM, int WN, int STAGES>
__global__ void __launch_bounds__(Tile<BM, BN, BK, WM, WN, STAGES>::kThreads)
gemm(int M, int N, int K, const __nv_bfloat16* __restrict__ A, const __nv_bfloat16* __restrict__ B,
     const float* __restrict__ bias, __nv_bfloat16* __restrict__ D) {
  using T = Tile<BM, BN, BK, WM, WN, STAGES>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __nv_bfloat16* sA = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  __nv_bfloat16* sB = sA + STAGES * T::kSmemA;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wm = warp / T::kWarpsN, wn = warp % T::kWarpsN;
  const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;
  float acc[T::kMmaM][T::kMmaN][4] = {};
  const int k_tiles = (K + BK - 1) / BK;

  auto load_stage = [&](int stage, int kt) {
    for (int i = tid; i < BM * BK / 8; i += T::kThreads) {
      int r = i / (BK / 8), c = (i % (BK / 8)) * 8;
      int gr = bm + r, gc = kt * BK + c;
      bool ok = gr < M && gc < K;
      cp_async16(sA + stage * T::kSmemA + r * BK + (c ^ ((r & 7) << 3)), A + (ok ? gr * K + gc : 0), ok);
    }
    for (int i = tid; i < BK * BN / 8; i += T::kThreads) {
      int r = i / (BN / 8), c = (i % (BN / 8)) * 8;
      int gr = kt * BK + r, gc = bn + c;
      bool ok = gr < K && gc < N;
      cp_async16(sB + stage * T::kSmemB + r * BN + (c ^ ((r & 7) << 3)), B + (ok ? gr * N + gc : 0), ok);
    }
  };

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    int next = kt + STAGES - 1;
    if (next < k_tiles) load_stage(next % STAGES, next);
    cp_async_commit();
    const __nv_bfloat16* a = sA + (kt % STAGES) * T::kSmemA;
    const __nv_bfloat16* b = sB + (kt % STAGES) * T::kSmemB;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      unsigned af[T::kMmaM][4], bf[T::kMmaN][2];
#pragma unroll
      for (int i = 0; i < T::kMmaM; ++i) {
        int r = wm * WM + i * 16 + (lane % 16), c = kk + (lane / 16) * 8;
        ldmatrix_x4(af[i], a + r * BK + (c ^ ((r & 7) << 3)));
      }
#pragma unroll
      for (int j = 0; j < T::kMmaN; ++j) {
        int r = kk + (lane % 16), c = wn * WN + j * 8;
        ldmatrix_x2(bf[j], b + r * BN + (c ^ ((r & 7) << 3)));
      }
#pragma unroll
      for (int i = 0; i < T::kMmaM; ++i)
#pragma unroll
        for (int j = 0; j < T::kMmaN; ++j) mma_bf16(acc[i][j], af[i], bf[j]);
    }
  }
#pragma unroll
  for (int i = 0; i < T::kMmaM; ++i) {
#pragma unroll
    for (int j = 0; j < T::kMmaN; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int r = bm + wm * WM + i * 16 + (lane / 4) + (e / 2) * 8;
        int c = bn + wn * WN + j * 8 + (lane % 4) * 2 + (e % 2);
        if (r < M && c < N) D[r * N + c] = __float2bfloat16(gelu(acc[i][j][e] + bias[c]) * KILN_VARIANT_SCALE);
      }
    }
  }
}

}  // namespace bench
