// kiln template: split-row softmax for long rows (vocabulary sizes), y = softmax(scale * x) per row,
// ${dtype.name} in and out, fp32 arithmetic, sm_90 thread-block clusters.
//
// One row is spread over a cluster of ${cluster} blocks of ${threads} threads: block r of the cluster keeps its
// slice of the row in registers (${items} vectors of ${vec} elements per thread, raw), reduces the slice's max
// and sum of exp, publishes them in its shared memory, and after a cluster barrier every block combines the
// cluster's (max, sum) pairs over distributed shared memory and writes its slice. x is read once and y written
// once, and a handful of rows still spreads over many SMs (a block per row would leave most idle). Rows of
// up to cluster * threads * vec * items columns; rows and cols are run-time arguments.
#include "common/kiln_device.cuh"
#include "kiln/templates/kernel_args.h"

typedef ${dtype} T;
constexpr int kThreads = ${threads}, kVec = ${vec}, kItems = ${items}, kCluster = ${cluster};
constexpr int kWarps = kThreads / 32;
typedef KilnVec<T, kVec> V;

__device__ __forceinline__ void kiln_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// The (max, sum) pair block `rank` of the cluster published at `local` in its own shared memory.
__device__ __forceinline__ float2 kiln_cluster_load_f2(const float2* local, unsigned rank) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
               : "=r"(remote)
               : "r"(static_cast<unsigned>(__cvta_generic_to_shared(local))), "r"(rank));
  float2 v;
  asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(remote) : "memory");
  return v;
}

extern "C" __global__ void __launch_bounds__(kThreads) kiln_softmax_cluster(const KilnSoftmaxArgs args) {
  __shared__ float scratch[kWarps];
  __shared__ float2 published;  // this block's (max, sum of exp(v - max)) over its slice
  __shared__ float2 combined;   // the row's
  const int t = threadIdx.x;
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  const long long row = blockIdx.x / kCluster;
  const bool active = row < args.rows;
  const int cols = args.cols;
  const float scale = args.scale;
  const float kNegInf = __int_as_float(0xff800000);
  // The slice: a multiple of kVec columns, so every vector access stays aligned.
  const int per = ((cols + kCluster - 1) / kCluster + kVec - 1) / kVec * kVec;
  const int begin = static_cast<int>(rank) * per, end = min(cols, begin + per);
  const T* x = static_cast<const T*>(args.x) + row * args.ld_x;
  T* y = static_cast<T*>(args.y) + row * args.ld_y;

  V kept[kItems];
  float m = kNegInf;
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int col = begin + (i * kThreads + t) * kVec;
    if (active && col < end) {
      kept[i] = kiln_load_vec_stream<T, kVec>(x + col);
#pragma unroll
      for (int j = 0; j < kVec; ++j) m = fmaxf(m, kiln_to_f32(kept[i].v[j]) * scale);
    }
  }
  m = kiln_group_max<kWarps>(m, scratch, 0);
  float s = 0.f;
  if (m != kNegInf) {
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int col = begin + (i * kThreads + t) * kVec;
      if (active && col < end) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) s += __expf(kiln_to_f32(kept[i].v[j]) * scale - m);
      }
    }
  }
  s = kiln_group_sum<kWarps>(s, scratch, 0);
  if (t == 0) published = make_float2(m, s);
  kiln_cluster_sync();  // every block's pair is published
  if (t < 32) {
    float2 p = t < kCluster ? kiln_cluster_load_f2(&published, t) : make_float2(kNegInf, 0.f);
    const float gm = kiln_warp_max(p.x);
    // A slice with no finite value adds nothing; a row that is all -inf gives NaN, as in PyTorch.
    const float gs = kiln_warp_sum(p.x == kNegInf ? 0.f : p.y * __expf(p.x - gm));
    if (t == 0) combined = make_float2(gm, gs);
  }
  kiln_cluster_sync();  // the pairs were read: a block may leave (its shared memory goes with it)
  const float gm = combined.x, inv = 1.f / combined.y;
  if (!active) return;
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int col = begin + (i * kThreads + t) * kVec;
    if (col < end) {
      V out;
#pragma unroll
      for (int j = 0; j < kVec; ++j) out.v[j] = kiln_from_f32<T>(__expf(kiln_to_f32(kept[i].v[j]) * scale - gm) * inv);
      kiln_store_vec<T, kVec>(y + col, out);
    }
  }
}
