// Device helpers shared by kiln's GEMM templates (gemm/mma_sm80.cu, gemm/wgmma_sm90.cu). Built into
// kiln::templates and handed to NVRTC as the in-memory header "gemm/gemm_common.cuh"; no placeholders.
//
// Needs "common/kiln_device.cuh", "kiln/templates/kernel_args.h" and a rendered epilogue (which defines
// kiln_epilogue_out_t, kiln_epilogue and kiln_epilogue_cast) included before it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

template <class T>
struct KilnIsBf16 {
  static constexpr bool value = false;
};
template <>
struct KilnIsBf16<__nv_bfloat16> {
  static constexpr bool value = true;
};

__device__ __forceinline__ unsigned kiln_smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// ------------------------------------------------------------------------------------------------ tiles
// Which output tile block `pid` computes. Consecutive pids walk down `group_m` tile rows before moving one
// tile column right, so blocks running at the same time share A rows and B columns in L2 (group_m = 1 is
// plain row-major order).
__device__ __forceinline__ void kiln_tile_of(int pid, int tiles_m, int tiles_n, int group_m, int& tm, int& tn) {
  const int per_group = group_m * tiles_n;
  const int group = pid / per_group;
  const int first_m = group * group_m;
  const int rows = min(tiles_m - first_m, group_m);
  const int in_group = pid - group * per_group;
  tm = first_m + in_group % rows;
  tn = in_group / rows;
}

// ------------------------------------------------------------------------------------------------ stores
// Two adjacent outputs (row, col) and (row, col + 1); col is even. Either the epilogue and the output cast to
// d (ldd), or, for split-K partials, raw fp32 to workspace slice z (leading dimension n). Elements outside
// [m, n) are skipped; pairs are stored in one instruction when the leading dimension keeps them aligned.
template <class Out>
__device__ __forceinline__ void kiln_store_pair_out(Out* p, Out a, Out b, bool paired) {
  if (paired) {
    if constexpr (sizeof(Out) == 2) {
      __align__(4) Out v[2] = {a, b};
      *reinterpret_cast<unsigned*>(p) = *reinterpret_cast<const unsigned*>(v);
    } else {
      *reinterpret_cast<float2*>(p) = make_float2(a, b);
    }
  } else {
    p[0] = a;
    p[1] = b;
  }
}

template <bool PARTIALS>
__device__ __forceinline__ void kiln_gemm_store2(const KilnGemmArgs& args, int z, int row, int col, float v0,
                                                 float v1) {
  if (row >= args.m || col >= args.n) return;
  const bool two = col + 1 < args.n;
  if constexpr (PARTIALS) {
    float* p = args.workspace + (static_cast<long long>(z) * args.m + row) * args.n + col;
    if (two) {
      kiln_store_pair_out<float>(p, v0, v1, (args.n & 1) == 0);
    } else {
      p[0] = v0;
    }
  } else {
    kiln_epilogue_out_t* p = static_cast<kiln_epilogue_out_t*>(args.d) + static_cast<long long>(row) * args.ldd + col;
    const kiln_epilogue_out_t r0 = kiln_epilogue_cast(kiln_epilogue(v0, row, col, args.ep));
    if (two) {
      const kiln_epilogue_out_t r1 = kiln_epilogue_cast(kiln_epilogue(v1, row, col + 1, args.ep));
      kiln_store_pair_out<kiln_epilogue_out_t>(p, r0, r1, (args.ldd & 1) == 0);
    } else {
      p[0] = r0;
    }
  }
}

// swap_ab kernels: (row, col) and (row, col + 1) of the kernel's D^T tile, whose args have m and n swapped
// (args.m is D's N, args.n is D's M), so they are D elements (col, row) and (col + 1, row). The epilogue
// sees D's own row and column; partials keep D's layout (row-major, leading dimension N).
template <bool PARTIALS>
__device__ __forceinline__ void kiln_gemm_store2_transposed(const KilnGemmArgs& args, int z, int row, int col,
                                                            float v0, float v1) {
  const int m = args.n, n = args.m;
  if (row >= n) return;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = col + i;
    if (r >= m) return;
    const float v = i ? v1 : v0;
    if constexpr (PARTIALS) {
      args.workspace[(static_cast<long long>(z) * m + r) * n + row] = v;
    } else {
      static_cast<kiln_epilogue_out_t*>(args.d)[static_cast<long long>(r) * args.ldd + row] =
          kiln_epilogue_cast(kiln_epilogue(v, r, row, args.ep));
    }
  }
}

// The K range of split-K slice z: [k_begin, k_end). Without split-K, the whole of K.
__device__ __forceinline__ void kiln_k_range(const KilnGemmArgs& args, int z, int& k_begin, int& k_end) {
  if (args.split_k > 1) {
    k_begin = z * args.k_per_split;
    k_end = min(args.k, k_begin + args.k_per_split);
    if (k_begin > k_end) k_begin = k_end;
  } else {
    k_begin = 0;
    k_end = args.k;
  }
}
