// Device helpers shared by kiln's templates (built into kiln::templates; handed to NVRTC as the in-memory
// header "common/kiln_device.cuh"). Not itself a template: no placeholders.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

// Programmatic dependent launch (sm_90+; kiln launches its Hopper kernels with it, see Launch::programmatic): the
// grid may be scheduled while the previous kernel of the stream still runs. kiln_wait_prior_grid() returns once that
// kernel has completed and its writes are visible, so a kernel calls it before its first global load or store; until
// then only its prologue (barrier set-up, descriptor prefetch) overlaps the previous kernel's tail.
// kiln_allow_next_grid() lets the next kernel be scheduled as soon as every block of this one has called it (it then
// waits in its own kiln_wait_prior_grid()); without it the next kernel launches as this one's blocks exit. Both are
// no-ops without the launch attribute and before sm_90.
__device__ __forceinline__ void kiln_wait_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void kiln_allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// fp32 <-> storage dtypes.
__device__ __forceinline__ float kiln_to_f32(float v) { return v; }
__device__ __forceinline__ float kiln_to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float kiln_to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T>
__device__ __forceinline__ T kiln_from_f32(float v);
template <>
__device__ __forceinline__ float kiln_from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half kiln_from_f32<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 kiln_from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Activations (fp32).
__device__ __forceinline__ float kiln_relu(float v) { return v > 0.f ? v : 0.f; }
__device__ __forceinline__ float kiln_gelu_tanh(float v) {
  const float k0 = 0.7978845608028654f;  // sqrt(2/pi)
  const float k1 = 0.044715f;
  return 0.5f * v * (1.f + tanhf(k0 * (v + k1 * v * v * v)));
}
__device__ __forceinline__ float kiln_silu(float v) { return v / (1.f + __expf(-v)); }

// An aligned vector of N elements of T, loaded and stored in one instruction (N * sizeof(T) in {2,4,8,16}).
template <class T, int N>
struct alignas(sizeof(T) * N) KilnVec {
  T v[N];
};

template <class T, int N>
__device__ __forceinline__ KilnVec<T, N> kiln_load_vec(const T* p) {
  return *reinterpret_cast<const KilnVec<T, N>*>(p);
}
// Streaming load: read once, do not keep in L1.
template <class T, int N>
__device__ __forceinline__ KilnVec<T, N> kiln_load_vec_stream(const T* p) {
  KilnVec<T, N> out;
  if constexpr (sizeof(KilnVec<T, N>) == 16) {
    uint4 r = __ldcs(reinterpret_cast<const uint4*>(p));
    out = *reinterpret_cast<KilnVec<T, N>*>(&r);
  } else if constexpr (sizeof(KilnVec<T, N>) == 8) {
    uint2 r = __ldcs(reinterpret_cast<const uint2*>(p));
    out = *reinterpret_cast<KilnVec<T, N>*>(&r);
  } else if constexpr (sizeof(KilnVec<T, N>) == 4) {
    unsigned r = __ldcs(reinterpret_cast<const unsigned*>(p));
    out = *reinterpret_cast<KilnVec<T, N>*>(&r);
  } else {
    out = *reinterpret_cast<const KilnVec<T, N>*>(p);
  }
  return out;
}
template <class T, int N>
__device__ __forceinline__ void kiln_store_vec(T* p, const KilnVec<T, N>& v) {
  *reinterpret_cast<KilnVec<T, N>*>(p) = v;
}

// Reductions over a warp (all lanes get the result), by an associative operation.
struct KilnSum {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct KilnMax {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
template <class Op>
__device__ __forceinline__ float kiln_warp_reduce(float v, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float kiln_warp_sum(float v) { return kiln_warp_reduce(v, KilnSum{}); }
__device__ __forceinline__ float kiln_warp_max(float v) { return kiln_warp_reduce(v, KilnMax{}); }

// Where a thread stands in a kernel whose rows are each shared by ROW_THREADS consecutive threads (whole warps),
// ROWS rows a block: its index among the row's threads, the first warp of its row's group (for
// kiln_group_reduce) and its row.
struct KilnRowPlace {
  int t;
  int warp0;
  long long row;
};
template <int ROW_THREADS, int ROWS>
__device__ __forceinline__ KilnRowPlace kiln_row_place() {
  const int group = threadIdx.x / ROW_THREADS;
  return {static_cast<int>(threadIdx.x % ROW_THREADS), group * (ROW_THREADS / 32),
          (long long)blockIdx.x * ROWS + group};
}

// Reduction over the WARPS consecutive warps that share a row (WARPS a power of two, <= 32). `scratch` holds
// at least (blockDim.x / 32) floats; every thread of the block must call it (it has a __syncthreads()).
// `group_warp0` is the index of the first warp of the caller's group; `identity` is op's neutral value. All
// callers get the result.
template <int WARPS, class Op>
__device__ __forceinline__ float kiln_group_reduce(float v, float* scratch, int group_warp0, float identity, Op op) {
  v = kiln_warp_reduce(v, op);
  if constexpr (WARPS == 1) {
    return v;
  } else {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();  // scratch may still be read by a previous reduction
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float r = lane < WARPS ? scratch[group_warp0 + lane] : identity;
    return kiln_warp_reduce(r, op);
  }
}
template <int WARPS>
__device__ __forceinline__ float kiln_group_sum(float v, float* scratch, int group_warp0) {
  return kiln_group_reduce<WARPS>(v, scratch, group_warp0, 0.f, KilnSum{});
}
template <int WARPS>
__device__ __forceinline__ float kiln_group_max(float v, float* scratch, int group_warp0) {
  return kiln_group_reduce<WARPS>(v, scratch, group_warp0, __int_as_float(0xff800000), KilnMax{});
}
