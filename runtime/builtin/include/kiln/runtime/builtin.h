// kiln's own ops and the tuner that tunes them.
//
//   auto tuner = kiln::runtime::make_tuner({});                    // cache mode from $KILN_TUNE_MODE
//   auto sel = (*tuner)->tune(Problem::gemm({.m = 16, .n = 4096, .k = 4096}));
//
// The tuning core (kiln/runtime/tuner.h) knows no op and no vendor library: it is given them as TuneServices.
// This room fills them with kiln's: the built-in ops (gemm over every GEMM template family, split-K and
// unfused subgraphs and the cuBLAS/cuBLASLt externs; rmsnorm, layernorm and softmax), the bench worker for
// Isolation::kIsolated, and cuBLAS's version for the cache keys.
#pragma once

#include <memory>

#include "kiln/runtime/ops.h"
#include "kiln/runtime/tuner.h"
#include "kiln/status.h"

namespace kiln::runtime {

/// The process-wide op registry, starting with the built-in ops. A program adds its own ops or choices to it
/// (OpRegistry::add / add_choices) before tuning them. Thread-safe; lives until the process exits.
OpRegistry& default_ops();

/// default_ops(), the bench worker (runtime/isolation) and cuBLAS's version.
TuneServices default_services();

/// Tuner::create(options, default_services()).
Result<std::unique_ptr<Tuner>> make_tuner(TuneOptions options = {});

}  // namespace kiln::runtime
