// The public GEMM suite without a GPU: its shapes (count, spread, uniqueness), the candidate heuristic on an
// sm_90a device (valid configurations only, at most the cap, swap-AB for decode, no superseded family unless
// asked) and on an sm_80 one, the shape filter, and the report (summary thresholds, table, plot).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "kiln/templates/registry.h"
#include "suite_candidates.h"
#include "suite_report.h"
#include "suite_shapes.h"

namespace kiln::bench::suite {
namespace {

using templates::DType;
using templates::Layout;

templates::DeviceLimits limits(const char* arch) {
  auto l = templates::DeviceLimits::for_target(Target{arch});
  EXPECT_TRUE(l.ok());
  return *l;
}

TEST(GemmSuite, ShapesSpreadOverModelsSizesDtypesAndLayouts) {
  const auto shapes = suite_shapes();
  EXPECT_GE(shapes.size(), 60u);
  std::set<std::string> ids, models;
  std::set<int64_t> ms;
  std::set<DType> dtypes;
  std::set<Layout> layouts;
  for (const auto& s : shapes) {
    EXPECT_TRUE(ids.insert(s.id()).second) << s.id();
    models.insert(s.model.substr(0, s.model.find(' ')));
    ms.insert(s.m);
    dtypes.insert(s.dtype);
    layouts.insert(s.layout_b);
    EXPECT_EQ(s.k % 8, 0) << s.id() << ": TMA rows must be 16-byte aligned";
    EXPECT_LE(s.flops(), 4.1e12) << s.id() << ": keeps the suite inside its time budget";
  }
  for (const char* m : {"llama3-8b", "llama3-70b", "qwen2.5-7b", "qwen2.5-72b", "mixtral-8x7b", "deepseek-v3"}) {
    EXPECT_TRUE(models.contains(m)) << m;
  }
  for (int64_t m : {1, 3, 16, 64, 77, 333, 1000, 4096, 8192}) EXPECT_TRUE(ms.contains(m)) << m;
  EXPECT_EQ(dtypes.size(), 2u);
  EXPECT_EQ(layouts.size(), 2u);
  bool square = false;
  for (const auto& s : shapes) square |= s.m == 4096 && s.n == 4096 && s.k == 4096 && s.dtype == DType::kBF16;
  EXPECT_TRUE(square);
}

TEST(GemmSuite, FilterTermsSelectShapes) {
  const auto all = suite_shapes();
  for (const auto& s : filter_shapes(all, "m<=64")) EXPECT_LE(s.m, 64);
  const auto llama = filter_shapes(all, "llama3-8b");
  EXPECT_FALSE(llama.empty());
  for (const auto& s : llama) EXPECT_EQ(s.model, "llama3-8b");
  EXPECT_EQ(filter_shapes(all, "max=3").size(), 3u);
  EXPECT_EQ(filter_shapes(all, "").size(), all.size());
  EXPECT_TRUE(filter_shapes(all, "no-such-model").empty());
  EXPECT_EQ(filter_shapes(all, "m4096_n4096_k4096_bf16_c").size(), 1u);
}

TEST(GemmSuite, CandidatesOnHopperAreValidCappedAndSwapForDecode) {
  const auto l = limits("sm_90a");
  for (const auto& s : suite_shapes()) {
    const auto fams = candidates_for(s, l, Target{"sm_90a"}, {}, 40);  // bench_gemm_suite's default cap
    ASSERT_EQ(fams.size(), 1u) << s.id() << ": gemm_mma_sm80 is superseded on sm_90a";
    const auto& f = fams[0];
    EXPECT_EQ(f.family, "gemm_wgmma_sm90");
    EXPECT_EQ(f.arch, "sm_90a");
    EXPECT_GE(f.configs.size(), 3u) << s.id();
    EXPECT_LE(f.configs.size(), 40u) << s.id();
    bool swap = false, staged = false;
    std::set<std::string> names;
    for (const auto& p : f.configs) {
      EXPECT_TRUE(f.tmpl->check(p, l).ok()) << s.id() << " " << f.tmpl->check(p, l).to_string();
      EXPECT_TRUE(f.tmpl->check_problem(p, templates::Shape{s.m, s.n, s.k}).ok()) << s.id();
      auto name = f.tmpl->config_name(p);
      ASSERT_TRUE(name.ok());
      EXPECT_TRUE(names.insert(*name).second) << *name;
      swap |= variant_of(f.family, p) == "swap_ab";
      staged |= templates::get_enum(p, "epi") == "smem";
      if (templates::get_bool(p, "swap_ab")) {
        // M in at most 7 column tiles (1 up to M = 128), each round_up(M / tiles, 8) wide: less than 8 rows of
        // padding per tile.
        const int64_t bn = templates::get_int(p, "bn"), tiles = (s.m + bn - 1) / bn;
        EXPECT_LE(tiles, s.m <= 128 ? 1 : 7) << *name << ": M in few column tiles";
        EXPECT_LT(tiles * bn - s.m, 8 * tiles) << *name << ": bn fits M";
      }
    }
    if (s.m <= 64) { EXPECT_TRUE(swap) << s.id() << ": decode shapes get swap-AB tiles"; }
    if (s.m >= 1000) { EXPECT_FALSE(swap) << s.id(); }
    // The staged epilogue (epi=smem) is measured beside the direct one wherever the tiles are large.
    if (s.m > 64) { EXPECT_TRUE(staged) << s.id(); }
  }
}

TEST(GemmSuite, SupersededFamilyOnlyWhenAskedAndAmpereKeepsIt) {
  const SuiteShape s{"llama3-8b", "o", 16, 4096, 4096, DType::kBF16, Layout::kColMajor};
  auto names = [](const std::vector<FamilyCandidates>& fams) {
    std::set<std::string> out;
    for (const auto& f : fams) out.insert(f.family);
    return out;
  };
  EXPECT_EQ(names(candidates_for(s, limits("sm_90a"), Target{"sm_90a"}, {"gemm_mma_sm80"}, 12)),
            (std::set<std::string>{"gemm_mma_sm80", "gemm_wgmma_sm90"}));
  EXPECT_EQ(names(candidates_for(s, limits("sm_90a"), Target{"sm_90a"}, {"all"}, 12)),
            (std::set<std::string>{"gemm_mma_sm80", "gemm_wgmma_sm90"}));
  const auto ampere = candidates_for(s, limits("sm_80"), Target{"sm_80"}, {}, 5);
  ASSERT_EQ(names(ampere), (std::set<std::string>{"gemm_mma_sm80"}));
  EXPECT_EQ(ampere[0].arch, "sm_80");
  EXPECT_LE(ampere[0].configs.size(), 5u);
  for (const auto& f : candidates_for(s, limits("sm_90a"), Target{"sm_90a"}, {"gemm_mma_sm80"}, 12)) {
    if (f.family == "gemm_mma_sm80") {
      EXPECT_EQ(f.arch, "sm_90") << "the mma.sync family compiles for the plain arch";
    }
  }
}

nlohmann::json record(int64_t m, int64_t n, int64_t k, double speedup, double vs_cublas = 1) {
  auto r = shape_json({"test", "layer", m, n, k, DType::kBF16, Layout::kColMajor});
  r["cublas_us"] = 10.0;
  r["cublaslt_us"] = 11.0;
  r["kiln_template_us"] = 10.0 / speedup;
  r["kiln_template_config"] = "gemm_wgmma_test";
  r["best_reference_us"] = 10.0;
  r["speedup_vs_best_reference"] = speedup;
  r["speedup_vs_cublas"] = vs_cublas;
  return r;
}

TEST(GemmSuite, SummaryCountsAgainstTheAcceptanceThresholds) {
  std::vector<nlohmann::json> rs = {record(1, 4096, 4096, 1.2), record(16, 4096, 4096, 1.0),
                                    record(4096, 4096, 4096, 0.96, 0.96), record(77, 4096, 4096, 0.5)};
  auto failed = shape_json({"test", "x", 3, 8, 8, DType::kF16, Layout::kRowMajor});
  failed["error"] = "reference (cuBLAS): boom";
  rs.push_back(failed);
  const Summary s = summarize(rs);
  EXPECT_EQ(s.shapes, 5);
  EXPECT_EQ(s.measured, 4);
  EXPECT_EQ(s.faster_105, 1);
  EXPECT_EQ(s.within_105, 3);
  EXPECT_DOUBLE_EQ(s.square_vs_cublas, 0.96);
  const std::string t = summary_text(s);
  EXPECT_NE(t.find("1 of 5 (20%; target >= 25%: NOT met)"), std::string::npos) << t;
  EXPECT_NE(t.find("3 of 5 (60%; target >= 80%: NOT met)"), std::string::npos) << t;
  EXPECT_NE(t.find("0.960x of cuBLAS (target >= 0.95: met)"), std::string::npos) << t;
  EXPECT_EQ(s.measured_no_pdl, 0);
  EXPECT_EQ(t.find("without programmatic"), std::string::npos) << "no line when nothing was measured without it";

  // Without programmatic launch the first shape runs 1.00x (10 us against the reference's 10) and the third
  // 0.9x: the summary counts them apart from the launched figures.
  rs[0]["kiln_template_no_pdl_us"] = 10.0;
  rs[2]["kiln_template_no_pdl_us"] = 10.0 / 0.9;
  const Summary p = summarize(rs);
  EXPECT_EQ(p.faster_105, 1);
  EXPECT_EQ(p.measured_no_pdl, 2);
  EXPECT_EQ(p.faster_105_no_pdl, 0);
  EXPECT_EQ(p.within_105_no_pdl, 1);
  EXPECT_NE(summary_text(p).find("without programmatic dependent launch (2 shapes): >= 1.05x on 0 (0%), within 1.05x "
                                 "on 1 (20%)"),
            std::string::npos)
      << summary_text(p);
  EXPECT_NE(markdown(rs, {{"device", "test"}}).find("| 8.3 | 10.0 | `gemm_wgmma_test` | **1.20x** |"),
            std::string::npos)
      << markdown(rs, {{"device", "test"}});

  const std::string md = markdown(rs, {{"device", "test"}});
  EXPECT_NE(md.find("| 4096 | 4096 | 4096 | bf16 | col |"), std::string::npos) << md;
  EXPECT_NE(md.find("**1.20x**"), std::string::npos);
  EXPECT_NE(md.find("error: \"reference (cuBLAS): boom\""), std::string::npos);
  const std::string plot = svg(rs);
  EXPECT_EQ(plot.rfind("<svg", 0), 0u);
  EXPECT_NE(plot.find("</svg>"), std::string::npos);
  EXPECT_EQ(std::count(plot.begin(), plot.end(), '\n') > 4, true);
  size_t bars = 0;
  for (size_t at = 0; (at = plot.find("<rect x=", at)) != std::string::npos; ++at) ++bars;
  EXPECT_EQ(bars, 4u) << "one bar per measured shape";
}

}  // namespace
}  // namespace kiln::bench::suite
