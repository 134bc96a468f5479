// Benchmark isolation (kiln/runtime/isolation.h): the sandbox a tuner measures in, backed by a bench worker
// process per GPU, and the main function of such a worker.
#pragma once

#include <memory>

#include "kiln/runtime/isolation.h"
#include "kiln/runtime/ops.h"
#include "kiln/runtime/sandbox.h"
#include "kiln/status.h"

namespace kiln::runtime {

/// A sandbox whose sessions run in a bench worker for `device`: finds the worker executable (kNotFound listing
/// the places tried) and starts it without waiting, so its start-up overlaps the tuner's own work.
Result<std::unique_ptr<BenchSandbox>> make_isolation_sandbox(const IsolationOptions& options, int device);

/// The main function of a bench worker (kiln/runtime/isolation.h): speaks the isolation protocol on the socket
/// the host passed (--fd), for device --device, regenerating choices from `ops`, until the host closes it or
/// dies. Returns the process's exit status; as the main of its own process it may also end the process
/// directly when the host hangs up. Not for use inside any other program.
int bench_worker_main(int argc, char** argv, const OpRegistry& ops);

}  // namespace kiln::runtime
