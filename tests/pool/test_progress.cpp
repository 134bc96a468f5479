#include "kiln/pool/progress.h"

#include <gtest/gtest.h>

#include <cstdio>

namespace kiln {
namespace {

struct FakeClock {
  double now = 100.0;
  ProgressClock fn() {
    return [this] { return now; };
  }
};

TEST(Progress, RateAndEtaFollowTheClock) {
  FakeClock clock;
  ProgressTracker t(10, clock.fn());
  ProgressSnapshot s = t.snapshot();
  EXPECT_EQ(s.done, 0u);
  EXPECT_EQ(s.eta_seconds, -1);  // unknown before the first completion
  clock.now += 2;
  t.record(true);
  t.record(false);
  s = t.snapshot();
  EXPECT_EQ(s.done, 2u);
  EXPECT_EQ(s.failed, 1u);
  EXPECT_DOUBLE_EQ(s.elapsed_seconds, 2.0);
  EXPECT_DOUBLE_EQ(s.rate, 1.0);
  EXPECT_DOUBLE_EQ(s.eta_seconds, 8.0);
  for (int i = 0; i < 8; ++i) t.record(true);
  s = t.snapshot();
  EXPECT_TRUE(s.finished());
  EXPECT_EQ(s.eta_seconds, 0);
}

TEST(Progress, ListenersSeeEachRecord) {
  FakeClock clock;
  ProgressTracker t(3, clock.fn());
  std::vector<size_t> seen;
  t.listen([&](const ProgressSnapshot& s) { seen.push_back(s.done); });
  t.record(true);
  t.record(true);
  t.record(false);
  EXPECT_EQ(seen, (std::vector<size_t>{1, 2, 3}));
}

TEST(Progress, RendersABar) {
  ProgressSnapshot s{.total = 100, .done = 45, .failed = 2, .elapsed_seconds = 15, .rate = 3.0, .eta_seconds = 18.3};
  EXPECT_EQ(render_progress(s, "compiling", 20), "compiling [#########...........] 45/100  45%  2 failed  3.0/s  ETA 18s");
  s.done = 100;
  s.eta_seconds = 0;
  EXPECT_EQ(render_progress(s, "x", 4), "x [####] 100/100 100%  2 failed  3.0/s  in 15s");
  EXPECT_EQ(format_duration(0.44), "0.4s");
  EXPECT_EQ(format_duration(185), "3m05s");
  EXPECT_EQ(format_duration(3720), "1h02m");
}

std::string printed(bool tty, const std::vector<std::pair<double, size_t>>& steps) {
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* out = open_memstream(&buf, &len);
  FakeClock clock;
  {
    ProgressPrinter::Options o;
    o.label = "L";
    o.width = 4;
    o.tty = tty;
    o.clock = clock.fn();
    o.log_interval = 10;
    ProgressPrinter p(out, o);
    for (auto [t, done] : steps) {
      clock.now = t;
      p.update(ProgressSnapshot{.total = 4, .done = done});
    }
    p.finish(ProgressSnapshot{.total = 4, .done = 4});
  }
  std::fclose(out);
  std::string s(buf, len);
  std::free(buf);
  return s;
}

TEST(Progress, PrinterRedrawsInPlaceOnATerminal) {
  std::string s = printed(true, {{0, 1}, {0.05, 2}, {0.5, 3}, {0.6, 4}});
  // 0.05 is within the 0.1 s redraw interval: skipped. The final state ends the line, once.
  EXPECT_EQ(s, "\rL [#...] 1/4  25%\x1b[K\rL [###.] 3/4  75%\x1b[K\rL [####] 4/4 100%  in 0.0s\x1b[K\n");
}

TEST(Progress, PrinterWritesOccasionalLinesToALog) {
  std::string s = printed(false, {{0, 1}, {5, 2}, {11, 3}});
  EXPECT_EQ(s, "L [#...] 1/4  25%\nL [###.] 3/4  75%\nL [####] 4/4 100%  in 0.0s\n");
}

}  // namespace
}  // namespace kiln
