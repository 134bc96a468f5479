// Where a tune checks and measures choices outside this process (Isolation::kIsolated), as the tuning core
// sees it. runtime/isolation implements it with a bench worker process per GPU; the core only asks a
// BenchSandbox to begin a problem and then hands it choices, so it never depends on how or where they run.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "kiln/runtime/choice.h"
#include "kiln/runtime/isolation.h"
#include "kiln/runtime/measure.h"
#include "kiln/runtime/problem.h"
#include "kiln/status.h"

namespace kiln::runtime {

struct TuneOptions;

/// One problem's choices in a sandbox. The outer error of each call means the sandbox itself broke (the tune
/// cannot go on); a choice that fails, faults, hangs or kills its worker is an inner error with the reason.
class BenchSession {
 public:
  virtual ~BenchSession() = default;
  /// True when `choice` is checked and measured in the sandbox (else the tuner runs it in this process).
  virtual bool covers(const Choice& choice) const = 0;
  /// Checks `choice` against the reference and measures it (early drop against `best_us`); the check's
  /// relative error goes to `*error`. `binaries` must outlive the session.
  virtual Result<Result<Samples>> check_and_measure(const Choice& choice, const Binaries& binaries, double best_us,
                                                    double* error) = 0;
  /// `n` timed runs (near-tie re-measurement).
  virtual Result<Result<Samples>> time_runs(const Choice& choice, int n, bool graph) = 0;
};

class BenchSandbox {
 public:
  virtual ~BenchSandbox() = default;
  /// Begins the session of `problem`: the sandbox gets the problem, the reference (and its binaries) and the
  /// choices the tuner will measure. Errors: the sandbox cannot work at all.
  virtual Result<std::unique_ptr<BenchSession>> begin(const TuneOptions& options, const Problem& problem,
                                                      const Choice& reference, const Binaries& reference_binaries,
                                                      const std::vector<ChoicePtr>& to_measure) = 0;
};

/// Makes the sandbox of a tuner on `device` (called once, when its first measurement needs it).
using BenchSandboxFactory =
    std::function<Result<std::unique_ptr<BenchSandbox>>(const IsolationOptions& options, int device)>;

}  // namespace kiln::runtime
