// Variants: the autotuner for code kiln did not write. A DSL or a program gives N source variants of one
// operation (different vector widths, block shapes, unrolls), how each is launched, and how to make the
// operation's buffers; kiln compiles them through the precompile gate, checks each against the reference
// variant (and the caller's own check, if given), times them, and stores the decision in the cache, so that a
// second process with the same cache gets the chosen variant without tuning.
//
//   VariantOp op;
//   op.name = "dsl.axpy";
//   op.variants = {{.name = "vec1", .source = src1, .kernel = "axpy", .dims = {...}}, ...};
//   op.buffers = [](std::span<const int64_t> sizes, uint32_t seed) -> Result<VariantBuffers> {...};
//   KILN_ASSIGN_OR_RETURN(VariantSet set, register_variants(default_ops(), std::move(op)));
//   KILN_ASSIGN_OR_RETURN(auto sel, tuner->tune(set.problem({n})));   // sel->choice_name(): the winner
//   KILN_RETURN_IF_ERROR(run_variant(*sel, {n}, params, stream));
//
// A variant kernel takes any parameters: a call passes them as cuLaunchKernel does (an array of pointers to
// each argument). Sizes are the problem's (part of the cache key); sizes[0] is the dimension a deferred
// selection dispatches on (Tuner::defer).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kiln/jit/kernel_source.h"
#include "kiln/jit/module.h"
#include "kiln/jit/target.h"
#include "kiln/runtime/ops.h"
#include "kiln/runtime/problem.h"
#include "kiln/status.h"

namespace kiln::runtime {

class Selection;

/// Grid, block and dynamic shared memory of one launch.
struct LaunchDims {
  Dim3 grid;
  Dim3 block;
  unsigned shared_bytes = 0;
};

/// The launch geometry of a variant for a problem's sizes.
using VariantGeometry = std::function<Result<LaunchDims>(std::span<const int64_t> sizes)>;

struct Variant {
  /// Unique within the op; what the cache stores timings and the decision under.
  std::string name;
  /// CUDA C++.
  std::string source;
  /// The kernel: an `extern "C"` name, or a name expression ("axpy<4>"), which is compiled as one.
  std::string kernel;
  /// -D<name>=<value> for each pair (value empty: -D<name>).
  std::vector<std::pair<std::string, std::string>> defines;
  /// Further NVRTC options ("--use_fast_math").
  std::vector<std::string> options;
  std::vector<std::string> include_dirs;
  std::vector<Header> headers;
  /// The launch geometry per problem; empty: `dims` for every problem.
  VariantGeometry geometry;
  LaunchDims dims;
  /// What the variant is, for reports ("vec": "4", "block": "256").
  std::map<std::string, std::string> parameters;
};

/// The buffers a tune runs the variants on, for one problem's sizes: inputs filled, outputs allocated.
struct VariantBuffers {
  /// The kernel parameters, as cuLaunchKernel takes them: pointers to each argument, pointing into `owner`.
  std::vector<void*> params;
  /// What a variant writes: poisoned before its checked run and compared with the reference variant's output
  /// (relative norm within VariantOp::tolerance). May be empty when VariantOp::check does the checking. An
  /// output the variants also read (an in-place update) sets OutputRegion::restore: it starts each checked run
  /// from its content before the reference ran, since poison read back would fail every variant.
  std::vector<OutputRegion> outputs;
  /// Owns the memory `params` point to (device buffers, argument values); released when the tune is done.
  std::shared_ptr<void> owner;
};

/// A caller's own check of a variant's output, after its checked run (the stream is synchronised): kWrongResult
/// (or any error) fails the variant with that reason.
using VariantCheck = std::function<Status(std::span<const int64_t> sizes, void** params, CUstream stream)>;

struct VariantOp {
  /// The op's name, in every cache key ("dsl.axpy"). Must not be a built-in op's.
  std::string name;
  std::vector<Variant> variants;
  /// The variant the others are checked against, and the one used when tuning is off (`use` mode with no
  /// decision) or every variant fails. Empty: the first.
  std::string reference;
  /// Makes the buffers for `sizes`, with inputs from `seed`. Needs a current context. Required.
  std::function<Result<VariantBuffers>(std::span<const int64_t> sizes, uint32_t seed)> buffers;
  /// Optional: the caller's check of each variant's output (in addition to the comparison of `outputs`).
  VariantCheck check;
  /// Relative-norm error a variant's outputs may have against the reference's. Default 1e-2.
  double tolerance = 1e-2;
};

/// A registered variant op: makes its problems.
class VariantSet {
 public:
  VariantSet() = default;
  VariantSet(std::string op, std::string fingerprint) : op_(std::move(op)), fingerprint_(std::move(fingerprint)) {}
  const std::string& op() const { return op_; }
  /// A hash of every variant's compiled source, entry and fixed geometry: part of every problem's key, so an
  /// edited variant is tuned again rather than a stale decision reused.
  const std::string& fingerprint() const { return fingerprint_; }
  /// The problem of this op with `sizes` (positive) and `attributes` (anything else that changes the winner,
  /// e.g. a dtype): what Tuner::tune and Tuner::defer take.
  Problem problem(std::vector<int64_t> sizes, std::map<std::string, std::string> attributes = {}) const;

 private:
  std::string op_;
  std::string fingerprint_;
};

/// kInvalidArgument naming what is wrong: no name, no variants, a variant without a name, source or kernel,
/// two variants with one name, a reference that is not a variant, no buffers function, a fixed geometry with
/// a zero dimension, a tolerance that is not positive.
Status validate_variants(const VariantOp& op);

/// Validates `op` and adds it to `ops` (replacing an op of the same name that is a variant op; a built-in op's
/// name is kAlreadyExists).
Result<VariantSet> register_variants(OpRegistry& ops, VariantOp op);

/// The KernelSource a variant compiles as (its defines as options; a name expression kernel listed).
KernelSource variant_source(const std::string& op, const Variant& variant);

/// Runs a tuned variant op's selection on `params` for `sizes` on `stream`. Capture-safe.
Status run_variant(const Selection& selection, std::span<const int64_t> sizes, void** params, CUstream stream);

}  // namespace kiln::runtime
