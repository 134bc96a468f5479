// kiln's bundled sample kernel: y = alpha * x + y over n elements of T, with VEC elements per thread.
// Compiled through the JIT core by `kiln compile --sample` (the main job until the autotuner exists).
#include <cuda_fp16.h>

template <typename T, int VEC>
__global__ void axpy(int n, float alpha, const T* __restrict__ x, T* __restrict__ y) {
  int base = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    int j = base + i;
    if (j < n) y[j] = static_cast<T>(alpha * static_cast<float>(x[j]) + static_cast<float>(y[j]));
  }
}
