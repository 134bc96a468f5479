// The entries kiln_cache_worker writes and the multi-process tests check, derived from small integers so
// that both sides agree on them without talking.
#pragma once

#include <fmt/format.h>

#include <variant>
#include <vector>

#include "cache_test_util.h"
#include "format.h"
#include "kiln/cache/store.h"

namespace kiln::cache::test_worker {

inline std::string problem(int p) { return testing::sample_problem(16 * (p + 1)).canonical(); }
inline std::string choice(int c) { return fmt::format("c{}", c); }
inline Binary binary(int p, int c, size_t bytes) { return testing::fake_binary(uint64_t(p) * 100 + c + 1, bytes); }

/// Each worker measures something different for the same pair, so they disagree on decisions.
inline double microseconds(int p, int c, int worker) {
  uint64_t h = (uint64_t(p) * 1000003 + c * 10007 + worker * 101) * 0x9e3779b97f4a7c15ull;
  return 1.0 + double(h >> 40) / double(1 << 24) * 100.0;
}

struct Summary {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over every decision's stored bytes, in problem order
  int decisions = 0;
  int timings = 0;
  int binaries_ok = 0;
  uint64_t invalid = 0;
};

inline Summary summarize(Store& store, int problems, int choices) {
  Summary s;
  for (int p = 0; p < problems; ++p) {
    if (auto d = store.decision(problem(p))) {
      s.decisions++;
      for (char ch : encode_decision(*d)) s.hash = (s.hash ^ uint8_t(ch)) * 1099511628211ull;
    }
    for (int c = 0; c < choices; ++c) {
      if (auto t = store.timing(problem(p), choice(c)); t && t->ok && t->samples == 10) s.timings++;
      auto b = store.get_binary(binary(p, c, 16).key);
      if (b.ok() && (*b)->cubin == binary(p, c, 2048).cubin) s.binaries_ok++;
    }
  }
  auto st = store.stats();
  s.invalid = st.ok() ? st->invalid : 999;
  return s;
}

// ---- the SIGKILL test's entries: entry K is a timing, a 256 KiB binary and a decision.

using Item = std::variant<TimingRecord, Binary, Decision>;

inline std::vector<Item> kill_entry(int k) {
  std::string p = fmt::format("kill-problem-{}", k);
  TimingRecord t;
  t.problem = p;
  t.choice = "only";
  t.median_us = k + 0.5;
  t.samples = 7;
  Binary b = testing::fake_binary(100000 + k, 256 * 1024);
  Decision d;
  d.problem = p;
  d.choice = "only";
  d.kernel = b.key;
  d.median_us = k + 0.5;
  return {t, b, d};
}

inline Status put(Store& s, TimingRecord& t) { return s.put_timing(t); }
inline Status put(Store& s, Binary& b) { return s.put_binary(b); }
inline Status put(Store& s, Decision& d) { return s.put_decision(d); }

/// Whether entry K is entirely present, and every part of it equal to what was written.
inline bool entry_complete(Store& s, int k) {
  auto items = kill_entry(k);
  auto& t = std::get<TimingRecord>(items[0]);
  auto& b = std::get<Binary>(items[1]);
  auto& d = std::get<Decision>(items[2]);
  auto gt = s.timing(t.problem, t.choice);
  auto gb = s.get_binary(b.key);
  auto gd = s.decision(d.problem);
  return gt && gt->median_us == t.median_us && gt->samples == 7 && gb.ok() && (*gb)->cubin == b.cubin && gd &&
         gd->kernel == d.kernel && gd->median_us == d.median_us;
}

}  // namespace kiln::cache::test_worker
