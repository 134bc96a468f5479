// The performance model's ranking, effort plans, widening, adaptive repetitions and the workload budget:
// CPU-only (fake choices with template parameters, synthetic samples, a fake clock).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "kiln/runtime/budget.h"
#include "kiln/runtime/measure.h"
#include "kiln/runtime/perf_model.h"
#include "kiln/runtime/builtin.h"
#include "kiln/runtime/ops.h"
#include "kiln/runtime/tuner.h"
#include "kiln/runtime/workload.h"
#include "fake_choices.h"
#include "selection_rule.h"

namespace kiln::runtime {
namespace {

using testing::FakeChoice;
using testing::Params;
using testing::wgmma;

Problem gemm(int64_t m, int64_t n, int64_t k) { return Problem::gemm({.m = m, .n = n, .k = k}); }

const DevicePeaks kH100 = DevicePeaks::for_arch("sm_90a");

TEST(PerfModel, OneFullWaveBeatsAWaveAndAFewBlocksForTheSameWork) {
  // 128x128 tiles: 12 x 11 = 132 tiles fill the 132 SMs once; 12 x 11.6 (139 tiles) need a second wave.
  const Problem one_wave = gemm(12 * 128, 11 * 128, 4096);
  const Problem tail = gemm(12 * 128, 11 * 128 + 80, 4096);
  const ModelEstimate a = estimate(one_wave, ChoiceKind::kTemplate, wgmma(128, 128), kH100);
  const ModelEstimate b = estimate(tail, ChoiceKind::kTemplate, wgmma(128, 128), kH100);
  ASSERT_TRUE(a.known && b.known);
  EXPECT_NEAR(a.waves, 1.0, 1e-9);
  EXPECT_GT(b.waves, 1.0);
  EXPECT_LT(b.waves, 1.1);
  EXPECT_GT(b.us, 1.5 * a.us) << "a second, nearly empty wave costs nearly a whole wave";

  // On one problem: the tile giving exactly one wave ranks above a smaller-count-but-1.05-wave tile.
  const Problem p = gemm(12 * 128, 11 * 256, 4096);  // 128x256: 132 tiles; 128x192: 12x15 = 180 (1.36 waves)
  std::vector<ChoicePtr> choices{std::make_shared<FakeChoice>("t128x192", ChoiceKind::kTemplate, wgmma(128, 192)),
                                 std::make_shared<FakeChoice>("t128x256", ChoiceKind::kTemplate, wgmma(128, 256))};
  auto order = rank(p, choices, kH100);
  ASSERT_EQ(order.size(), 2u);
  EXPECT_EQ(choices[order[0].index]->name(), "t128x256");
}

TEST(PerfModel, DecodeShapesPreferSplitKAndSwapAB) {
  const Problem decode = gemm(16, 4096, 4096);
  std::vector<ChoicePtr> choices{
      std::make_shared<FakeChoice>("plain_128x128", ChoiceKind::kTemplate, wgmma(128, 128)),
      std::make_shared<FakeChoice>("plain_128x256", ChoiceKind::kTemplate, wgmma(128, 256)),
      std::make_shared<FakeChoice>("swap_64x16", ChoiceKind::kTemplate, wgmma(64, 16, 1, 8, 1, true)),
      std::make_shared<FakeChoice>("ck2_64x64", ChoiceKind::kTemplate, wgmma(64, 64, 1, 8, 2)),
      std::make_shared<FakeChoice>("cublas_default", ChoiceKind::kExtern, Params{}),
  };
  auto order = rank(decode, choices, kH100);
  ASSERT_EQ(order.size(), choices.size());
  const std::string top = choices[order[0].index]->name();
  EXPECT_TRUE(top == "swap_64x16" || top == "ck2_64x64") << top;
  EXPECT_EQ(order[0].estimate.bound, "memory");
  // The big tiles leave most SMs idle on M = 16: they come last among the templates.
  EXPECT_EQ(choices[order[3].index]->name(), "plain_128x256");
  // The extern is not judged: it comes last, unknown.
  EXPECT_EQ(choices[order.back().index]->name(), "cublas_default");
  EXPECT_FALSE(order.back().estimate.known);
  // Split-K as a subgraph is judged too (its GEMM step's tile, more blocks, the partials' bytes).
  Params sub{{"subgraph", "splitk"}, {"slices", "4"}};
  for (const auto& [k, v] : wgmma(64, 64, 1, 6)) sub["step0." + k] = v;
  const ModelEstimate split = estimate(decode, ChoiceKind::kSubgraph, sub, kH100);
  const ModelEstimate whole = estimate(decode, ChoiceKind::kTemplate, wgmma(64, 64, 1, 6), kH100);
  ASSERT_TRUE(split.known);
  EXPECT_EQ(split.blocks, 4 * whole.blocks);
}

// The block scheduler spreads blocks over the SMs before it stacks them: a two-per-SM grid that fits the SMs runs
// one block per SM, like its one-per-SM twin of the same ring; only past the SMs does the second block share one.
TEST(PerfModel, TwoPerSmGridsSpreadOverTheSmsBeforeTheyStack) {
  const DevicePeaks h200 = DevicePeaks::parts_of("sm_90a").back();
  // 1 x 6144 x 4096, swap-AB 64x8 on a 12-stage ring: 96 blocks on 132 SMs.
  const Problem decode = gemm(1, 6144, 4096);
  const ModelEstimate one = estimate(decode, ChoiceKind::kTemplate, wgmma(64, 8, 1, 12, 1, true, false, 1, 1), h200);
  const ModelEstimate two = estimate(decode, ChoiceKind::kTemplate, wgmma(64, 8, 1, 12, 1, true, false, 2, 1), h200);
  ASSERT_TRUE(one.known && two.known);
  EXPECT_EQ(two.blocks, 96);
  EXPECT_NEAR(two.us, one.us, 1e-9) << "96 blocks run one to an SM whatever the tile allows";
  // 1 x 28672 x 4096: 448 blocks. One per SM needs four waves, two per SM two: the second tile per SM shares its
  // bandwidth but has a ring of its own, and the waves halve.
  const Problem wide = gemm(1, 28672, 4096);
  const ModelEstimate w1 = estimate(wide, ChoiceKind::kTemplate, wgmma(64, 8, 1, 12, 1, true, false, 1, 1), h200);
  const ModelEstimate w2 = estimate(wide, ChoiceKind::kTemplate, wgmma(64, 8, 1, 12, 1, true, false, 2, 1), h200);
  EXPECT_NEAR(w1.waves, 448.0 / 132, 1e-9);
  EXPECT_NEAR(w2.waves, 448.0 / 264, 1e-9);
  EXPECT_LE(w2.us, w1.us);
}

// A memory-bound ring streams at what its bytes in flight sustain over a stage's round trip (stage_latency_us),
// up to an SM's share of the bandwidth: deeper helps a small tile until that share is reached, then nothing.
TEST(PerfModel, DeeperRingsStreamMoreUntilTheSmsShareOfBandwidth) {
  const DevicePeaks h200 = DevicePeaks::parts_of("sm_90a").back();
  const Problem decode = gemm(1, 4096, 4096);  // swap-AB 64x8: 64 blocks, 9 KiB a stage
  auto us = [&](int stages) {
    return estimate(decode, ChoiceKind::kTemplate, wgmma(64, 8, 1, stages, 1, true, false, 1, 1), h200).memory_us;
  };
  EXPECT_GT(us(4), 1.2 * us(8));
  EXPECT_GT(us(8), us(12));
  EXPECT_NEAR(us(12), us(16), 1e-9) << "12 stages already reach the SM's share";
  DevicePeaks idle = h200;
  idle.stage_latency_us = idle.memory_latency_us;  // an unloaded round trip would call 8 stages enough
  EXPECT_NEAR(estimate(decode, ChoiceKind::kTemplate, wgmma(64, 8, 1, 8, 1, true, false, 1, 1), idle).memory_us,
              estimate(decode, ChoiceKind::kTemplate, wgmma(64, 8, 1, 16, 1, true, false, 1, 1), idle).memory_us, 1e-9);
}

TEST(PerfModel, LargeSquareGemmIsComputeBoundAndPrefersBigTiles) {
  const Problem p = gemm(4096, 4096, 4096);
  const ModelEstimate big = estimate(p, ChoiceKind::kTemplate, wgmma(128, 256, 2, 4, 1, false, true), kH100);
  const ModelEstimate small = estimate(p, ChoiceKind::kTemplate, wgmma(64, 64, 1, 4), kH100);
  EXPECT_EQ(big.bound, "compute");
  EXPECT_LT(big.us, small.us);
  // About 2*4096^3 / 989 TFLOP/s = 139 us at peak: the model is in the right range.
  EXPECT_GT(big.us, 139);
  EXPECT_LT(big.us, 300);
}

TEST(PerfModel, NormsAreBandwidthBoundAndMoreBlocksHelpFewRows) {
  const Problem p = Problem::norm({.rows = 4096, .cols = 4096});
  Params many{{"template", "rmsnorm"}, {"threads", "256"}, {"rows_per_block", "1"}, {"vec", "8"}, {"items", "2"}};
  const ModelEstimate e = estimate(p, ChoiceKind::kTemplate, many, kH100);
  ASSERT_TRUE(e.known);
  EXPECT_EQ(e.bound, "memory");
  // 4096 x 4096 bf16 read and written: 64 MiB at 3.35 TB/s is ~20 us.
  EXPECT_GT(e.us, 18);
  EXPECT_LT(e.us, 40);
  // A row too long for the registers is read twice.
  Params short_regs = many;
  short_regs["vec"] = "1";
  short_regs["items"] = "1";
  EXPECT_GT(estimate(p, ChoiceKind::kTemplate, short_regs, kH100).memory_us, e.memory_us);
  // Softmax over a 128256-wide row on one cluster per row vs one block per row.
  const Problem sm = Problem::softmax({.rows = 1, .cols = 128256});
  Params cluster{{"template", "softmax_cluster"}, {"threads", "1024"}, {"vec", "8"}, {"items", "2"}, {"cluster", "8"}};
  Params block{{"template", "softmax"}, {"threads", "1024"}, {"rows_per_block", "1"}, {"vec", "8"}, {"items", "8"}};
  EXPECT_LT(estimate(sm, ChoiceKind::kTemplate, cluster, kH100).us, estimate(sm, ChoiceKind::kTemplate, block, kH100).us);
}

// Items past a thread's share of the row load nothing, so they put no more bytes in flight. (On 64 x 128256
// softmax rows the H200 measured items=2 on a 1024-thread, 8-block cluster, where each thread has 2 vectors,
// at 23.8 us, and items=6 on 512 threads at 26.1 us; the model had ranked the latter first.) Here one row of
// 8192 on a 2-block cluster of 256 threads: few bytes in flight, so they decide the bandwidth reached.
TEST(PerfModel, ItemsBeyondTheRowsShareAddNothingInFlight) {
  const Problem sm = Problem::softmax({.rows = 1, .cols = 8192});
  Params fit{{"template", "softmax_cluster"}, {"threads", "256"}, {"vec", "8"}, {"items", "2"}, {"cluster", "2"}};
  Params over = fit;
  over["items"] = "6";  // 2 vectors of the row per thread: 4 of the 6 load nothing
  Params under = fit;
  under["items"] = "1";  // the row is read twice, and half the bytes are in flight
  const ModelEstimate a = estimate(sm, ChoiceKind::kTemplate, fit, kH100);
  const ModelEstimate b = estimate(sm, ChoiceKind::kTemplate, over, kH100);
  EXPECT_NEAR(a.memory_us, b.memory_us, 1e-9);
  EXPECT_LE(a.us, b.us);
  EXPECT_GT(estimate(sm, ChoiceKind::kTemplate, under, kH100).memory_us, a.memory_us);
}

TEST(PerfModel, PeaksFromADeviceReadItsBandwidth) {
  DeviceInfo h200;
  h200.cc_major = 9;
  h200.sm_count = 132;
  h200.memory_clock_khz = 3201000;
  h200.memory_bus_bits = 6144;
  h200.max_shared_per_sm = 233472;
  const DevicePeaks d = DevicePeaks::from_device(h200);
  EXPECT_TRUE(d.measured);
  EXPECT_NEAR(d.hbm_gbps, 4917, 5);
  EXPECT_NEAR(d.tensor_tflops, 989, 1);
  EXPECT_EQ(DevicePeaks::for_arch("sm_80").sms, 108);
}

TEST(PerfModel, CalibrationFromNeighboursReordersChoices) {
  const Problem p = gemm(64, 4096, 4096);
  std::vector<ChoicePtr> choices{std::make_shared<FakeChoice>("a", ChoiceKind::kTemplate, wgmma(64, 64, 1, 8, 2)),
                                 std::make_shared<FakeChoice>("b", ChoiceKind::kTemplate, wgmma(128, 128))};
  auto plain = rank(p, choices, kH100);
  const std::string first = choices[plain[0].index]->name();
  const std::string second = choices[plain[1].index]->name();
  // The neighbouring shape measured the model's first choice 4x slower than modelled, the second as modelled.
  const Problem near = gemm(128, 4096, 4096);
  std::vector<NeighbourTiming> t;
  for (const auto& c : choices) {
    const double modelled = estimate(near, *c, kH100).us;
    t.push_back({near, c->name(), c->parameters(), c->kind(), c->name() == first ? 4 * modelled : modelled});
  }
  auto cal = calibrate(t, kH100);
  EXPECT_NEAR(cal[first], 4.0, 1e-6);
  EXPECT_NEAR(cal[second], 1.0, 1e-6);
  auto refined = rank(p, choices, kH100, cal);
  EXPECT_EQ(choices[refined[0].index]->name(), second);
}

// The model against the device: the GEMM suite's recorded candidates on an H100 (bench/results, 111 shapes, 8-12
// measured wgmma configurations each). Kept to the top 4 of rank()'s order (the model with its families' fitted
// bias, as a cold tune orders them), templates only, the best kept must be within 1% of the measured best on >= 95%
// of the shapes (>= 94% since 30 Nov, see below) and within 3% on >= 97%. (The whole rule, with the externs measured first and the top 12, is held
// to 1% on every shape of both recorded suites in test_tuning_effort_prune.cpp. The worst here, 1.10, is
// m128_n24576_k1536; before the cluster split-K bandwidth change of 27 Nov, which fixed the H200 suite's decode
// misses, it was 1.035 and the H200 suite's whole-rule worst 1.043.)
TEST(PerfModel, RanksTheRecordedSuiteCandidatesLikeTheDevice) {
  std::ifstream in(std::string(KILN_SOURCE_DIR) + "/bench/results/gemm-suite-nvidia-h100-2026-11-25-24c0899.json");
  ASSERT_TRUE(in) << "the recorded suite results are part of the repository";
  const nlohmann::json shapes = nlohmann::json::parse(in);
  const std::regex name(R"(gemm_wgmma(_swab)?_(\d+)x(\d+)x64_c(\d)_s(\d)_g(\d+)(_p)?(_ck(\d))?(_b(\d))?_.*)");
  int n = 0, within1 = 0, within3 = 0;
  double worst = 1;
  for (const auto& s : shapes) {
    const Problem p = gemm(s["m"], s["n"], s["k"]);
    std::vector<ChoicePtr> choices;
    std::vector<double> measured;
    for (const auto& c : s["kiln_candidates"]) {
      std::smatch m;
      const std::string config = c["config"];
      ASSERT_TRUE(std::regex_match(config, m, name)) << config;
      Params params = wgmma(std::stoi(m[2]), std::stoi(m[3]), std::stoi(m[4]), std::stoi(m[5]),
                            m[9].matched ? std::stoi(m[9]) : 1, m[1].matched, m[7].matched,
                            m[11].matched ? std::stoi(m[11]) : 1);
      ASSERT_TRUE(estimate(p, ChoiceKind::kTemplate, params, kH100).known) << config;
      choices.push_back(std::make_shared<FakeChoice>(config, ChoiceKind::kTemplate, params));
      measured.push_back(c["us"].get<double>());
    }
    const auto order = rank(p, choices, kH100);
    double best = 1e300, kept = 1e300;
    for (size_t i = 0; i < order.size(); ++i) {
      best = std::min(best, measured[order[i].index]);
      if (i < 4) kept = std::min(kept, measured[order[i].index]);
    }
    ++n;
    if (kept > 1.01 * best) {
      std::printf("  top 4 miss %s: %.1f us, best %.1f us\n", s["id"].get<std::string>().c_str(), kept, best);
    }
    within1 += kept <= 1.01 * best;
    within3 += kept <= 1.03 * best;
    worst = std::max(worst, kept / best);
  }
  EXPECT_EQ(n, 111);
  // 107 of 111 until 30 Nov; 105 since two-per-SM grids are spread one block per SM and the H100 fit was redone
  // with them: the 4th place of m16_n4096_k4096 (row-major B) went from the one-per-SM swap-AB 64x16 tile (14.4
  // us) to a cluster split of 64x64 (17.5; the best kept 15.1) by 1% of score, and m77_n28672_k4096 keeps the
  // 8-stage 128x80 swap-AB tile before its 5-stage twin, equal to the model (1.4% and 2.4% slower). The same change
  // took the H200's replayed first ten from 86 to 102 of 111 GEMMs within 1% (docs/tuning.md).
  EXPECT_GE(within1, 0.94 * n);
  EXPECT_GE(within3, 0.97 * n);
  EXPECT_LE(worst, 1.15);
}

std::vector<ChoicePtr> mixed_choices(int templates) {
  std::vector<ChoicePtr> out;
  for (int i = 0; i < templates; ++i) {
    // Larger tiles model faster on this square problem: t0 (64 wide) is last, the widest is first.
    out.push_back(std::make_shared<FakeChoice>("t" + std::to_string(i), ChoiceKind::kTemplate, wgmma(128, 64 + 8 * i)));
  }
  out.push_back(std::make_shared<FakeChoice>("cublas_default", ChoiceKind::kExtern, Params{}));
  out.push_back(std::make_shared<FakeChoice>("cublaslt_a0", ChoiceKind::kExtern, Params{}));
  return out;
}

std::set<std::string> names(const std::vector<ChoicePtr>& list) {
  std::set<std::string> out;
  for (const auto& c : list) out.insert(c->name());
  return out;
}

TEST(EffortPlan, KeepsTheModelsTopAndEveryExternAndCountsThePruned) {
  const Problem p = gemm(4096, 4096, 4096);
  auto choices = mixed_choices(20);
  auto order = rank(p, choices, kH100);
  auto plan = detail::plan_choices(choices, order, "cublas_default", 12);
  EXPECT_EQ(plan.kept_ranked, 12);
  EXPECT_EQ(plan.first.size(), 14u);  // 12 templates + 2 externs
  EXPECT_EQ(plan.reserve.size(), 8u);
  int externs = 0;
  for (const auto& c : plan.first) externs += c->kind() == ChoiceKind::kExtern;
  EXPECT_EQ(externs, 2);
  // The reserve holds the model's lower ranks, best first.
  for (size_t i = 1; i < plan.reserve.size(); ++i) {
    EXPECT_LT(plan.model[plan.reserve[i - 1]->name()].first, plan.model[plan.reserve[i]->name()].first);
  }
  // Exhaustive keeps everything.
  auto all = detail::plan_choices(choices, order, "cublas_default", effort_policy(Effort::kExhaustive).keep);
  EXPECT_EQ(all.first.size(), choices.size());
  EXPECT_TRUE(all.reserve.empty());
  // Quick keeps 4.
  EXPECT_EQ(detail::plan_choices(choices, order, "cublas_default", effort_policy(Effort::kQuick).keep).kept_ranked, 4);
}

// Near the model's cut-off a choice another problem's plan already compiles is kept in place of one that
// would need its own compile; the model's first quarter is never displaced, and nothing changes when nothing
// is shared or the margin is off.
TEST(EffortPlan, SharedChoicesNearTheCutOffAreKeptFirst) {
  const Problem p = gemm(4096, 4096, 4096);
  auto choices = mixed_choices(20);
  auto order = rank(p, choices, kH100);
  std::vector<std::string> by_rank;
  for (const auto& r : order) {
    if (r.estimate.known) by_rank.push_back(choices[r.index]->name());
  }
  ASSERT_EQ(by_rank.size(), 20u);
  const int keep = 12;
  const auto plain = detail::plan_choices(choices, order, "cublas_default", keep);
  // Nothing planned elsewhere: the same 12 as without sharing.
  const auto alone = detail::plan_choices(choices, order, "cublas_default", keep, {}, 10.0);
  EXPECT_EQ(names(alone.first), names(plain.first));
  EXPECT_EQ(alone.shared_swaps, 0);
  // Ranks 12-14 planned by another problem, and (so that they fall outside any margin) a wide window.
  const std::set<std::string> planned{by_rank[12], by_rank[13], by_rank[14]};
  const auto shared = detail::plan_choices(choices, order, "cublas_default", keep, planned, 10.0);
  EXPECT_EQ(shared.kept_ranked, keep);
  EXPECT_EQ(shared.shared_swaps, 3);
  const auto kept = names(shared.first);
  for (const auto& n : planned) EXPECT_TRUE(kept.count(n)) << n;
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(kept.count(by_rank[i])) << "rank " << i << " is never displaced";
  // What made room: the three lowest of the plain plan's ranks, now in the reserve.
  for (int i = 9; i < 12; ++i) EXPECT_FALSE(kept.count(by_rank[i])) << "rank " << i;
  EXPECT_EQ(shared.reserve.size(), 8u);
  // A margin of 0 is the plain plan whatever is planned.
  EXPECT_EQ(names(detail::plan_choices(choices, order, "cublas_default", keep, planned, 0).first), names(plain.first));
  // The window bounds what may come in: a shared choice scored far past the cut-off stays out.
  const std::set<std::string> far{by_rank[19]};
  const auto narrow = detail::plan_choices(choices, order, "cublas_default", keep, far, 1e-9);
  EXPECT_FALSE(names(narrow.first).count(by_rank[19]));
  EXPECT_EQ(narrow.shared_swaps, 0);
  // A reference ranked past the cut-off is kept as the reference, not counted as a swap.
  const auto with_reference = detail::plan_choices(choices, order, by_rank[19], keep, planned, 10.0);
  EXPECT_TRUE(names(with_reference.first).count(by_rank[19]));
  EXPECT_EQ(with_reference.shared_swaps, 3);
}

// A varied plan keeps the best-ranked choice of every structural variant, even past the cut-off, before more of
// the variant the model ranks first; a shared choice of a variant scored within the margin stands in for its best;
// widening takes the next of one variant in model order.
TEST(EffortPlan, DiverseKeepsEachVariantsBestFirst) {
  const Problem p = gemm(1, 4096, 4096);
  std::vector<ChoicePtr> choices;
  // Twelve cluster split-K decode tiles the model ranks alike (it does not see group_m: equal scores, distinct
  // names), then three other variants, one of them with two members.
  for (int i = 0; i < 12; ++i) {
    choices.push_back(std::make_shared<FakeChoice>("pair" + std::to_string(i), ChoiceKind::kTemplate,
                                                   wgmma(64, 8, 1, 3 + i % 6, 2, true, false, 1, i)));
  }
  Params sk = wgmma(64, 8, 1, 8, 1, true, true);
  sk["stream_k"] = "true";
  Params sk_s4 = sk;
  sk_s4["stages"] = "4";
  choices.push_back(std::make_shared<FakeChoice>("sk", ChoiceKind::kTemplate, sk));
  choices.push_back(std::make_shared<FakeChoice>("sk_s4", ChoiceKind::kTemplate, sk_s4));
  choices.push_back(std::make_shared<FakeChoice>("ck4", ChoiceKind::kTemplate, wgmma(64, 8, 1, 8, 4, true)));
  choices.push_back(std::make_shared<FakeChoice>("tile", ChoiceKind::kTemplate, wgmma(128, 64, 2, 4)));
  choices.push_back(std::make_shared<FakeChoice>("cublas_default", ChoiceKind::kExtern, Params{}));
  const auto order = rank(p, choices, kH100);
  std::map<std::string, int> rank_of;
  std::set<std::string> variants;
  int r = 0;
  for (const auto& o : order) {
    if (!o.estimate.known) continue;
    rank_of[choices[o.index]->name()] = r++;
    variants.insert(o.structure);
  }
  ASSERT_EQ(variants.size(), 4u) << "cluster of 2, stream-K swap-AB, cluster of 4, plain tile";
  const int keep = 6;
  const auto by_rank = detail::plan_choices(choices, order, "cublas_default", keep);
  const auto varied = detail::plan_choices(choices, order, "cublas_default", keep, {}, 0, true);
  EXPECT_EQ(varied.kept_ranked, keep);
  const auto kept = names(varied.first);
  // Each variant's best is in, whatever its rank; the plain plan leaves out those ranked past the cut-off.
  std::map<std::string, std::string> best_of;
  for (const auto& o : order) {
    if (o.estimate.known) best_of.emplace(o.structure, choices[o.index]->name());
  }
  int past_cut = 0;
  for (const auto& [variant, name] : best_of) {
    EXPECT_TRUE(kept.count(name)) << variant << ": " << name;
    if (rank_of[name] >= keep) {
      ++past_cut;
      EXPECT_FALSE(names(by_rank.first).count(name)) << name;
    }
  }
  EXPECT_GT(past_cut, 0) << "the fixture must rank some variant's best past the cut-off";
  EXPECT_EQ(varied.variant_picks, past_cut);
  EXPECT_EQ(varied.structure.at("sk"), varied.structure.at("sk_s4"));
  // A shared choice of a variant within the margin stands in for that variant's best (a pick past the cut-off).
  const std::string sk_best = best_of[varied.structure.at("sk")];
  ASSERT_GE(rank_of[sk_best], keep) << "the twelve alike tiles rank first";
  const std::string sk_other = sk_best == "sk" ? "sk_s4" : "sk";
  const auto shared = detail::plan_choices(choices, order, "cublas_default", keep, {sk_other}, 10.0, true);
  EXPECT_TRUE(names(shared.first).count(sk_other));
  EXPECT_FALSE(names(shared.first).count(sk_best));
  // Widening around one variant takes its next members in model order, and only those.
  auto reserve = varied.reserve;
  std::vector<ChoicePtr> no_cached;
  const std::string ck_variant = varied.structure.at("pair0");
  auto more = detail::widen_variant(reserve, no_cached, varied, ck_variant, 2);
  ASSERT_EQ(more.size(), 2u);
  EXPECT_LT(rank_of[more[0]->name()], rank_of[more[1]->name()]);
  for (const auto& c : more) {
    EXPECT_EQ(varied.structure.at(c->name()), ck_variant);
    EXPECT_FALSE(kept.count(c->name()));
  }
  EXPECT_EQ(reserve.size() + 2, varied.reserve.size());
  EXPECT_TRUE(detail::widen_variant(reserve, no_cached, varied, "no such variant", 2).empty());
}

// keep_top: the model's first choices are kept as ranked, however the variant picks and shares would swap them;
// the other variants' best still come in after them.
TEST(EffortPlan, TheModelsFirstChoicesAreNeverSwapped) {
  const Problem p = gemm(16, 28672, 4096);
  std::vector<ChoicePtr> choices;
  for (int i = 0; i < 8; ++i) {
    choices.push_back(std::make_shared<FakeChoice>("tile" + std::to_string(i), ChoiceKind::kTemplate,
                                                   wgmma(128, 16, 1, 4 + i % 5, 1, true, false, 1, i)));
  }
  Params sk = wgmma(64, 16, 1, 8, 1, true, true);
  sk["stream_k"] = "true";
  choices.push_back(std::make_shared<FakeChoice>("sk", ChoiceKind::kTemplate, sk));
  choices.push_back(std::make_shared<FakeChoice>("ck2", ChoiceKind::kTemplate, wgmma(64, 16, 1, 8, 2, true)));
  choices.push_back(std::make_shared<FakeChoice>("cublas_default", ChoiceKind::kExtern, Params{}));
  const auto order = rank(p, choices, kH100);
  std::vector<std::string> by_rank;
  std::map<std::string, std::string> structure;
  for (const auto& o : order) {
    if (!o.estimate.known) continue;
    by_rank.push_back(choices[o.index]->name());
    structure[by_rank.back()] = o.structure;
  }
  ASSERT_EQ(by_rank.size(), 10u);
  ASSERT_EQ(structure[by_rank[0]], structure[by_rank[1]]) << "the fixture's first ranks are one variant";
  ASSERT_EQ(structure[by_rank[0]], structure[by_rank[2]]);
  // Another problem planned the variant's 6th: it stands in for the variant's best when nothing is fixed.
  const std::set<std::string> planned{by_rank[5]};
  ASSERT_EQ(structure[by_rank[5]], structure[by_rank[0]]);
  // Three slots, three variants: each variant's pick fills one.
  const auto swapped = names(detail::plan_choices(choices, order, "cublas_default", 3, planned, 10.0, true).first);
  EXPECT_TRUE(swapped.count(by_rank[5]));
  EXPECT_FALSE(swapped.count(by_rank[0])) << "without keep_top the variant's best gives way to the shared twin";
  const int keep = 4;
  const auto fixed = detail::plan_choices(choices, order, "cublas_default", keep, planned, 10.0, true, 2);
  const auto kept = names(fixed.first);
  EXPECT_TRUE(kept.count(by_rank[0]));
  EXPECT_TRUE(kept.count(by_rank[1]));
  EXPECT_FALSE(kept.count(by_rank[5])) << "the fixed ranks are the variant's own picks: no twin stands in";
  EXPECT_TRUE(kept.count("sk")) << "the other variants' best come after the fixed ranks";
  EXPECT_TRUE(kept.count("ck2"));
  EXPECT_EQ(fixed.kept_ranked, keep);
  // keep_top past keep keeps the first `keep` only.
  EXPECT_EQ(detail::plan_choices(choices, order, "cublas_default", 2, planned, 10.0, true, 5).kept_ranked, 2);
  EXPECT_EQ(effort_policy(Effort::kDefault).keep_top, 3);
  EXPECT_EQ(effort_policy(Effort::kQuick).keep_top, 0);
}

// stream_k_pick: a memory-bound decode grid of several waves keeps its best-ranked stream-K tile past the cut-off,
// on top of what the plan keeps (nothing else moves); a grid under a wave, a compute-bound one, or stream-K two per
// SM get nothing.
// What a workload compiles speculatively for a tune's first widening (PlanAhead): the next ranks of every
// variant the plan measures first, since only the measurements say around which the tune widens; a cached
// extra among those ranks stands for itself (nothing to compile).
TEST(EffortPlan, TheFirstWideningsAreTheNextRanksOfEachVariantPlanned) {
  auto c = [](const std::string& n) { return std::make_shared<FakeChoice>(n, ChoiceKind::kTemplate, Params{}); };
  detail::TunePlan plan;
  const std::vector<std::string> order{"a0", "b0", "a1", "b1", "a2", "b2", "a3"};
  for (size_t i = 0; i < order.size(); ++i) {
    plan.model[order[i]] = {static_cast<int>(i), 10.0 + static_cast<double>(i)};
    plan.structure[order[i]] = order[i].substr(0, 1);
  }
  plan.first = {c("a0"), c("b0"), std::make_shared<FakeChoice>("cublas_default", ChoiceKind::kExtern, Params{})};
  for (size_t i = 2; i < order.size(); ++i) plan.reserve.push_back(c(order[i]));
  EffortPolicy policy = effort_policy(Effort::kDefault);
  ASSERT_TRUE(policy.diverse);
  ASSERT_EQ(policy.widen, 2);
  EXPECT_EQ(names(detail::first_widenings(plan, policy)), (std::set<std::string>{"a1", "a2", "b1", "b2"}));
  EXPECT_EQ(plan.reserve.size(), 5u) << "the plan's own reserve is left as it was";
  policy.diverse = false;
  EXPECT_EQ(names(detail::first_widenings(plan, policy)), (std::set<std::string>{"a1", "b1"}));
  policy.diverse = true;
  // a1 measured already (a cached extra): the next two of variant a are a1 and a2, and only a2 compiles.
  plan.reserve.erase(plan.reserve.begin());
  plan.cached_extras = {c("a1")};
  EXPECT_EQ(names(detail::first_widenings(plan, policy)), (std::set<std::string>{"a2", "b1", "b2"}));
  EXPECT_TRUE(detail::first_widenings(plan, effort_policy(Effort::kExhaustive)).empty());
  EXPECT_TRUE(detail::first_widenings(plan, effort_policy(Effort::kNone)).empty());
}

TEST(EffortPlan, AMemoryBoundGridOfSeveralWavesKeepsItsBestStreamKTile) {
  auto decode_choices = [](bool two_per_sm) {
    std::vector<ChoicePtr> choices;
    for (int i = 0; i < 6; ++i) {
      choices.push_back(std::make_shared<FakeChoice>("plain" + std::to_string(i), ChoiceKind::kTemplate,
                                                     wgmma(64, 8, 1, 6 + i, 1, true, false, 1, 1 + i)));
    }
    Params sk = wgmma(64, 8, 1, 8, 1, true, true, two_per_sm ? 2 : 1);
    sk["stream_k"] = "true";
    choices.push_back(std::make_shared<FakeChoice>("sk", ChoiceKind::kTemplate, sk));
    choices.push_back(std::make_shared<FakeChoice>("cublas_default", ChoiceKind::kExtern, Params{}));
    return choices;
  };
  const Problem decode = gemm(1, 36864, 7168);  // 576 tiles of 64 rows: 4.4 waves of 132 SMs
  const auto choices = decode_choices(false);
  const auto order = rank(decode, choices, kH100);
  int sk_rank = -1, r = 0;
  for (const auto& o : order) {
    if (!o.estimate.known) continue;
    if (choices[o.index]->name() == "sk") {
      sk_rank = r;
      EXPECT_EQ(o.estimate.bound, "memory");
      EXPECT_GT(o.estimate.waves, 1.0);
    }
    ++r;
  }
  const int keep = 3;
  ASSERT_GE(sk_rank, keep) << "the model prices the stream-K tile behind its plain twins (the fixture's premise)";
  const auto without = detail::plan_choices(choices, order, "cublas_default", keep, {}, 0, true, keep);
  EXPECT_FALSE(names(without.first).count("sk"));
  EXPECT_TRUE(without.stream_k_pick.empty());
  EXPECT_EQ(without.stream_k_choice, nullptr);
  const auto with = detail::plan_choices(choices, order, "cublas_default", keep, {}, 0, true, keep, true);
  EXPECT_TRUE(names(with.first).count("sk"));
  EXPECT_EQ(with.stream_k_pick, "sk");
  ASSERT_NE(with.stream_k_choice, nullptr);
  EXPECT_EQ(with.stream_k_choice->name(), "sk");
  EXPECT_EQ(with.kept_ranked, keep + 1) << "one more, none displaced";
  for (const auto& c : without.first) EXPECT_TRUE(names(with.first).count(c->name())) << c->name();
  EXPECT_EQ(with.variant_picks, 0);
  EXPECT_EQ(with.shared_swaps, 0);
  ASSERT_NE(detail::stream_k_candidate(order), nullptr);
  EXPECT_EQ(choices[detail::stream_k_candidate(order)->index]->name(), "sk");
  // Already kept: nothing is added, but it is named (the tune must not cut it extern-first).
  const auto all_without = detail::plan_choices(choices, order, "cublas_default", 7, {}, 0, true, 7);
  const auto all = detail::plan_choices(choices, order, "cublas_default", 7, {}, 0, true, 7, true);
  EXPECT_TRUE(names(all.first).count("sk"));
  EXPECT_EQ(all.stream_k_pick, "sk");
  ASSERT_NE(all.stream_k_choice, nullptr);
  EXPECT_EQ(all.stream_k_choice->name(), "sk");
  EXPECT_EQ(all.kept_ranked, all_without.kept_ranked);
  EXPECT_EQ(names(all.first), names(all_without.first));
  // Under one wave (64 tiles), two per SM, or compute-bound: no candidate.
  EXPECT_EQ(detail::stream_k_candidate(rank(gemm(1, 4096, 4096), choices, kH100)), nullptr);
  const auto two = decode_choices(true);
  EXPECT_EQ(detail::stream_k_candidate(rank(decode, two, kH100)), nullptr);
  // 4096^3: the model's first choice is compute-bound; a narrow swap-AB stream-K tile ranked below it is
  // memory-bound (it reloads the operands for every 8 columns) and is no reason to measure anything.
  std::vector<ChoicePtr> square;
  for (auto [bm, bn, swab, name] : {std::tuple{128, 128, false, "big"}, std::tuple{128, 8, true, "sk_narrow"}}) {
    Params t = wgmma(bm, bn, 2, 4, 1, swab, true);
    if (swab) t["stream_k"] = "true";
    square.push_back(std::make_shared<FakeChoice>(name, ChoiceKind::kTemplate, t));
  }
  const auto square_order = rank(gemm(4096, 4096, 4096), square, kH100);
  ASSERT_EQ(square_order.size(), 2u);
  EXPECT_EQ(square[square_order[0].index]->name(), "big");
  EXPECT_EQ(square_order[0].estimate.bound, "compute");
  EXPECT_EQ(square_order[1].estimate.bound, "memory") << "the fixture's narrow tile";
  EXPECT_GT(square_order[1].estimate.waves, 1.0);
  EXPECT_EQ(detail::stream_k_candidate(square_order), nullptr);
  // Only swap-AB tiles: an unswapped stream-K tile (memory-bound, several waves) is never the pick.
  auto with_tile_sk = [](std::vector<ChoicePtr> list) {
    Params tile_sk = wgmma(64, 256, 2, 4, 1, false, true);
    tile_sk["stream_k"] = "true";
    list.push_back(std::make_shared<FakeChoice>("tile_sk", ChoiceKind::kTemplate, tile_sk));
    return list;
  };
  const Problem wide = gemm(1, 65536, 4096);
  const auto both = with_tile_sk(choices);
  const auto both_order = rank(wide, both, kH100);
  ASSERT_NE(detail::stream_k_candidate(both_order), nullptr);
  EXPECT_EQ(both[detail::stream_k_candidate(both_order)->index]->name(), "sk");
  std::vector<ChoicePtr> plain_and_tile;
  for (const auto& c : both) {
    if (c->name() != "sk") plain_and_tile.push_back(c);
  }
  const auto tile_order = rank(wide, plain_and_tile, kH100);
  bool tile_qualifies = false;
  for (const auto& o : tile_order) {
    if (plain_and_tile[o.index]->name() == "tile_sk") tile_qualifies = o.estimate.bound == "memory" && o.estimate.waves > 1;
  }
  ASSERT_TRUE(tile_qualifies) << "the fixture's unswapped tile is memory-bound over several waves";
  EXPECT_EQ(detail::stream_k_candidate(tile_order), nullptr);
  // A swap-AB stream-K tile whose grid is one wave or less is passed over for the next one in the order.
  std::vector<ChoicePtr> waves = choices;
  Params one_wave = wgmma(256, 8, 1, 4, 1, true, true);
  one_wave["stream_k"] = "true";
  waves.push_back(std::make_shared<FakeChoice>("sk_one_wave", ChoiceKind::kTemplate, one_wave));
  const Problem w28672 = gemm(1, 28672, 4096);  // 256-row tiles: 112 blocks; 64-row tiles: 448 (3.4 waves)
  const auto waves_order = rank(w28672, waves, kH100);
  std::vector<std::string> sk_in_order;
  for (const auto& o : waves_order) {
    const std::string n = waves[o.index]->name();
    if (n.rfind("sk", 0) == 0) sk_in_order.push_back(n);
  }
  ASSERT_EQ(sk_in_order, (std::vector<std::string>{"sk_one_wave", "sk"})) << "the one-wave tile ranks first";
  ASSERT_NE(detail::stream_k_candidate(waves_order), nullptr);
  EXPECT_EQ(waves[detail::stream_k_candidate(waves_order)->index]->name(), "sk");
  // Scored far behind the first (a 128x8 tile over 77 rows, 3x): no pick.
  std::vector<ChoicePtr> skinny;
  skinny.push_back(std::make_shared<FakeChoice>("ck2", ChoiceKind::kTemplate, wgmma(64, 80, 1, 8, 2, true)));
  Params narrow = wgmma(128, 8, 1, 5, 1, true, true);
  narrow["stream_k"] = "true";
  skinny.push_back(std::make_shared<FakeChoice>("sk_narrow", ChoiceKind::kTemplate, narrow));
  const auto skinny_order = rank(gemm(77, 4096, 14336), skinny, kH100);
  ASSERT_EQ(skinny_order.size(), 2u);
  ASSERT_EQ(skinny[skinny_order[1].index]->name(), "sk_narrow");
  ASSERT_EQ(skinny_order[0].estimate.bound, "memory");
  ASSERT_EQ(skinny_order[1].estimate.bound, "memory");
  ASSERT_GT(skinny_order[1].estimate.waves, 1.0);
  ASSERT_GT(skinny_order[1].score_us, 1.15 * skinny_order[0].score_us) << "the fixture's premise";
  EXPECT_EQ(detail::stream_k_candidate(skinny_order), nullptr);
  EXPECT_TRUE(effort_policy(Effort::kDefault).stream_k_pick);
  EXPECT_FALSE(effort_policy(Effort::kQuick).stream_k_pick);
  EXPECT_FALSE(effort_policy(Effort::kExhaustive).stream_k_pick);
}

// Widening goes around the fastest measured choice of each of the fastest variants: only model-ranked choices
// count, a variant behind the best extern counts within the near-extern margin only, and a choice widened around
// once is not widened around again (a widening that found no new best stops there).
TEST(EffortPlan, WidensAroundTheFastestVariantsNearTheBestExtern) {
  detail::TunePlan plan;
  plan.structure = {{"sk_a", "swab/sk"}, {"sk_b", "swab/sk"}, {"ck2_a", "swab/ck2"}, {"tile_a", "tile/none"},
                    {"ck4_a", "swab/ck4"}};
  const std::vector<std::pair<std::string, double>> measured{
      {"cublas_default", 20.0}, {"sk_a", 19.0}, {"sk_b", 18.5}, {"ck2_a", 20.4}, {"tile_a", 25.0}, {"ck4_a", 21.0}};
  using Picks = std::vector<std::pair<std::string, std::string>>;
  // The best variant only, as before: stream-K around its fastest member.
  EXPECT_EQ(detail::variants_to_widen(measured, plan, 20.0, 1, 0, {}), (Picks{{"swab/sk", "sk_b"}}));
  // Two variants: ck2 trails cuBLAS by 2%, inside a 3% margin, outside none.
  EXPECT_EQ(detail::variants_to_widen(measured, plan, 20.0, 2, 0.03, {}),
            (Picks{{"swab/sk", "sk_b"}, {"swab/ck2", "ck2_a"}}));
  EXPECT_EQ(detail::variants_to_widen(measured, plan, 20.0, 2, 0, {}), (Picks{{"swab/sk", "sk_b"}}));
  // The third variant (5% behind) is not among the two fastest, nor within the margin of the extern.
  EXPECT_EQ(detail::variants_to_widen(measured, plan, 20.0, 3, 0.03, {}).size(), 2u);
  EXPECT_EQ(detail::variants_to_widen(measured, plan, 20.0, 3, 0.06, {}).size(), 3u);
  // Already widened around sk_b: only ck2 is left; around both: nothing (the loop stops).
  EXPECT_EQ(detail::variants_to_widen(measured, plan, 20.0, 2, 0.03, {"sk_b"}), (Picks{{"swab/ck2", "ck2_a"}}));
  EXPECT_TRUE(detail::variants_to_widen(measured, plan, 20.0, 2, 0.03, {"sk_b", "ck2_a"}).empty());
  // No extern measured: the fastest variants, whatever their times.
  EXPECT_EQ(detail::variants_to_widen(measured, plan, 0, 2, 0, {}),
            (Picks{{"swab/sk", "sk_b"}, {"swab/ck2", "ck2_a"}}));
  // An extern far ahead: nothing to widen.
  EXPECT_TRUE(detail::variants_to_widen(measured, plan, 10.0, 2, 0.03, {}).empty());
  // One variant near the extern: ck2 alone trailing cuBLAS by 2% is widened around within 2.5%, not within 1.5%.
  const std::vector<std::pair<std::string, double>> behind{{"ck2_a", 20.4}, {"tile_a", 25.0}};
  EXPECT_EQ(detail::variants_to_widen(behind, plan, 20.0, 1, 0.025, {}), (Picks{{"swab/ck2", "ck2_a"}}));
  EXPECT_TRUE(detail::variants_to_widen(behind, plan, 20.0, 1, 0.015, {}).empty());
  // The efforts widen around a winner only (two variants near the extern cost more compile waits than they won;
  // the fastest one within 2% of it, 0.033 s more per problem for 2 more of 120 within 1%, on the H200 suite).
  EXPECT_EQ(effort_policy(Effort::kDefault).widen_variants, 1);
  EXPECT_EQ(effort_policy(Effort::kDefault).widen_near_extern, 0);
  EXPECT_EQ(effort_policy(Effort::kQuick).widen_variants, 1);
}

TEST(EffortPlan, NonePicksTheModelsTopWithoutMeasuring) {
  const Problem p = gemm(4096, 4096, 4096);
  auto choices = mixed_choices(6);
  auto order = rank(p, choices, kH100);
  EXPECT_FALSE(effort_policy(Effort::kNone).measure);
  ChoicePtr pick = detail::model_pick(choices, order, "cublas_default");
  ASSERT_TRUE(pick);
  EXPECT_EQ(pick, choices[order[0].index]);
  EXPECT_EQ(pick->kind(), ChoiceKind::kTemplate);
  // Nothing the model can judge: the reference (the library default).
  std::vector<ChoicePtr> externs{choices[6], choices[7]};
  EXPECT_EQ(detail::model_pick(externs, rank(p, externs, kH100), "cublas_default")->name(), "cublas_default");
}

TEST(EffortPlan, WidensWhenTheMeasuredBestIsAtTheEndOfTheKeptRanks) {
  EXPECT_FALSE(detail::should_widen(0, 12));
  EXPECT_FALSE(detail::should_widen(8, 12));
  EXPECT_TRUE(detail::should_widen(9, 12));   // the last quarter
  EXPECT_TRUE(detail::should_widen(11, 12));
  EXPECT_TRUE(detail::should_widen(3, 4));    // quick: the last one
  EXPECT_FALSE(detail::should_widen(2, 4));
  EXPECT_FALSE(detail::should_widen(-1, 12));  // an extern won: the model had nothing to say
}

TEST(EffortNames, ParseAndEnvironment) {
  for (auto e : {Effort::kNone, Effort::kQuick, Effort::kDefault, Effort::kExhaustive}) {
    auto parsed = parse_effort(effort_name(e));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, e);
  }
  auto bad = parse_effort("turbo");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'turbo'"), std::string::npos);
  setenv("KILN_TUNE_EFFORT", "quick", 1);
  EXPECT_EQ(*effort_from_env(), Effort::kQuick);
  setenv("KILN_TUNE_EFFORT", "fast", 1);
  auto env_bad = effort_from_env();
  ASSERT_FALSE(env_bad.ok());
  EXPECT_NE(env_bad.status().to_string().find("KILN_TUNE_EFFORT"), std::string::npos);
  unsetenv("KILN_TUNE_EFFORT");
  EXPECT_EQ(*effort_from_env(), Effort::kDefault);
  EXPECT_GT(effort_policy(Effort::kExhaustive).sample_per_template, effort_policy(Effort::kDefault).sample_per_template);
}

TEST(AdaptiveRepetitions, StopsWhenPreciseOrSeparatedFromTheLeader) {
  BenchmarkOptions o;  // min_reps 5, precision 0.5%, tie 2%
  // Too few runs: more.
  EXPECT_EQ(judge({10, 10, 10}, 0, 100, o), Verdict::kMore);
  // Tight samples: enough after one round.
  EXPECT_EQ(judge({10.00, 10.01, 9.99, 10.0, 10.02}, 0, 100, o), Verdict::kEnough);
  // Noisy samples near the leader: more.
  std::vector<double> noisy{10, 11, 9, 10.5, 9.5, 10.8, 9.2};
  EXPECT_EQ(judge(noisy, 10.1, 100, o), Verdict::kMore);
  // The same noise far above the leader: clearly slower (abandoned).
  EXPECT_EQ(judge(noisy, 7.0, 100, o), Verdict::kSlower);
  // Far below the leader: a clear new leader, enough.
  EXPECT_EQ(judge(noisy, 14.0, 100, o), Verdict::kEnough);
  // The count reached: enough whatever the noise.
  EXPECT_EQ(judge(noisy, 10.1, 7, o), Verdict::kEnough);
  // The interval contains the median and narrows with more samples.
  std::vector<double> many;
  for (int i = 0; i < 60; ++i) many.push_back(10 + (i % 7) * 0.1);
  const MedianInterval wide = median_interval(std::vector<double>(many.begin(), many.begin() + 10));
  const MedianInterval narrow = median_interval(many);
  EXPECT_LE(narrow.low, narrow.median);
  EXPECT_GE(narrow.high, narrow.median);
  EXPECT_LE(narrow.high - narrow.low, wide.high - wide.low);
}

// Two placements 10% apart, runs split evenly: the median of all runs sits where the clusters meet and moves with
// their tails (one slow run of the fast set moves it by 2%); the placement-balanced median is their mean and
// does not move.
TEST(PlacedMedian, IsTheMeanOfEachPlacementsMedianAndIgnoresWhereTheClustersMeet) {
  Samples s;
  for (int i = 0; i < 12; ++i) {
    s.us.push_back(i % 2 == 0 ? 40.0 + 0.01 * i : 44.0 + 0.01 * i);
    s.placement.push_back(static_cast<uint32_t>(i % 2));
  }
  const double pooled = summarize(s.us).median;
  const double placed = summarize(s).median;
  EXPECT_NEAR(placed, (40.05 + 44.06) / 2, 1e-9);
  Samples tail = s;
  tail.us[10] = 43.9;  // one slow run of the fast set
  EXPECT_GT(std::abs(summarize(tail.us).median - pooled) / pooled, 0.02);
  EXPECT_NEAR(summarize(tail).median, placed, 0.01);
  // Unequal counts per placement weigh each placement alike.
  Samples uneven = s;
  for (int i = 0; i < 20; ++i) {
    uneven.us.push_back(40.05);
    uneven.placement.push_back(0);
  }
  EXPECT_NEAR(summarize(uneven).median, placed, 0.01);
  EXPECT_LT(summarize(uneven.us).median, 40.1);
  // No placements (a worker's runs), or placements that do not match the runs: the plain median.
  Samples none;
  none.us = {3, 1, 2};
  EXPECT_EQ(summarize(none).median, 2);
  none.placement = {0, 1};
  EXPECT_EQ(placed_median(none.us, none.placement), 2);
  EXPECT_EQ(summarize(Samples{}).median, 0);
  // append keeps the placements aligned with the runs, a side without them counting as set 0.
  Samples a;
  a.us = {5, 6};
  Samples b;
  b.us = {7};
  b.placement = {2};
  a.append(b);
  EXPECT_EQ(a.placement, (std::vector<uint32_t>{0, 0, 2}));
  a.append(none);
  EXPECT_EQ(a.placement.size(), a.us.size());
}

TEST(WorkloadBudget, OrdersByGainPerSecondAndStopsWhenSpent) {
  double now = 100;
  TuneBudget budget(1.0, [&] { return now; });
  EXPECT_TRUE(budget.limited());
  std::vector<BudgetItem> items{{0, 10, 0.1}, {1, 1000, 0.1}, {2, 1000, 1.0}, {3, 10, 0.1}};
  EXPECT_EQ(TuneBudget::order(items), (std::vector<size_t>{1, 2, 0, 3}));
  EXPECT_DOUBLE_EQ(budget.expected_cost(0.15), 0.15);
  EXPECT_TRUE(budget.fits(0.15));
  now += 0.4;
  budget.spent(0.4);
  now += 0.4;
  budget.spent(0.4);
  EXPECT_DOUBLE_EQ(budget.expected_cost(0.15), 0.4);
  EXPECT_NEAR(budget.left_s(), 0.2, 1e-9);
  EXPECT_FALSE(budget.fits(budget.expected_cost(0.15)));
  TuneBudget unlimited(0, [&] { return now; });
  EXPECT_TRUE(unlimited.fits(1e9));
  // The roofline of a GEMM is its FLOPs at peak; of a norm its bytes at bandwidth.
  EXPECT_NEAR(roofline_us(gemm(4096, 4096, 4096), kH100), 2.0 * 4096 * 4096 * 4096 / 989e6, 1);
  EXPECT_GT(roofline_us(Problem::norm({.rows = 4096, .cols = 4096}), kH100), 19);
}

// The serving recipe (docs/python.md): a cache `kiln precompile --arch sm_90a` filled on a machine without a GPU
// must leave the default tune on any sm_90a part nothing to compile, widenings included. On an H200 (its
// measured bandwidth, its own family fit) the tune ranked templates precompile had left out, and it widened past
// the precompiled next ranks (measured as cached extras): the recipe's warm-up compiled 1-4 kernels (GPU test
// test_serving_recipe, 26 and 29 Nov).
TEST(EffortPlan, APrecompiledCacheLeavesTheDefaultTuneNothingToCompileOnEveryPartOfTheArch) {
  auto workload = load_workload(std::string(KILN_SOURCE_DIR) + "/examples/llama3-8b.json");
  ASSERT_TRUE(workload.ok()) << workload.status().to_string();
  std::vector<Problem> problems = workload->problems;
  GemmProblem recipe;  // python/tests/test_warmup.py's workload
  recipe.m = 16, recipe.n = 4096, recipe.k = 4096, recipe.b_layout = Layout::kColMajor;
  problems.push_back(Problem::gemm(recipe));
  auto ctx = choice_context_for_arch(Target{"sm_90a"});
  ASSERT_TRUE(ctx.ok());
  const EffortPolicy policy = effort_policy(Effort::kDefault);
  ctx->max_template_configs = policy.sample_per_template;
  DeviceInfo h200;  // as the driver reports an H200
  h200.cc_major = 9, h200.sm_count = 132, h200.memory_clock_khz = 3201000, h200.memory_bus_bits = 6144;
  h200.max_shared_per_sm = 233472;
  int checked = 0, widened = 0;
  for (const Problem& p : problems) {
    auto all = default_ops().choices(p, *ctx);
    ASSERT_TRUE(all.ok()) << p.describe();
    auto def = default_ops().find(p.op);
    ASSERT_TRUE(def.ok());
    auto pre = precompile_plan(default_ops(), p, *all, Effort::kDefault, DevicePeaks::parts_of("sm_90a"));
    ASSERT_TRUE(pre.ok());
    std::set<std::string> precompiled;
    for (const auto& c : *pre) {
      if (!c->kernels().empty()) precompiled.insert(c->name());
    }
    for (const DevicePeaks& peaks : {DevicePeaks::for_arch("sm_90a"), DevicePeaks::from_device(h200)}) {
      // The tune on the GPU: the cache holds the precompiled binaries (cached first among equal scores, and
      // measured whatever their rank), then every widening round around any variant it measured.
      const auto order = rank(p, *all, peaks, {}, precompiled);
      detail::TunePlan plan = detail::plan_choices(*all, order, (*def)->reference(p), keep_for(policy, p), {}, 0,
                                                   policy.diverse, policy.keep_top, policy.stream_k_pick);
      std::set<std::string> variants;
      for (const auto& c : plan.first) {
        if (c->kernels().empty()) continue;  // externs: nothing to compile
        EXPECT_TRUE(precompiled.count(c->name())) << p.describe() << " on " << peaks.hbm_gbps << " GB/s: "
                                                  << c->name() << " is measured first and not precompiled";
        ++checked;
        if (auto it = plan.structure.find(c->name()); it != plan.structure.end()) variants.insert(it->second);
      }
      std::vector<ChoicePtr> cached = plan.cached_extras;
      for (const auto& v : variants) {
        for (int round = 0; round < policy.max_widenings; ++round) {
          for (const auto& c : detail::widen_variant(plan.reserve, cached, plan, v, static_cast<size_t>(policy.widen))) {
            EXPECT_TRUE(precompiled.count(c->name())) << p.describe() << " on " << peaks.hbm_gbps << " GB/s: widening "
                                                      << v << " compiles " << c->name();
            ++widened;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 100);
  std::printf("%d choices measured first, %d widened beyond the cached extras, all precompiled\n", checked, widened);
}

// Norms and softmax keep more of the model's order than GEMMs at default effort (EffortPolicy::keep_rows): their
// choices are cheap to compile and to run, and the model tells a small problem's configurations apart poorly.
TEST(EffortPlan, RowOpsKeepMoreOfTheModelsOrderThanGemms) {
  const EffortPolicy policy = effort_policy(Effort::kDefault);
  const Problem norm = Problem::norm({.rows = 16, .cols = 4096});
  GemmProblem g;
  g.m = 16, g.n = 4096, g.k = 4096;
  EXPECT_EQ(keep_for(policy, norm), 32);
  EXPECT_EQ(keep_for(policy, Problem::softmax({.rows = 16, .cols = 128256})), 32);
  EXPECT_EQ(keep_for(policy, Problem::gemm(g)), policy.keep);
  EffortPolicy plain = policy;
  plain.keep_rows = 0;
  EXPECT_EQ(keep_for(plain, norm), policy.keep);
  EXPECT_EQ(keep_for(effort_policy(Effort::kQuick), norm), effort_policy(Effort::kQuick).keep);

  auto ctx = choice_context_for_arch(Target{"sm_90a"});
  ASSERT_TRUE(ctx.ok());
  ctx->max_template_configs = policy.sample_per_template;
  for (const Problem& p : {norm, Problem::gemm(g)}) {
    auto all = default_ops().choices(p, *ctx);
    ASSERT_TRUE(all.ok()) << p.describe();
    auto def = default_ops().find(p.op);
    ASSERT_TRUE(def.ok());
    const auto order = rank(p, *all, kH100);
    detail::TunePlan plan = detail::plan_choices(*all, order, (*def)->reference(p), keep_for(policy, p), {}, 0,
                                                 policy.diverse, policy.keep_top, policy.stream_k_pick);
    int modelled = 0;
    for (const auto& r : order) modelled += r.estimate.known ? 1 : 0;
    ASSERT_GT(modelled, 32) << p.describe();
    // The kept ranks (the reference counts among them when the model ranks it).
    EXPECT_GE(plan.kept_ranked, keep_for(policy, p)) << p.describe();
    EXPECT_LE(plan.kept_ranked, keep_for(policy, p) + 1) << p.describe();
    auto pre = precompile_plan(default_ops(), p, *all, Effort::kDefault, {kH100});
    ASSERT_TRUE(pre.ok());
    EXPECT_GE(pre->size(), static_cast<size_t>(keep_for(policy, p))) << p.describe();
  }
}

TEST(EffortPlan, AWideningTakesTheNextRanksOfTheVariantCachedOrNot) {
  const Problem p = gemm(16, 4096, 4096);
  // Six choices of one variant (ranks 0-5 by tile size), and one of another.
  std::vector<ChoicePtr> choices;
  for (int i = 0; i < 6; ++i) {
    choices.push_back(std::make_shared<FakeChoice>("v" + std::to_string(i), ChoiceKind::kTemplate,
                                                   wgmma(64, 16 << (i % 4), 1, 4 + i, 1, true)));
  }
  choices.push_back(std::make_shared<FakeChoice>("other", ChoiceKind::kTemplate, wgmma(128, 128, 2, 4, 1, false, true)));
  const auto order = rank(p, choices, kH100, {}, {"v2", "v3"});
  detail::TunePlan plan = detail::plan_choices(choices, order, "cublas_default", 1, {}, 0, true);
  ASSERT_FALSE(plan.first.empty());
  std::vector<ChoicePtr> cached = plan.cached_extras;
  std::vector<std::string> cached_names;
  for (const auto& c : cached) cached_names.push_back(c->name());
  EXPECT_EQ(std::set<std::string>(cached_names.begin(), cached_names.end()), (std::set<std::string>{"v2", "v3"}));
  const std::string variant = plan.structure.at("v0");
  ASSERT_EQ(plan.structure.at("v5"), variant);
  // The first widening of v's variant: its next two ranks. Those cached were measured already: nothing of
  // theirs compiles, and the reserve keeps what lies beyond.
  std::vector<std::string> ranked;  // v's variant in model order, past the first
  for (const auto& r : order) {
    const std::string n = choices[r.index]->name();
    if (plan.structure.count(n) && plan.structure.at(n) == variant &&
        std::none_of(plan.first.begin(), plan.first.end(), [&](const ChoicePtr& c) { return c->name() == n && !r.cached; })) {
      ranked.push_back(n);
    }
  }
  ASSERT_GE(ranked.size(), 4u);
  const size_t reserve_before = plan.reserve.size();
  auto batch = detail::widen_variant(plan.reserve, cached, plan, variant, 2);
  size_t compiled = 0;
  for (const auto& n : {ranked[0], ranked[1]}) compiled += (n == "v2" || n == "v3") ? 0 : 1;
  EXPECT_EQ(batch.size(), compiled);
  EXPECT_EQ(plan.reserve.size(), reserve_before - compiled);
  // Taken cached ones are used up: the next widening goes on past them.
  auto next = detail::widen_variant(plan.reserve, cached, plan, variant, 2);
  std::set<std::string> all_taken;
  for (const auto& c : batch) all_taken.insert(c->name());
  for (const auto& c : next) all_taken.insert(c->name());
  std::set<std::string> cached_left{"v2", "v3"};
  for (size_t i = 0; i < 4; ++i) {
    if (ranked[i] != "v2" && ranked[i] != "v3") {
      EXPECT_TRUE(all_taken.count(ranked[i])) << ranked[i];
    }
    cached_left.erase(ranked[i]);
  }
  EXPECT_EQ(all_taken.size(), 4 - (2 - cached_left.size()));
  std::set<std::string> left;
  for (const auto& c : cached) left.insert(c->name());
  EXPECT_EQ(left, cached_left);
}

}  // namespace
}  // namespace kiln::runtime
