// The host side of benchmark isolation (kiln/runtime/isolation.h): one bench worker process per tuner, driven
// synchronously from the tuning thread (tunes benchmark one at a time under the tuner's bench lock).
//
// IsolationHost owns the worker and the protocol (isolation_wire.h): it starts a worker when one is needed,
// replays the current problem's Begin to a fresh worker, and turns a worker's death, a timeout or a poisoned
// context into the failure of the one choice in flight, after which the worker is killed, reaped and replaced
// on the next request. IsolatedSession is the BenchSession the tuner talks to: the choices of one problem.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "isolation_wire.h"
#include "kiln/pool/subprocess.h"
#include "kiln/runtime/bench_worker.h"
#include "kiln/runtime/isolation.h"
#include "kiln/runtime/measure.h"
#include "kiln/runtime/tuner.h"

namespace kiln::runtime::detail {

/// What a choice's run in the worker gave: its samples (or why it failed) and the check's relative error.
struct IsolatedRun {
  Result<Samples> samples = make_error(ErrorCode::kInternal, "not run");
  double error = 0;
};

/// Counters over the life of an IsolationHost.
struct IsolationStats {
  uint64_t workers_spawned = 0;
  uint64_t workers_ready = 0;
  uint64_t crashes = 0;   // died on their own while running a choice (or preparing a problem)
  uint64_t timeouts = 0;  // killed for passing choice_timeout
  uint64_t poisoned = 0;  // retired after reporting a context they cannot use any more
  uint64_t choices_run = 0;
};

using bench_wire::SessionSpec;

class IsolationHost {
 public:
  /// Finds the worker executable (kNotFound listing the places tried) and starts the first worker, without
  /// waiting for it: its start overlaps what the tuner does before the first request.
  static Result<std::unique_ptr<IsolationHost>> create(IsolationOptions options, int device);
  /// Kills and reaps the worker (no process is left behind).
  ~IsolationHost();
  IsolationHost(const IsolationHost&) = delete;
  IsolationHost& operator=(const IsolationHost&) = delete;

  /// Starts the session of `spec`'s problem in the worker. Returns the choices the worker cannot rebuild, with
  /// why. Errors: the worker's own (kNotFound for an op or reference it does not know; the reference's
  /// failure), kWorkerCrashed/kTimeout when the worker dies or hangs while preparing, kNotFound/kIoError when
  /// no worker can be started.
  Result<std::map<std::string, std::string>> begin(SessionSpec spec);
  /// Checks `name` against the reference and measures it (early drop against `best_us`) in the worker.
  /// `binaries` go with the first request of each worker for the choice. The outer error means isolation
  /// itself broke (no worker can be started for the session): the tune cannot go on. A choice that fails,
  /// faults, hangs or kills its worker is an IsolatedRun whose samples hold the reason.
  Result<IsolatedRun> check_and_measure(const std::string& name, const Binaries& binaries, double best_us);
  /// `n` timed runs of `name` (near-tie re-measurement), as BenchRunner::time_runs in the worker. Errors as
  /// check_and_measure.
  Result<IsolatedRun> time_runs(const std::string& name, const Binaries& binaries, int n, bool graph);
  /// Ends the session: the worker frees the problem's buffers. A dead worker is not restarted for it.
  void end();
  /// Tells the observer that `choice` runs in the host process, and why.
  void report_in_process(const std::string& choice, const std::string& why);

  IsolationStats stats() const { return stats_; }
  /// The pid of the live worker, or 0.
  int worker_pid() const;
  const std::string& worker_path() const { return path_; }

  class Worker;

 private:
  IsolationHost(IsolationOptions options, int device, std::string path);
  // A ready worker with the current session begun; (re)starts one as needed.
  Status ensure_session();
  Status ensure_worker();
  Status spawn();
  // Sends a Run and waits for its result, turning a dead, hung or poisoned worker into the choice's failure.
  Result<IsolatedRun> run(bench_wire::Run request, const Binaries& binaries);
  // Ends, reaps and forgets the worker (`gracefully`: it is exiting by itself, or may exit on the hang-up, so it
  // gets a moment to end with its own status); returns how it ended and the last of its stderr.
  struct Ended {
    std::string how;
    std::string tail;
  };
  Ended retire(bool gracefully);
  void emit(IsolationEvent::Kind kind, std::string choice = {}, std::string detail = {}, double seconds = 0,
            double worker_seconds = 0);
  Result<WorkerProcess> spawn_on_spawner_thread();

  IsolationOptions options_;
  int device_ = 0;
  std::string path_;
  std::unique_ptr<Worker> worker_;
  bool session_begun_ = false;               // the current worker has the current session
  std::set<std::string> has_binaries_;       // choices the current worker has been given binaries for
  std::optional<SessionSpec> session_;       // replayed to a fresh worker
  std::map<std::string, std::string> unknown_;  // the current session's choices the worker cannot rebuild
  uint64_t seq_ = 0;
  IsolationStats stats_;

  // PR_SET_PDEATHSIG in the worker follows the thread that spawned it: spawns happen on this thread, which
  // lives as long as the host, so a worker never dies because the thread that happened to tune first ended.
  std::thread spawner_;
  std::mutex spawn_mu_;
  std::condition_variable spawn_cv_;
  std::deque<std::function<void()>> spawn_jobs_;
  bool spawner_stop_ = false;
};

/// One problem's choices in the worker: the BenchSession a tuner measures through (kiln/runtime/sandbox.h).
class IsolatedSession final : public BenchSession {
 public:
  /// Begins the session of `problem` in `host`'s worker: sends the problem with `reference` and every choice of
  /// `to_measure`. Choices the worker cannot rebuild, and every choice when the worker does not know the op or
  /// the problem cannot be described to it, are left to the host (covers() is false; a warning names them).
  /// Errors: isolation cannot work at all (a worker that cannot start or dies preparing the problem).
  static Result<std::unique_ptr<IsolatedSession>> begin(IsolationHost& host, const TuneOptions& options,
                                                        const Problem& problem, const Choice& reference,
                                                        const Binaries& reference_binaries,
                                                        const std::vector<ChoicePtr>& to_measure);
  /// Ends the session in the worker.
  ~IsolatedSession() override;

  bool covers(const Choice& choice) const override { return covered_.count(choice.name()) > 0; }
  /// `binaries` must outlive the session (the tuner's compile futures hold them): they are sent again to a
  /// replacement worker for a near-tie re-measurement.
  Result<Result<Samples>> check_and_measure(const Choice& choice, const Binaries& binaries, double best_us,
                                            double* error) override;
  Result<Result<Samples>> time_runs(const Choice& choice, int n, bool graph) override;

 private:
  IsolatedSession() = default;
  IsolationHost* host_ = nullptr;
  std::set<std::string> covered_;
  std::map<std::string, const Binaries*> binaries_;
};

}  // namespace kiln::runtime::detail
