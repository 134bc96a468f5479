// The tuner's fixed helper kernels (runtime/tune/kernels/helpers.cu, built into kiln::tune as a fatbin):
// random inputs, on-GPU comparison of an output with a reference, reference norms and softmax, and the L2 flush
// between timed runs. Ops use them to fill their buffers (OpDef::buffers) and for plain reference choices.
#pragma once

#include <cuda.h>

#include "kiln/jit/module.h"
#include "kiln/runtime/problem.h"
#include "kiln/status.h"

namespace kiln::runtime {

struct HelperKernels {
  Kernel fill_uniform;
  Kernel compare;
  Kernel reference_norm;
  Kernel reference_softmax;
  Kernel flush_l2;
  Kernel hold;
};

/// The helpers loaded in the current context (loaded on first use per context, kept for the process).
Result<const HelperKernels*> helper_kernels();

/// Fills `count` elements of `dtype` at `ptr` with uniform values in [lo, hi) from `seed`.
Status fill_uniform(CUdeviceptr ptr, int64_t count, DType dtype, uint32_t seed, float lo, float hi, CUstream stream);

/// Reads `bytes` (a multiple of 16, 16-byte aligned) at `buffer`, which holds one repeated 32-bit word: the L2 flush
/// between timed runs, which leaves L2 holding clean lines (see BenchmarkOptions::flush_l2_by_writing).
Status read_through_l2(CUdeviceptr buffer, size_t bytes, CUstream stream);

/// Queues a kernel on `stream` that waits until the 64-bit word at `released` (pinned host memory the device can
/// read) is at least `ticket`, or `timeout_ns` has passed: what follows it on the stream starts only then.
Status hold_stream(CUdeviceptr released, uint64_t ticket, uint64_t timeout_ns, CUstream stream);

/// ‖out − ref‖ / ‖ref‖ over a rows x cols region, and how many outputs are not finite. Synchronises `stream`.
struct Comparison {
  double relative_error = 0;
  int64_t non_finite = 0;
};
Result<Comparison> compare(CUdeviceptr out, DType out_dtype, int64_t ld_out, CUdeviceptr ref, DType ref_dtype,
                           int64_t ld_ref, int64_t rows, int64_t cols, CUstream stream);

}  // namespace kiln::runtime
