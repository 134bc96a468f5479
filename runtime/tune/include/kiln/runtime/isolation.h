// Benchmark isolation's options (the tuning core's view; runtime/isolation implements it): with TuneOptions::isolation = Isolation::kIsolated, the checks and measurements of
// choices run in a bench worker process per GPU, so that a kernel that faults (an illegal address poisons a
// CUDA context for good) or hangs costs one worker, never the host's context. docs/runtime.md ("Isolation")
// gives the cost and the default.
//
// The worker (kiln-bench-worker, installed next to kiln) opens its own primary context on the tuner's device.
// For each problem the host sends the problem, the seed, the BenchmarkOptions, the reference choice and the
// names (with kernel keys) of the choices to measure; the worker regenerates the op's choices through its own
// OpRegistry, prepares them with the binaries the host compiled (it never compiles), runs the reference, and
// then checks and measures one choice per request. A worker that dies, hangs past choice_timeout or reports a
// poisoned context is killed and replaced; the choice in flight is recorded as failed with the reason (the
// signal or exit status and the tail of the worker's stderr), and the tune goes on.
//
// Which choices are isolated: those the worker can rebuild, i.e. of ops in its registry whose generated choice
// has the same name and the same kernel keys as the host's. kiln-bench-worker knows the built-in ops. A program
// isolates its own ops and user kernels by building its own worker, which registers them exactly as the host
// does and then hands over to bench_worker_main():
//
//   int main(int argc, char** argv) {
//     register_my_ops();                               // the same default_ops().add / add_choices as the host
//     return kiln::runtime::bench_worker_main(argc, argv, kiln::runtime::default_ops());
//   }
//
// and naming it in IsolationOptions::worker_path or $KILN_BENCH_WORKER. Choices the worker cannot rebuild run
// in the host process, with a logged warning naming them.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace kiln::runtime {

/// What the isolation host tells its observer (tests use these as sync points; a CLI may log them).
struct IsolationEvent {
  enum class Kind {
    kWorkerSpawned,  // pid known, not ready yet
    kWorkerReady,    // said hello; seconds: spawn to hello; worker_seconds: its context creation
    kSessionBegun,   // a problem's buffers and reference are ready in the worker; seconds: round trip
    kChoiceSent,     // choice handed to worker `pid`
    kChoiceDone,     // its result arrived (measured, or a failure the worker reported, e.g. wrong result);
                     // seconds: round trip, worker_seconds: time the worker spent on it
    kChoiceFailed,   // the worker died, timed out or reported a poisoned context while running it; detail: why
    kWorkerExited,   // reaped; detail: "killed by signal 9 (Killed)", "exited with status 0"
    kInProcess,      // `choice` cannot be rebuilt by the worker and runs in the host; detail: why
  };
  Kind kind;
  int pid = 0;
  std::string choice;
  std::string detail;
  double seconds = 0;
  double worker_seconds = 0;
};

struct IsolationOptions {
  /// The bench worker executable. Empty (the default): $KILN_BENCH_WORKER, else kiln-bench-worker next to the
  /// running executable, else the one in kiln's install prefix (bin/).
  std::string worker_path;
  /// One choice's check and measurement (or one near-tie re-measurement) running longer than this fails with
  /// kTimeout; its worker is killed and replaced. Default 15 s: under the worker's own 20 s stream deadline, so
  /// a hang is reported by the host with the worker's stderr, and far above any real choice's measurement.
  std::chrono::milliseconds choice_timeout = std::chrono::seconds(15);
  /// A worker that has not said hello (its CUDA context created) by then is killed; the tune fails. Default 60 s.
  std::chrono::milliseconds startup_timeout = std::chrono::seconds(60);
  /// How much of the worker's stderr is kept for error messages. Default 4 KiB.
  size_t stderr_tail_bytes = 4096;
  /// Extra "NAME=value" environment entries for the worker (it inherits the host's environment).
  std::vector<std::string> worker_env;
  /// Called on the tuning thread for each event; must be quick and must not call into the tuner. Optional.
  std::function<void(const IsolationEvent&)> observer;
};

}  // namespace kiln::runtime
