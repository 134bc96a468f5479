// Stand-in for kiln's GEMM templates in the pool benchmark: a bf16 tensor-core GEMM (cp.async multi-stage
// pipeline, swizzled shared memory, ldmatrix, mma.sync m16n8k16, bias + GELU epilogue), its tile shape set by
// BM BN BK WM WN STAGES macros (rendered at @PARAMS@ below, or given as -D options). POOL_VARIANT only makes
// each compile a distinct key.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda/std/cstdint>
#include <cuda/std/type_traits>

// The first declaration ends the header preamble that NVRTC's automatic PCH covers; the configuration comes
// after it (as a rendered template's parameters do), so every configuration reuses one PCH. Given as -D
// options instead, each compile would need its own PCH.
namespace pool_bench {
struct Preamble;
}
// @PARAMS@

#ifndef BM
#error "compile with -DBM=.. -DBN=.. -DBK=.. -DWM=.. -DWN=.. -DSTAGES=.."
#endif
#ifndef POOL_VARIANT
#define POOL_VARIANT 0
#endif

namespace pool_bench {

using u32 = cuda::std::uint32_t;

template <int kBM, int kBN, int kBK, int kWM, int kWN, int kStages>
struct Shape {
  static_assert(kBM % kWM == 0 && kBN % kWN == 0, "warp tiles must divide the block tile");
  static_assert(kWM % 16 == 0 && kWN % 8 == 0 && kBK % 16 == 0, "mma.m16n8k16 granularity");
  static constexpr int warps_m = kBM / kWM;
  static constexpr int warps_n = kBN / kWN;
  static constexpr int threads = warps_m * warps_n * 32;
  static constexpr int mma_m = kWM / 16;
  static constexpr int mma_n = kWN / 8;
  static constexpr int a_elems = kBM * kBK;
  static constexpr int b_elems = kBK * kBN;
  static constexpr int smem_bytes = kStages * (a_elems + b_elems) * 2;
};

__device__ __forceinline__ u32 smem_addr(const void* p) {
  return static_cast<u32>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void copy16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void wait_pending() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ void load_a(u32 (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void load_b(u32 (&r)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void mma(float (&c)[4], const u32 (&a)[4], const u32 (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// XOR swizzle of 16-byte chunks within a row: conflict-free ldmatrix.
__device__ __forceinline__ int swizzle(int row, int col) { return col ^ ((row & 7) << 3); }

template <class T>
__device__ __forceinline__ float epilogue(float x, float bias) {
  x += bias;
  const float k = 0.7978845608028654f;
  float g = 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
  if constexpr (cuda::std::is_same_v<T, __half>) g = fminf(fmaxf(g, -65504.0f), 65504.0f);
  return g * (1.0f + POOL_VARIANT * 0.0f);
}

template <int kBM, int kBN, int kBK, int kWM, int kWN, int kStages, class TOut>
__device__ void gemm_tile(int M, int N, int K, const __nv_bfloat16* __restrict__ A,
                          const __nv_bfloat16* __restrict__ B, const float* __restrict__ bias,
                          TOut* __restrict__ D, unsigned char* smem) {
  using S = Shape<kBM, kBN, kBK, kWM, kWN, kStages>;
  __nv_bfloat16* sa = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* sb = sa + kStages * S::a_elems;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / S::warps_n, wn = warp % S::warps_n;
  const int row0 = blockIdx.y * kBM, col0 = blockIdx.x * kBN;
  const int tiles = (K + kBK - 1) / kBK;
  float acc[S::mma_m][S::mma_n][4] = {};

  auto stage_in = [&](int stage, int kt) {
#pragma unroll 4
    for (int i = tid; i < kBM * kBK / 8; i += S::threads) {
      int r = i / (kBK / 8), c = (i % (kBK / 8)) * 8;
      int gr = row0 + r, gc = kt * kBK + c;
      bool ok = gr < M && gc < K;
      copy16(sa + stage * S::a_elems + r * kBK + swizzle(r, c), A + (ok ? gr * K + gc : 0), ok);
    }
#pragma unroll 4
    for (int i = tid; i < kBK * kBN / 8; i += S::threads) {
      int r = i / (kBN / 8), c = (i % (kBN / 8)) * 8;
      int gr = kt * kBK + r, gc = col0 + c;
      bool ok = gr < K && gc < N;
      copy16(sb + stage * S::b_elems + r * kBN + swizzle(r, c), B + (ok ? gr * N + gc : 0), ok);
    }
  };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < tiles) stage_in(s, s);
    commit();
  }
  for (int kt = 0; kt < tiles; ++kt) {
    wait_pending<kStages - 2>();
    __syncthreads();
    if (kt + kStages - 1 < tiles) stage_in((kt + kStages - 1) % kStages, kt + kStages - 1);
    commit();
    const __nv_bfloat16* a = sa + (kt % kStages) * S::a_elems;
    const __nv_bfloat16* b = sb + (kt % kStages) * S::b_elems;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      u32 af[S::mma_m][4], bf[S::mma_n][2];
#pragma unroll
      for (int i = 0; i < S::mma_m; ++i) {
        int r = wm * kWM + i * 16 + (lane & 15), c = kk + (lane >> 4) * 8;
        load_a(af[i], a + r * kBK + swizzle(r, c));
      }
#pragma unroll
      for (int j = 0; j < S::mma_n; ++j) {
        int r = kk + (lane & 15), c = wn * kWN + j * 8;
        load_b(bf[j], b + r * kBN + swizzle(r, c));
      }
#pragma unroll
      for (int i = 0; i < S::mma_m; ++i)
#pragma unroll
        for (int j = 0; j < S::mma_n; ++j) mma(acc[i][j], af[i], bf[j]);
    }
  }
  wait_pending<0>();

#pragma unroll
  for (int i = 0; i < S::mma_m; ++i)
#pragma unroll
    for (int j = 0; j < S::mma_n; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int r = row0 + wm * kWM + i * 16 + (lane >> 2) + (e >> 1) * 8;
        int c = col0 + wn * kWN + j * 8 + (lane & 3) * 2 + (e & 1);
        if (r < M && c < N) {
          float v = epilogue<TOut>(acc[i][j][e], bias ? bias[c] : 0.0f);
          if constexpr (cuda::std::is_same_v<TOut, __half>) {
            D[r * N + c] = __float2half(v);
          } else {
            D[r * N + c] = __float2bfloat16(v);
          }
        }
      }
}

}  // namespace pool_bench

extern "C" __global__ void __launch_bounds__(pool_bench::Shape<BM, BN, BK, WM, WN, STAGES>::threads)
pool_gemm(int M, int N, int K, const __nv_bfloat16* A, const __nv_bfloat16* B, const float* bias,
          __nv_bfloat16* D) {
  extern __shared__ __align__(16) unsigned char smem[];
  pool_bench::gemm_tile<BM, BN, BK, WM, WN, STAGES>(M, N, K, A, B, bias, D, smem);
}
