#include "kiln/pool/progress.h"

#include <unistd.h>

#include <chrono>
#include <cmath>

#include <fmt/format.h>

namespace kiln {

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

ProgressTracker::ProgressTracker(size_t total, ProgressClock clock)
    : clock_(std::move(clock)), start_(clock_()), total_(total) {}

void ProgressTracker::record(bool ok) { record_one(ok, false); }

void ProgressTracker::record_free() { record_one(true, true); }

void ProgressTracker::record_one(bool ok, bool free) {
  ProgressSnapshot s;
  std::vector<std::function<void(const ProgressSnapshot&)>> listeners;
  {
    std::lock_guard lock(mu_);
    ++done_;
    if (!ok) ++failed_;
    if (free) ++free_;
    s = snapshot_locked();
    listeners = listeners_;
  }
  for (auto& l : listeners) l(s);
}

ProgressSnapshot ProgressTracker::snapshot() const {
  std::lock_guard lock(mu_);
  return snapshot_locked();
}

ProgressSnapshot ProgressTracker::snapshot_locked() const {
  ProgressSnapshot s;
  s.total = total_;
  s.done = done_;
  s.failed = failed_;
  s.elapsed_seconds = clock_() - start_;
  if (done_ > free_ && s.elapsed_seconds > 0) {
    s.rate = static_cast<double>(done_ - free_) / s.elapsed_seconds;
    s.eta_seconds = static_cast<double>(total_ - std::min(done_, total_)) / s.rate;
  }
  if (done_ >= total_) s.eta_seconds = 0;
  return s;
}

void ProgressTracker::listen(std::function<void(const ProgressSnapshot&)> listener) {
  std::lock_guard lock(mu_);
  listeners_.push_back(std::move(listener));
}

std::string format_duration(double seconds) {
  if (seconds < 0) return "?";
  if (seconds < 10) return fmt::format("{:.1f}s", seconds);
  long s = std::lround(seconds);
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
}

std::string render_progress(const ProgressSnapshot& s, std::string_view label, int width) {
  if (width < 1) width = 1;
  const double frac = s.total == 0 ? 1.0 : std::min(1.0, static_cast<double>(s.done) / static_cast<double>(s.total));
  const int filled = static_cast<int>(frac * width);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(width - filled), '.');
  std::string line = fmt::format("{} [{}] {}/{} {:3d}%", label, bar, s.done, s.total, static_cast<int>(frac * 100));
  if (s.failed > 0) line += fmt::format("  {} failed", s.failed);
  if (s.rate > 0) line += fmt::format("  {:.1f}/s", s.rate);
  if (s.finished()) {
    line += fmt::format("  in {}", format_duration(s.elapsed_seconds));
  } else if (s.eta_seconds >= 0) {
    line += fmt::format("  ETA {}", format_duration(s.eta_seconds));
  }
  return line;
}

ProgressPrinter::ProgressPrinter(std::FILE* out, Options options)
    : out_(out), opt_(std::move(options)), tty_(opt_.tty ? *opt_.tty : ::isatty(::fileno(out)) == 1) {}

void ProgressPrinter::update(const ProgressSnapshot& s) {
  std::lock_guard lock(mu_);
  if (finished_) return;
  if (s.finished()) {
    print_locked(s, true);
    return;
  }
  const double now = opt_.clock();
  if (now - last_print_ < (tty_ ? opt_.tty_interval : opt_.log_interval)) return;
  last_print_ = now;
  print_locked(s, false);
}

void ProgressPrinter::finish(const ProgressSnapshot& s) {
  std::lock_guard lock(mu_);
  if (!finished_) print_locked(s, true);
}

void ProgressPrinter::print_locked(const ProgressSnapshot& s, bool final) {
  std::string line = render_progress(s, opt_.label, opt_.width);
  if (tty_) {
    // \r and erase-to-end-of-line: redraw in place, leaving no remnant of a longer previous line.
    fmt::print(out_, "\r{}\x1b[K{}", line, final ? "\n" : "");
  } else {
    fmt::print(out_, "{}\n", line);
  }
  std::fflush(out_);
  if (final) finished_ = true;
}

}  // namespace kiln
