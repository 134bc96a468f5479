#include "suite_candidates.h"

#include <algorithm>
#include <set>

#include "kiln/templates/gemm.h"
#include "kiln/templates/registry.h"

namespace kiln::bench::suite {

using templates::DeviceLimits;
using templates::Params;
using templates::TemplatePtr;
using templates::Value;

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

struct Wgmma {
  int64_t bm, bn, consumers, stages, group_m;
  bool persistent;
  int64_t cluster_k, blocks_per_sm;
  bool swap_ab;
  bool epi_smem = false;  // epi=smem: the staged epilogue (bm x 128 bytes of shared memory more)
  int64_t mcast = 1;      // 2: clusters of two blocks sharing A through TMA multicast
  bool stream_k = false;  // persistent: the partial wave's tiles split along K to fill the grid
  bool sk_even = false;   // stream_k's free-running form: every block an equal share of all K iterations
  bool pingpong = false;  // persistent, two consumers taking whole bm x bn tiles in turn
  int64_t early = 0;      // swap_ab: stages of weights requested before the dependency wait (B constant)
  int64_t trigger = 0;    // where a block lets the next kernel launch: 0 exit, 1 start, 2 tail
};
Wgmma pingpong(Wgmma w) {
  w.pingpong = true;
  return w;
}
Wgmma staged(Wgmma w) {
  w.epi_smem = true;
  return w;
}
// mcast=2 (TMA multicast of A within a 2-block cluster): on par with the same tile on an H200 so far; measured
// here on the large shapes so that the suite shows where it wins, if anywhere.
Wgmma multicast(Wgmma w) {
  w.mcast = 2;
  return w;
}

// The deepest pipeline up to `want` stages that fits the block's shared memory (two blocks' worth for
// blocks_per_sm 2); the layout is gemm_sm90.cpp's: stages x (bm + bn) x 64 x 2 bytes + 1 KiB + barriers.
int64_t fit_stages(const DeviceLimits& l, int64_t bm, int64_t bn, int64_t want, int64_t blocks = 1) {
  const int64_t stage = (bm + bn) * 128 + 16;
  const int64_t budget = blocks == 1 ? l.smem_per_block_optin : l.smem_per_sm / 2 - 1024;
  return std::clamp<int64_t>((budget - 1024) / stage, 2, want);
}

// The smallest cluster split of K (1, 2, 4) that gives about one block per SM, keeping at least two 64-wide K
// blocks per cluster block.
int64_t cluster_for(int64_t tiles, int64_t k, int64_t sms) {
  int64_t ck = 1;
  while (ck < 4 && tiles * ck < sms * 3 / 4 && ceil_div(k, 64) >= 4 * ck) ck *= 2;
  return ck;
}

std::vector<Wgmma> wgmma_order_plain(const SuiteShape& s, const DeviceLimits& l);

// Each persistent tile whose last wave stream-K would split, followed by its stream-K twin (so that --max-configs
// keeps both); decode shapes also get persistent stream-K swap-AB tiles, both forms, next to the cluster splits.
std::vector<Wgmma> wgmma_order(const SuiteShape& s, const DeviceLimits& l) {
  const int64_t sms = std::max(l.sm_count, 1);
  std::vector<Wgmma> out;
  for (const Wgmma& w : wgmma_order_plain(s, l)) {
    out.push_back(w);
    const int64_t tiles = ceil_div(w.swap_ab ? s.n : s.m, w.bm) * ceil_div(w.swap_ab ? s.m : s.n, w.bn);
    const int64_t pieces = templates::stream_k_pieces(tiles, sms, s.k);
    if (w.persistent && w.mcast == 1 && w.cluster_k == 1 && !w.pingpong && !w.stream_k && pieces > 1) {
      Wgmma t = w;
      t.stream_k = true;
      out.push_back(t);
    }
    if (w.swap_ab && !w.persistent && w.blocks_per_sm == 1 && w.cluster_k > 1 && pieces > 1) {
      Wgmma t = w;  // the cluster split's alternative: every SM shares the tiles' K loops
      t.persistent = true;
      t.cluster_k = 1;
      t.stream_k = true;
      out.push_back(t);
      t.sk_even = true;  // and its free-running form (no memset per launch since the flags stay lowered)
      out.push_back(t);
    }
  }
  return out;
}

std::vector<Wgmma> wgmma_order_plain(const SuiteShape& s, const DeviceLimits& l) {
  const int64_t sms = std::max(l.sm_count, 1);
  std::vector<Wgmma> out;
  auto tiles = [&](int64_t bm, int64_t bn, bool swap) {
    return ceil_div(swap ? s.n : s.m, bm) * ceil_div(swap ? s.m : s.n, bn);
  };
  if (s.m <= 256) {
    // Swap-AB: N on wgmma's 64-row side, M padded only to a multiple of 8 (the tile's bn).
    const int64_t bn = std::max<int64_t>(8, round_up(s.m, 8));
    for (int64_t bm : {128, 64}) {
      const int64_t consumers = bm == 128 && bn > 128 ? 2 : 1;
      const int64_t ck = cluster_for(tiles(bm, bn, true), s.k, sms);
      out.push_back({bm, bn, consumers, fit_stages(l, bm, bn, 8), 1, false, ck, 1, true});
      if (ck < 4 && ceil_div(s.k, 64) >= 8 * ck) out.push_back({bm, bn, consumers, fit_stages(l, bm, bn, 8), 1, false, 2 * ck, 1, true});
      if (ck > 1) out.push_back({bm, bn, consumers, fit_stages(l, bm, bn, 8), 1, false, ck / 2, 1, true});
      // Memory-bound: the deepest ring that fits keeps more of B in flight per SM.
      out.push_back({bm, bn, consumers, fit_stages(l, bm, bn, 16), 1, false, ck, 1, true});
      out.push_back({bm, bn, consumers, fit_stages(l, bm, bn, 16), 1, false, 1, 1, true});
    }
    out.push_back({64, bn, 1, fit_stages(l, 64, bn, 6, 2), 1, false, 1, 2, true});
    out.push_back({128, bn, bn > 128 ? 2 : 1, fit_stages(l, 128, bn, 5), 1, false,
                   cluster_for(tiles(128, bn, true), s.k, sms), 1, true});
    if (s.m <= 32) {
      // Two blocks per SM on the deepest ring that fits, alone, letting the next kernel launch after the last load
      // (trigger 2: its blocks fit beside this one's and run their prologue during its tail), and with the weights of
      // the first half or all of the ring requested before the dependency wait, the next kernel let launch at the
      // start or after the last load (the suite never writes B, so it promises KILN_GEMM_B_CONSTANT). On an H200
      // (30 Nov, bench/results/gemm-early-weights-nvidia-h200-2026-11-30.md) each of these won shapes; the trigger at
      // the start without early weights never did.
      const int64_t st = fit_stages(l, 64, bn, 16, 2);
      for (int64_t ck : {cluster_for(tiles(64, bn, true), s.k, sms), int64_t{1}}) {
        Wgmma w{64, bn, 1, st, 1, false, ck, 2, true};
        out.push_back(w);
        w.trigger = 2;
        out.push_back(w);
        for (int64_t e : {st / 2, st}) {
          for (int64_t trigger : {1, 2}) {
            w.early = e;
            w.trigger = trigger;
            out.push_back(w);
          }
        }
      }
    }
  }
  if (s.m <= 64) {
    // The plain decode tiles that won before swap-AB existed (bench/results/gemm-nvidia-h200-2026-11-21.md).
    const int64_t ck = cluster_for(tiles(64, 128, false), s.k, sms);
    out.push_back({64, 128, 1, 8, 1, false, ck, 1, false});
    out.push_back({64, 64, 1, 6, 1, false, 1, 2, false});
    out.push_back({64, 64, 1, 8, 1, false, cluster_for(tiles(64, 64, false), s.k, sms), 1, false});
    return out;
  }
  if (s.m > 128 && s.m <= 512 && tiles(64, round_up(ceil_div(s.m, 2), 8), true) < sms) {
    // Narrow swap-AB tiles where N is small: M in 3, 4, 6 or 7 column tiles of 40-112, each on the deepest ring
    // that fits, K split over a cluster when the tiles are few. cuBLAS's own kernels for 333x576x7168 on an H200
    // are of this kind (nvjet 64x48, 15 stages, split-K over 126 blocks; 64x56 s14, 64x88 s11 and 64x112 s9 with
    // clusters; seen with ncu, 28 Nov); with them kiln went from 0.76x to 0.91x there. Where N is large, each
    // column tile streams all of B again: 1.4-2x slower than the wide tiles on every such shape of the suite.
    std::set<int64_t> widths;
    for (int64_t c : {7, 6, 4, 3}) widths.insert(round_up(ceil_div(s.m, c), 8));
    for (int64_t bn : widths) {
      const int64_t ck = cluster_for(tiles(64, bn, true), s.k, sms);
      out.push_back({64, bn, 1, fit_stages(l, 64, bn, 16), ck > 1 ? 1 : 8, false, ck, 1, true});
      if (ck > 1) out.push_back({64, bn, 1, fit_stages(l, 64, bn, 16), 8, false, 1, 1, true});
    }
  }
  if (s.m > 256 && s.m <= 512) {
    // Swap-AB past decode: M in two column tiles of round_up(M / 2, 8) pads M = 333 to 336 where 128-row tiles
    // pad it to 384 (the kernel's rows are N, in 64-row steps).
    const int64_t bn = round_up(ceil_div(s.m, 2), 8);
    out.push_back({128, bn, 2, fit_stages(l, 128, bn, 6), 8, true, 1, 1, true});
    out.push_back({128, bn, 2, fit_stages(l, 128, bn, 6), 8, false, 1, 1, true});
    out.push_back({64, bn, 1, fit_stages(l, 64, bn, 8), 8, true, 1, 1, true});
  }
  if (s.m >= 128) {
    // Tiles as wide as make one or two full waves: cuBLAS's kernels on an H200 pick N widths such as 80 and 112
    // so that the tile count meets the SMs (1000x1280x8192: 80-wide tiles, 128 of them; 256x7168x2048: 128x112,
    // 128 tiles; seen with ncu, 28 Nov), where 128-wide tiles leave a partial wave.
    // (The multiples of 64 are measured below.)
    for (int64_t bn : templates::wave_fit_widths(s.m, s.n, sms)) {
      out.push_back({128, bn, 2, fit_stages(l, 128, bn, 8), 8, false, 1, 1, false});
      out.push_back({128, bn, 2, fit_stages(l, 128, bn, 8), 8, true, 1, 1, false});
    }
  }
  const bool few = tiles(128, 128, false) < sms;
  // Ping-pong: each consumer a whole tile, one's epilogue under the other's MMAs (short K, many tiles).
  out.push_back(pingpong({128, 128, 2, 6, 8, true, 1, 1, false}));
  out.push_back(pingpong(staged({128, 128, 2, 5, 8, true, 1, 1, false})));
  out.push_back(pingpong(staged({64, 256, 2, 5, 8, true, 1, 1, false})));
  out.push_back(pingpong({64, 256, 2, 5, 8, true, 1, 1, false}));
  if (s.m <= 1024) {
    out.push_back({128, 128, 2, 6, 8, true, 1, 1, false});
    out.push_back(staged({128, 128, 2, 6, 8, true, 1, 1, false}));
    out.push_back({64, 256, 1, fit_stages(l, 64, 256, 6), 8, true, 1, 1, false});
    if (few) out.push_back({128, 128, 2, 6, 1, false, cluster_for(tiles(128, 128, false), s.k, sms), 1, false});
    out.push_back({128, 256, 2, 4, 8, true, 1, 1, false});
    out.push_back({64, 128, 1, 8, 8, true, 1, 1, false});
    out.push_back({128, 192, 2, 5, 8, true, 1, 1, false});
    out.push_back(staged({128, 256, 2, 4, 8, true, 1, 1, false}));
    out.push_back({128, 64, 2, 8, 8, true, 1, 1, false});
    if (few) out.push_back({64, 128, 1, 8, 1, false, cluster_for(tiles(64, 128, false), s.k, sms), 1, false});
  }
  // Each of the tiles that won on the H100 (bench/results/gemm-suite-nvidia-h100-2026-11-25-24c0899.md) also with
  // the staged epilogue, next to it so that --max-configs keeps both.
  out.push_back({128, 256, 2, 4, 16, true, 1, 1, false});
  out.push_back(staged({128, 256, 2, 4, 16, true, 1, 1, false}));
  out.push_back(multicast(staged({128, 256, 2, 4, 16, true, 1, 1, false})));
  out.push_back(multicast(staged({128, 256, 2, 4, 8, false, 1, 1, false})));
  out.push_back({128, 256, 2, 4, 8, true, 1, 1, false});
  out.push_back(staged({128, 256, 2, 4, 8, true, 1, 1, false}));
  out.push_back({256, 128, 2, 4, 8, true, 1, 1, false});
  out.push_back(staged({256, 128, 2, 4, 8, true, 1, 1, false}));
  out.push_back({128, 192, 2, 5, 8, true, 1, 1, false});
  out.push_back(staged({128, 192, 2, 5, 8, true, 1, 1, false}));
  out.push_back({128, 256, 2, 3, 8, false, 1, 1, false});
  out.push_back({128, 128, 2, 6, 8, true, 1, 1, false});
  out.push_back(staged({128, 128, 2, 6, 8, true, 1, 1, false}));
  out.push_back({256, 128, 2, 3, 16, true, 1, 1, false});
  out.push_back({128, 256, 2, 4, 1, true, 1, 1, false});
  return out;
}

Params wgmma_params(const Params& base, const Wgmma& w) {
  Params p = base;
  p.insert_or_assign("bm", Value::integer(w.bm));
  p.insert_or_assign("bn", Value::integer(w.bn));
  p.insert_or_assign("consumers", Value::integer(w.consumers));
  p.insert_or_assign("stages", Value::integer(w.stages));
  p.insert_or_assign("group_m", Value::integer(w.group_m));
  p.insert_or_assign("persistent", Value::boolean(w.persistent));
  p.insert_or_assign("cluster_k", Value::integer(w.cluster_k));
  p.insert_or_assign("blocks_per_sm", Value::integer(w.blocks_per_sm));
  p.insert_or_assign("swap_ab", Value::boolean(w.swap_ab));
  p.insert_or_assign("epi", Value::enumeration(w.epi_smem ? "smem" : "direct"));
  p.insert_or_assign("mcast", Value::integer(w.mcast));
  p.insert_or_assign("stream_k", Value::boolean(w.stream_k));
  p.insert_or_assign("sk_even", Value::boolean(w.sk_even));
  p.insert_or_assign("pingpong", Value::boolean(w.pingpong));
  p.insert_or_assign("early", Value::integer(w.early));
  p.insert_or_assign("trigger", Value::integer(w.trigger));
  return p;
}

std::vector<Params> mma_order(const SuiteShape& s, const Params& base) {
  struct T { int64_t bm, bn, bk, wm, wn, stages, group_m; };
  std::vector<T> ts;
  if (s.m <= 64) {
    const int64_t bm = s.m <= 16 ? 16 : (s.m <= 32 ? 32 : 64);
    if (bm == 64) {
      ts = {{64, 64, 64, 2, 2, 4, 1}, {64, 128, 64, 2, 2, 4, 1}, {64, 128, 32, 2, 4, 5, 1}};
    } else {
      ts = {{bm, 64, 64, 1, 4, 4, 1}, {bm, 128, 64, 1, 4, 4, 1}, {bm, 64, 64, 1, 4, 6, 1}, {bm, 128, 32, 1, 4, 6, 1}};
    }
  } else {
    ts = {{128, 128, 32, 2, 2, 4, 8}, {128, 128, 32, 2, 2, 3, 8}, {128, 128, 32, 4, 2, 4, 8}, {128, 128, 64, 2, 2, 3, 8},
          {128, 64, 32, 2, 2, 4, 8},  {64, 128, 32, 2, 2, 4, 8},  {256, 128, 32, 4, 2, 3, 8}, {128, 256, 32, 2, 4, 3, 8},
          {128, 128, 32, 2, 2, 4, 16}};
  }
  std::vector<Params> out;
  for (const T& t : ts) {
    Params p = base;
    for (auto [k, v] : std::initializer_list<std::pair<const char*, int64_t>>{
             {"bm", t.bm}, {"bn", t.bn}, {"bk", t.bk}, {"warps_m", t.wm}, {"warps_n", t.wn}, {"stages", t.stages},
             {"group_m", t.group_m}})
      p.insert_or_assign(k, Value::integer(v));
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace

std::vector<FamilyCandidates> candidates_for(const SuiteShape& s, const DeviceLimits& limits,
                                             const Target& device_arch_target, const std::vector<std::string>& families,
                                             size_t max_configs) {
  std::vector<FamilyCandidates> out;
  const templates::Shape shape{s.m, s.n, s.k};
  const templates::Layout la = templates::Layout::kRowMajor;
  auto none = templates::parse_epilogue("", s.dtype);
  if (!none.ok()) return out;
  Params base = templates::gemm_problem_params(s.dtype, la, s.layout_b, *none, false);
  for (const TemplatePtr& t : templates::templates_for("gemm")) {
    const bool asked = std::find(families.begin(), families.end(), t->name()) != families.end() ||
                       std::find(families.begin(), families.end(), "all") != families.end();
    if (!asked && templates::superseded_on(*t, device_arch_target) != nullptr) continue;
    const templates::TemplateDef& d = t->def();
    if (device_arch_target.compute_capability() < d.min_cc) continue;
    if (d.needs_arch_specific && !device_arch_target.arch_specific()) continue;
    FamilyCandidates fc;
    fc.family = t->name();
    fc.tmpl = t;
    // A family that needs the arch-specific target compiles for it; others for the plain arch.
    fc.arch = d.needs_arch_specific ? device_arch_target.arch
                                    : device_arch_target.arch.substr(0, device_arch_target.arch.size() -
                                                                            (device_arch_target.arch_specific() ? 1 : 0));
    DeviceLimits lim = limits;
    lim.arch = fc.arch;
    lim.arch_specific = d.needs_arch_specific && device_arch_target.arch_specific();
    std::vector<Params> order;
    if (t->name() == "gemm_wgmma_sm90") {
      for (const Wgmma& w : wgmma_order(s, limits)) order.push_back(wgmma_params(base, w));
    } else if (t->name() == "gemm_mma_sm80") {
      Params b = base;
      b.insert_or_assign("align", Value::integer(templates::gemm_alignment(templates::dense_lda(la, shape),
                                                                            templates::dense_ldb(s.layout_b, shape))));
      order = mma_order(s, b);
    } else {
      continue;  // a family the suite has no heuristic for yet: say so by its absence from the results
    }
    std::set<std::string> names;
    for (Params& p : order) {
      if (fc.configs.size() >= max_configs) break;
      if (!t->check(p, lim).ok() || !t->check_problem(p, shape).ok()) continue;
      auto name = t->config_name(p);
      if (!name.ok() || !names.insert(*name).second) continue;
      fc.configs.push_back(std::move(p));
    }
    if (!fc.configs.empty()) out.push_back(std::move(fc));
  }
  return out;
}

std::string variant_of(const std::string& family, const Params& p) {
  if (family != "gemm_wgmma_sm90") return "";
  if (templates::get_bool(p, "sk_even")) return "stream_k_even";
  if (templates::get_bool(p, "swap_ab")) return "swap_ab";
  if (templates::get_int(p, "cluster_k") > 1) return "cluster_k";
  if (templates::get_bool(p, "stream_k")) return "stream_k";
  if (templates::get_bool(p, "pingpong")) return "pingpong";
  if (templates::get_bool(p, "persistent")) return "persistent";
  return "tile";
}

}  // namespace kiln::bench::suite
