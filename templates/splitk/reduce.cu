// kiln template: split-K reduction. d[m, n] = epilogue(sum over s < slices of workspace[s][m][n]) where the
// workspace holds fp32 partials (row-major, leading dimension n, slices slice_stride apart) written by a GEMM
// rendered with partials=true. The epilogue (${epilogue.tag}) is applied once, after the sum, then cast to the
// output dtype. ${threads} threads per block, ${vec} consecutive elements per thread per step; m, n, slices
// and ldd are run-time arguments. Vector accesses need n and ldd to be multiples of ${vec} and d aligned;
// otherwise the kernel takes its scalar path (checked at run time, uniformly for the grid).
#include "common/kiln_device.cuh"
#include "kiln/templates/kernel_args.h"

${epilogue}
constexpr int kThreads = ${threads};
constexpr int kVec = ${vec};

extern "C" __global__ void __launch_bounds__(kThreads) kiln_splitk_reduce(const KilnSplitKReduceArgs args) {
  const int n = args.n;
  const long long total = (long long)args.m * n;
  const long long stride = (long long)gridDim.x * kThreads;
  typedef kiln_epilogue_out_t O;
  O* d = static_cast<O*>(args.d);
  const bool vec_ok = kVec > 1 && n % kVec == 0 && args.ldd % kVec == 0 && args.slice_stride % kVec == 0 &&
                      (reinterpret_cast<unsigned long long>(d) % (kVec * sizeof(O))) == 0 &&
                      (reinterpret_cast<unsigned long long>(args.workspace) % (kVec * sizeof(float))) == 0;
  if (vec_ok) {
    for (long long v = (long long)blockIdx.x * kThreads + threadIdx.x; v < total / kVec; v += stride) {
      const long long e = v * kVec;
      const int row = (int)(e / n), col = (int)(e % n);
      float acc[kVec];
      KilnVec<float, kVec> p = kiln_load_vec_stream<float, kVec>(args.workspace + e);
#pragma unroll
      for (int j = 0; j < kVec; ++j) acc[j] = p.v[j];
      for (int s = 1; s < args.slices; ++s) {
        p = kiln_load_vec_stream<float, kVec>(args.workspace + s * args.slice_stride + e);
#pragma unroll
        for (int j = 0; j < kVec; ++j) acc[j] += p.v[j];
      }
      KilnVec<O, kVec> out;
#pragma unroll
      for (int j = 0; j < kVec; ++j) out.v[j] = kiln_epilogue_cast(kiln_epilogue(acc[j], row, col + j, args.ep));
      kiln_store_vec<O, kVec>(d + (long long)row * args.ldd + col, out);
    }
    return;
  }
  for (long long e = (long long)blockIdx.x * kThreads + threadIdx.x; e < total; e += stride) {
    const int row = (int)(e / n), col = (int)(e % n);
    float acc = 0.f;
    for (int s = 0; s < args.slices; ++s) acc += args.workspace[s * args.slice_stride + e];
    d[(long long)row * args.ldd + col] = kiln_epilogue_cast(kiln_epilogue(acc, row, col, args.ep));
  }
}
