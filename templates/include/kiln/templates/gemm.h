// The GEMM template families: D[M,N] = epilogue(A[M,K] . B[K,N]), bf16/fp16 in, fp32 accumulate.
//
//   gemm_mma_sm80    mma.sync m16n8k16 + a cp.async multi-stage pipeline (sm_80 and later, sm_90 included).
//                    Any leading dimension: `align` (8, 4, 2, 1 elements) sets the global load width.
//   gemm_wgmma_sm90  wgmma + TMA, warp-specialised producer/consumer with mbarriers, optionally persistent
//                    (sm_90a only). Needs lda and ldb multiples of 8 elements (TMA rows are 16-byte aligned).
//
// Both take KilnGemmArgs (kiln/templates/kernel_args.h), share the problem parameters below, render the
// epilogue (kiln/templates/epilogue.h) into their store path, and with `partials` write split-K fp32 partials
// for the "splitk_reduce" template (see make_splitk_gemm in kiln/templates/launch.h).
//
// Parameters (names as in the templates' ParamSpecs):
//   problem:  dtype (bf16 | f16), layout_a, layout_b (row | col), epilogue (code), partials (bool);
//             gemm_mma_sm80 also `align`.
//   gemm_mma_sm80 tunables:   bm, bn, bk, warps_m, warps_n, stages, group_m (block rasterisation).
//   gemm_wgmma_sm90 tunables: bm, bn, consumers (warpgroups), stages, group_m, persistent, cluster_k (split K
//             over a thread-block cluster, reduced in distributed shared memory: split-K in one kernel with the
//             epilogue fused, for decode shapes), blocks_per_sm (2 for small tiles), swap_ab (compute
//             D^T = B^T . A^T: N on wgmma's 64-row side and M in the tile's bn, any multiple of 8 from 8 when A is
//             row-major; for decode, M <= 64 or so; D is stored transposed back, the epilogue sees D's indices),
//             epi (direct | smem, default direct: smem stages the epilogue's output in bm x 128 bytes of shared
//             memory and writes it with coalesced 16-byte stores; not with swap_ab), mcast (1 | 2, default 1: 2
//             runs clusters of two blocks on adjacent tile columns that share A, each loading half of it and
//             multicasting it to both; not with swap_ab, cluster_k or blocks_per_sm 2).
//   On devices where gemm_wgmma_sm90 runs (sm_90a), gemm_mma_sm80 is superseded (TemplateDef::superseded_by):
//   choice generation and the GEMM suite leave it out unless it is asked for by name.
// Layouts: A row-major is [M, K] with K contiguous (lda >= K), col-major is M contiguous (lda >= M);
// B row-major is [K, N] with N contiguous (ldb >= N), col-major is K contiguous (ldb >= K). D is row-major.
// Pointers a, b, d (and workspace) must be 16-byte aligned.
#pragma once

#include <cuda.h>

#include <string>
#include <vector>

#include "kiln/jit/module.h"
#include "kiln/status.h"
#include "kiln/templates/epilogue.h"
#include "kiln/templates/launch.h"
#include "kiln/templates/template.h"

namespace kiln::templates {

/// The problem parameters of both GEMM families for a problem: dtype, layouts, the rendered epilogue and
/// `partials`. For gemm_mma_sm80 add `align` (see gemm_alignment). Pure.
Params gemm_problem_params(DType in, Layout a, Layout b, const EpilogueSpec& epilogue, bool partials = false);

/// The widest global load (8, 4, 2 or 1 elements) that the leading dimensions of A and B allow:
/// the largest power of two <= 8 dividing both. The pointers are assumed 16-byte aligned. Pure.
int gemm_alignment(int64_t lda, int64_t ldb);

/// The leading dimensions of dense operands: lda = K (row-major A) or M, ldb = N (row-major B) or K.
/// gemm_wgmma_sm90 with stream_k: the K pieces each tile of the partial wave is split into, for `tiles` output
/// tiles over `blocks` resident blocks and K elements (1: nothing to split). The kernel's SkPlan computes the same.
int64_t stream_k_pieces(int64_t tiles, int64_t blocks, int64_t k);
/// gemm_wgmma_sm90: the N widths of 128-row tiles that make whole waves (1 to `max_waves` times `sms` tiles) for
/// an M x N output, each rounded up to a multiple of 8, kept when 64 < width <= 256 and not a multiple of 64 (the
/// sampled grid has those), in wave order, without repeats. Pure.
std::vector<int64_t> wave_fit_widths(int64_t m, int64_t n, int64_t sms, int64_t max_waves = 6);
int64_t dense_lda(Layout a, const Shape& s);
int64_t dense_ldb(Layout b, const Shape& s);
/// Arguments for one dense GEMM of `s` (m, n, k) with A and B in their layouts and D row-major: sizes, one K
/// slice, dense leading dimensions, default_epilogue_args(). The caller sets the pointers.
GemmArgs dense_gemm_args(const Shape& s, Layout a, Layout b);

/// The inline-PTX function `kiln_wgmma(float (&d)[n/2], desc_a, desc_b)` issuing one
/// wgmma.mma_async m64n<n>k16 with fp32 accumulators; `a_mn_major`/`b_mn_major` select the transposed
/// (M- or N-contiguous) shared-memory operand. n is a multiple of 8 in [8, 256]. Deterministic.
std::string render_wgmma(int n, DType in, bool a_mn_major, bool b_mn_major);

/// Launches a compiled configuration of either GEMM family. `params` are the configuration's complete
/// parameters (Rendered::params) and `geometry` its Template::geometry() for the problem. For
/// gemm_wgmma_sm90 configurations this encodes the two TMA tensor maps from `args` (cuTensorMapEncodeTiled)
/// and passes them after the argument struct, and caps a persistent grid at one block per SM of the current
/// device; every other configuration goes through launch(kernel, geometry, args, stream).
/// Stream-K configurations (gemm_takes_flags()) signal between blocks through kGemmFlagBytes of flags that must be
/// lowered (zero) when the kernel starts, and the kernel leaves them lowered. `lowered_flags`: such memory, which
/// nothing else writes and no other launch uses at the same time (the caller's, one per stream); then nothing but the
/// kernel is queued. 0: the flags are the workspace's first kGemmFlagBytes, lowered by a memset queued before the
/// kernel (a graph node of 2-4 us on an H200). Ignored by other configurations.
/// kInvalidArgument for bad sizes, a leading dimension TMA cannot take, or a missing pointer; kCudaError from
/// the encode or launch. Thread-safe.
Status launch_gemm(const Kernel& kernel, const Params& params, const Launch& geometry, const GemmArgs& args,
                   CUstream stream, CUdeviceptr lowered_flags = 0);

/// True when `params` are those of a TMA configuration (gemm_wgmma_sm90), which must be launched with
/// launch_gemm().
bool gemm_needs_tma(const Params& params);
/// True when the configuration (complete `params`) uses stream-K's flags: launch_gemm()'s lowered_flags applies.
bool gemm_takes_flags(const Params& params);
/// The bytes of launch_gemm()'s lowered_flags.
inline constexpr size_t kGemmFlagBytes = 4096;

}  // namespace kiln::templates
