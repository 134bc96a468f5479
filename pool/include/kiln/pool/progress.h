// Progress of a long batch of compiles (done/total, failures, rate, ETA) and a small progress-bar printer
// that the CLI shows: redrawn in place on a terminal, a plain line now and then otherwise (logs, CI).
#pragma once

#include <cstdio>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

struct ProgressSnapshot {
  size_t total = 0;
  size_t done = 0;    // finished, whatever the result
  size_t failed = 0;  // of those, errors (including cancellations)
  double elapsed_seconds = 0;
  double rate = 0;          // jobs that needed work, per second since the start; 0 before the first
  double eta_seconds = -1;  // the jobs left at that rate; -1 while unknown
  bool finished() const { return done >= total; }
};

/// Seconds on a monotonic clock. Tests pass a fake one.
using ProgressClock = std::function<double()>;
/// std::chrono::steady_clock in seconds.
double steady_seconds();

/// Counts completions of a batch of `total` jobs. Thread-safe.
class ProgressTracker {
 public:
  explicit ProgressTracker(size_t total, ProgressClock clock = steady_seconds);

  /// Records one finished job. Listeners run on this thread, outside the tracker's lock.
  void record(bool ok);
  /// Records a job that needed no work (found in a cache): done, but left out of the rate, so that a run
  /// that starts with a hundred instant hits does not promise an ETA a hundred times too short.
  void record_free();
  ProgressSnapshot snapshot() const;
  /// `listener` runs after every record() with the snapshot it produced.
  void listen(std::function<void(const ProgressSnapshot&)> listener);

 private:
  ProgressSnapshot snapshot_locked() const;
  void record_one(bool ok, bool free);
  mutable std::mutex mu_;
  ProgressClock clock_;
  double start_;
  size_t total_;
  size_t done_ = 0;
  size_t failed_ = 0;
  size_t free_ = 0;
  std::vector<std::function<void(const ProgressSnapshot&)>> listeners_;
};

/// One line: "label [#########.........]  45/100  45%  2 failed  3.1/s  ETA 18s". `width` is the bar's
/// width in characters.
std::string render_progress(const ProgressSnapshot& s, std::string_view label, int width = 30);

/// "1h02m", "3m05s", "42s", "0.4s".
std::string format_duration(double seconds);

/// Prints a batch's progress to `out`. On a terminal it redraws one line in place (at most every
/// `tty_interval` seconds, and always the last state); otherwise it prints a line every `log_interval`
/// seconds and the final one. Thread-safe: update() may be called from any thread.
class ProgressPrinter {
 public:
  struct Options {
    std::string label = "compiling";
    int width = 30;
    double tty_interval = 0.1;
    double log_interval = 10.0;
    /// Unset: isatty(fileno(out)).
    std::optional<bool> tty = std::nullopt;
    ProgressClock clock = steady_seconds;
  };
  ProgressPrinter(std::FILE* out, Options options);
  ProgressPrinter(std::FILE* out = stderr) : ProgressPrinter(out, Options{}) {}

  void update(const ProgressSnapshot& s);
  /// Prints the final state (and ends the terminal line). Idempotent.
  void finish(const ProgressSnapshot& s);

 private:
  void print_locked(const ProgressSnapshot& s, bool final);
  std::mutex mu_;
  std::FILE* out_;
  Options opt_;
  bool tty_;
  double last_print_ = -1e300;
  bool finished_ = false;
};

}  // namespace kiln
