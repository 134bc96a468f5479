// The argument ABI of every kiln template kernel: one plain struct per family, passed BY VALUE as the kernel's
// only parameter (`extern "C" __global__ void kiln_rmsnorm(const KilnNormArgs args)`).
//
// This header is compiled twice: by the host compiler (it is a public kiln header) and by NVRTC (it is built
// into kiln::templates and handed to every rendered kernel as the in-memory header
// "kiln/templates/kernel_args.h"). So it is written in the common subset of C and CUDA C++: no std types, no
// includes, fixed-size fields only, and its layout is the same on both sides. Changing a struct here changes
// the source of every kernel that includes it, and so every kernel key: no stale binary can be loaded.
//
// Conventions: sizes are `int` (kernels index with 32-bit ints; kiln refuses sizes >= 2^31), leading
// dimensions and strides are `long long` and counted in ELEMENTS of their tensor's dtype. A pointer that the
// configuration does not use (e.g. `residual` without a residual epilogue) may be null.
#ifndef KILN_TEMPLATES_KERNEL_ARGS_H_
#define KILN_TEMPLATES_KERNEL_ARGS_H_

/// The run-time arguments of a rendered epilogue (kiln/templates/epilogue.h). Fields the epilogue spec does
/// not use are ignored.
struct KilnEpilogueArgs {
  const void* bias;       // [N] in the spec's bias dtype, added per output column
  const void* residual;   // [M, ld_residual] in the spec's residual dtype, added elementwise
  long long ld_residual;  // elements
  float alpha;            // the `scale` op multiplies by alpha
  float beta;             // the residual op adds beta * residual (1 for a plain residual add)
};

/// D[M,N] = epilogue(A[M,K] . B[K,N]). A and B layouts and dtypes are template parameters; lda/ldb/ldd are the
/// leading dimensions of the layouts the configuration was rendered for.
///
/// Split-K: a GEMM template rendered with its `partials` parameter true writes no epilogue and no `d`:
/// slice z = blockIdx.z of [0, split_k) accumulates K range [z*k_per_split, min(K, (z+1)*k_per_split)) and
/// stores fp32 partials, row-major with leading dimension N, to `workspace + z*M*N` (floats). The reduction
/// (template "splitk_reduce") then sums the slices, applies the epilogue and writes d. With `partials` false,
/// split_k is 1, k_per_split is K and workspace is unused.
struct KilnGemmArgs {
  const void* a;
  const void* b;
  void* d;
  float* workspace;  // fp32 partials when rendered with partials=true; else null
  int m, n, k;
  int split_k;       // slices (grid z); 1 without split-K
  int k_per_split;   // K range per slice; any positive value (kiln uses multiples of 128)
  int flags;         // KILN_GEMM_* bits below; 0 promises nothing
  long long lda, ldb, ldd;
  KilnEpilogueArgs ep;
};

/// The caller's promise that no kernel earlier in the stream writes B (a weight): a template configuration may
/// then load B before waiting for the previous kernel (programmatic dependent launch), so that its first loads
/// overlap that kernel's tail. Configurations without such early loads ignore it.
#define KILN_GEMM_B_CONSTANT 1

/// RMSNorm and LayerNorm over each row of x[rows, cols]:
///   h = x (+ residual when the template has residual=true; then h is also written to residual_out)
///   rmsnorm:   y = h / sqrt(mean(h^2) + eps) * weight
///   layernorm: y = (h - mean(h)) / sqrt(var(h) + eps) * weight (+ bias when has_bias=true)
/// All tensors are in the template's dtype; weight and bias are [cols]. Statistics are computed in fp32.
struct KilnNormArgs {
  const void* x;
  const void* residual;      // residual=true only
  void* residual_out;        // residual=true only; may alias x or residual (each element is read before written)
  const void* weight;        // [cols]
  const void* bias;          // layernorm with has_bias=true only
  void* y;
  int rows, cols;
  long long ld_x, ld_residual, ld_residual_out, ld_y;
  float eps;
  int pad0;
};

/// y = softmax(scale * x) over each row of x[rows, cols], computed in fp32.
struct KilnSoftmaxArgs {
  const void* x;
  void* y;
  int rows, cols;
  long long ld_x, ld_y;
  float scale;
  int pad0;
};

/// d[m, n] = epilogue(sum over s < slices of workspace[s*slice_stride + i*n + j]) in the template's output
/// dtype; workspace is fp32, row-major with leading dimension n; slice_stride is normally m*n.
struct KilnSplitKReduceArgs {
  const float* workspace;
  void* d;
  int m, n;
  int slices;
  int pad0;
  long long slice_stride;  // elements between slices (m*n for the GEMM partials layout)
  long long ldd;
  KilnEpilogueArgs ep;
};

/// All-reduce (sum) across the ranks of a communicator through peer-mapped buffers (kiln/runtime/comm.h
/// PeerBuffers). Before the launch each rank has copied its input into its own staging buffer data[rank]; the
/// kernel reads every rank's staging through the peer mappings. signals[r] is rank r's signal area
/// (KILN_AR_SIGNAL_WORDS words, zeroed once at creation, never reset): per block index an epoch counter, then
/// per phase, block index and sending rank one flag word. Only `world` (a template parameter) entries are used.
/// algo=push writes the input into slot (parity * world + rank) of every rank's push area and sums its own.
///   allreduce:          out[i] = sum over ranks of data[r][i], i < count
///   allreduce_rmsnorm:  h = sum over ranks of data[r][row, :] + residual[row, :] -> residual_out (may alias
///                       residual); out[row, :] = h / sqrt(mean(h^2) + eps) * weight; count = rows * cols.
#define KILN_AR_MAX_RANKS 8
#define KILN_AR_MAX_BLOCKS 256
#define KILN_AR_PHASES 3
#define KILN_AR_SIGNAL_WORDS (KILN_AR_MAX_BLOCKS + KILN_AR_PHASES * KILN_AR_MAX_BLOCKS * KILN_AR_MAX_RANKS)
struct KilnAllReduceArgs {
  void* data[KILN_AR_MAX_RANKS];
  unsigned* signals[KILN_AR_MAX_RANKS];
  void* push[KILN_AR_MAX_RANKS];  // algo=push only: every rank's push area, 2 x world slots of `slot` elements
  void* gather[KILN_AR_MAX_RANKS];  // algo=twoshot only: where the all-gather writes (data, or other peer memory)
  const void* in;                 // algo=push: this rank's input, read where it is; the others: a staged call's
                                  // input, copied into data[rank] by the kernel (null: the input is in data)
  void* out;
  const void* residual;   // allreduce_rmsnorm only
  void* residual_out;     // allreduce_rmsnorm only
  const void* weight;     // allreduce_rmsnorm only, [cols]
  int rank;
  int count;              // elements
  int rows, cols;         // allreduce_rmsnorm only
  float eps;
  int pad0;
  long long slot;         // algo=push only: elements per slot
};

#endif  // KILN_TEMPLATES_KERNEL_ARGS_H_
