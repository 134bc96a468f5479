// GEMM templates on the GPU: every family over a sample of configurations covering every tunable value,
// problems covering each dtype, layout, epilogue op and output dtype, split-K partials and the split-K
// subgraph, with shapes M = 1, 7, 17, 4095, K = 40 and N not a multiple of 8, each checked against a float64
// CPU reference with the output poisoned first. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>

#include "gemm_harness.h"
#include "kiln_test.h"

namespace kiln::testing {
namespace {

using templates::DeviceLimits;
using templates::Grid;

EpilogueSpec spec(std::string_view ops, DType out) {
  auto s = templates::parse_epilogue(ops, out);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return *s;
}

// Problem variants: together they cover each input dtype, each layout pair, each epilogue op and each
// output dtype, partials, and (gemm_mma_sm80) each load width.
struct Variant {
  DType in;
  Layout la, lb;
  EpilogueSpec ep;
  bool partials;
  int align;  // gemm_mma_sm80 only
};

std::vector<Variant> variants() {
  const Layout R = Layout::kRowMajor, C = Layout::kColMajor;
  return {
      {DType::kBF16, R, R, spec("bias+gelu", DType::kBF16), false, 8},
      {DType::kBF16, R, C, spec("", DType::kF32), false, 8},
      {DType::kBF16, C, R, spec("scale+bias+relu", DType::kBF16), false, 4},
      {DType::kF16, C, C, spec("bias+silu+residual", DType::kF16), false, 8},
      {DType::kF16, R, R, spec("residual", DType::kF16), false, 1},
      {DType::kBF16, C, C, spec("silu", DType::kF32), false, 2},
      {DType::kBF16, R, C, spec("", DType::kBF16), true, 8},
      {DType::kF16, C, R, spec("gelu+scale", DType::kBF16), true, 1},
  };
}

// M = 1, 7, 17, 4095; K = 40 and other K tails; N odd (129) and N = 200 (not a multiple of 64).
std::vector<std::array<int64_t, 3>> shapes() {
  return {{1, 256, 256}, {7, 136, 40}, {17, 200, 264}, {4095, 72, 136}, {130, 129, 72}, {256, 384, 1000}};
}

Params problem_params(const Variant& v, bool with_align) {
  Params p = templates::gemm_problem_params(v.in, v.la, v.lb, v.ep, v.partials);
  if (with_align) p.emplace("align", templates::Value::integer(v.align));
  return p;
}

struct FamilyRun {
  int cases = 0, skipped = 0, failed = 0;
};

// Samples configurations of `name` for each variant (every tunable value covered across the samples),
// compiles them all, and runs each on every shape it accepts.
void check_family(const std::string& name, const std::string& arch, size_t per_variant) {
  KILN_ASSERT_OK_AND_ASSIGN(TemplatePtr t, templates::find_template(name));
  KILN_ASSERT_OK_AND_ASSIGN(DeviceInfo info, device_info(0));
  if (info.cc_major < t->def().min_cc / 10) GTEST_SKIP() << name << " needs sm_" << t->def().min_cc;
  const Target target{arch};
  const DeviceLimits limits = DeviceLimits::from_device(info, target);
  const bool sm80 = name == "gemm_mma_sm80";

  std::vector<Variant> vs = variants();
  std::vector<std::pair<TemplatePtr, Params>> configs;
  std::vector<size_t> variant_of;
  for (size_t vi = 0; vi < vs.size(); ++vi) {
    KILN_ASSERT_OK_AND_ASSIGN(Grid grid, Grid::create(t, problem_params(vs[vi], sm80)));
    for (Params& p : templates::sample(grid, limits, per_variant, /*seed=*/vi)) {
      configs.emplace_back(t, std::move(p));
      variant_of.push_back(vi);
    }
  }
  std::vector<Target> targets(configs.size(), target);
  auto compiled = compile_all(configs, targets);

  FamilyRun run;
  std::map<std::pair<size_t, size_t>, GemmData> data;  // (variant, shape) -> host data and reference
  for (size_t i = 0; i < compiled.size(); ++i) {
    if (!compiled[i].ok()) {
      ADD_FAILURE() << compiled[i].status().to_string_with_detail();
      continue;
    }
    const CompiledGemm& c = *compiled[i];
    // No spills: local memory would be a slow path (and a sign of a runtime-indexed register array).
    EXPECT_EQ(c.attr.local_bytes, 0) << c.rendered.config_name;
    const Variant& v = vs[variant_of[i]];
    double worst = 0;
    int ran = 0;
    auto sh = shapes();
    for (size_t si = 0; si < sh.size(); ++si) {
      GemmProblem p{sh[si][0], sh[si][1], sh[si][2], v.in, v.la, v.lb, v.ep, v.partials ? 3 : 1};
      Shape s{p.m, p.n, p.k, 1, 1};
      if (v.partials) s.splits = static_cast<int>((p.k + k_per_split(p.k, 3) - 1) / k_per_split(p.k, 3));
      if (!t->check_problem(c.rendered.params, s).ok()) {
        ++run.skipped;
        continue;
      }
      auto key = std::make_pair(variant_of[i], si);
      if (!data.contains(key)) data.emplace(key, make_gemm_data(p, 1000 * variant_of[i] + si));
      const GemmData& d = data.at(key);
      auto dev = upload_gemm(p, d);
      KILN_ASSERT_OK(dev);
      auto err = run_and_check(c, p, d, *dev);
      ++run.cases;
      ++ran;
      const double tol = v.partials ? 1e-5 : gemm_tolerance(v.ep.out);
      if (!err.ok()) {
        ++run.failed;
        ADD_FAILURE() << c.rendered.config_name << " on " << p.str() << ": " << err.status().to_string_with_detail();
        KILN_ASSERT_OK(ensure_context(0));  // a fault poisons the context: stop here
        continue;
      }
      if (!(*err <= tol)) {
        ++run.failed;
        ADD_FAILURE() << c.rendered.config_name << " on " << p.str() << ": relative error " << *err << " > " << tol;
      }
      worst = std::max(worst, *err);
    }
    std::printf("  %-72s regs %3d  cases %d  worst err %.2e\n", c.rendered.config_name.c_str(), c.attr.registers, ran,
                worst);
  }
  std::printf("%s: %zu configurations, %d cases run, %d skipped (shape not served), %d failed\n", name.c_str(),
              configs.size(), run.cases, run.skipped, run.failed);
  EXPECT_GT(run.cases, static_cast<int>(configs.size()));
}

TEST(GemmGpu, MmaSm80Sweep) {
  KILN_REQUIRE_GPU();
  KILN_ASSERT_OK_AND_ASSIGN(DeviceInfo info, device_info(0));
  check_family("gemm_mma_sm80", info.arch(), 5);
}

TEST(GemmGpu, WgmmaSm90Sweep) {
  KILN_REQUIRE_GPU();
  KILN_ASSERT_OK_AND_ASSIGN(DeviceInfo info, device_info(0));
  if (info.cc_major != 9) GTEST_SKIP() << "wgmma needs a Hopper GPU (sm_90a)";
  check_family("gemm_wgmma_sm90", "sm_90a", 5);
}

// The split-K subgraph (partials GEMM + splitk_reduce with the epilogue) for both families, on decode shapes.
TEST(GemmGpu, SplitKSubgraphDecode) {
  KILN_REQUIRE_GPU();
  KILN_ASSERT_OK_AND_ASSIGN(DeviceInfo info, device_info(0));
  const EpilogueSpec ep = spec("bias+gelu", DType::kBF16);
  struct Case {
    std::string tmpl, arch;
    Params tunables;
  };
  using templates::Value;
  std::vector<Case> cases;
  cases.push_back({"gemm_mma_sm80", info.arch(),
                   {{"bm", Value::integer(16)}, {"bn", Value::integer(64)}, {"bk", Value::integer(64)},
                    {"warps_m", Value::integer(1)}, {"warps_n", Value::integer(4)}, {"stages", Value::integer(4)},
                    {"group_m", Value::integer(1)}, {"align", Value::integer(8)}}});
  if (info.cc_major == 9) {
    cases.push_back({"gemm_wgmma_sm90", "sm_90a",
                     {{"bm", Value::integer(64)}, {"bn", Value::integer(128)}, {"consumers", Value::integer(1)},
                      {"stages", Value::integer(6)}, {"group_m", Value::integer(1)},
                      {"persistent", Value::boolean(false)}, {"cluster_k", Value::integer(1)},
                      {"blocks_per_sm", Value::integer(1)}, {"swap_ab", Value::boolean(false)}}});
  }
  KILN_ASSERT_OK_AND_ASSIGN(TemplatePtr reduce_t, templates::find_template("splitk_reduce"));
  for (const Case& c : cases) {
    KILN_ASSERT_OK_AND_ASSIGN(TemplatePtr t, templates::find_template(c.tmpl));
    for (int64_t m : {1, 16}) {
      GemmProblem p{m, 4096, 4096, DType::kBF16, Layout::kRowMajor, Layout::kColMajor, ep, 1};
      Params gp = templates::gemm_problem_params(p.in, p.la, p.lb, ep, false);
      for (const auto& [k, v] : c.tunables) gp.insert_or_assign(k, v);
      Params rp{{"threads", Value::integer(256)}, {"vec", Value::integer(4)}};
      KILN_ASSERT_OK_AND_ASSIGN(auto graph, templates::make_splitk_gemm(t, gp, rp, ep, Shape{p.m, p.n, p.k}, 4));
      ASSERT_EQ(graph.steps.size(), 2u);
      std::vector<std::pair<TemplatePtr, Result<Rendered>>> steps;
      steps.emplace_back(t, graph.steps[0].kernel);
      steps.emplace_back(reduce_t, graph.steps[1].kernel);
      auto compiled = compile_rendered(steps, {Target{c.arch}, Target{info.arch()}});
      KILN_ASSERT_OK(compiled[0]);
      KILN_ASSERT_OK(compiled[1]);
      const GemmData d = make_gemm_data(p, 77 + m);
      KILN_ASSERT_OK_AND_ASSIGN(GemmDevice g, upload_gemm(p, d));
      KILN_ASSERT_OK_AND_ASSIGN(DeviceBuffer ws, DeviceBuffer::allocate(graph.workspace_bytes));
      KILN_ASSERT_OK(poison(g.d));
      KILN_ASSERT_OK(poison(ws));
      GemmArgs args = gemm_args(p, g);
      KILN_ASSERT_OK(templates::run(graph, {compiled[0]->kernel.get(), compiled[1]->kernel.get()}, args, ws.ptr(), nullptr));
      KILN_ASSERT_OK_AND_ASSIGN(const DriverApi* api, driver());
      ASSERT_EQ(api->cuCtxSynchronize(), CUDA_SUCCESS);
      std::vector<uint8_t> bytes(static_cast<size_t>(p.m * p.n) * 2);
      KILN_ASSERT_OK(g.d.copy_to_host(bytes.data(), bytes.size()));
      const double err = rel_norm_error(to_doubles(DType::kBF16, bytes, p.m * p.n), p.n, d.out, p.m, p.n);
      std::printf("  %-60s M=%-3lld err %.2e\n", graph.name.c_str(), static_cast<long long>(m), err);
      EXPECT_LE(err, 1e-2) << graph.name << " M=" << m;
    }
  }
}

// Decode shapes with split-K inside one kernel: a cluster of blocks per tile reducing over distributed
// shared memory (gemm_wgmma_sm90, cluster_k > 1), fused bias + gelu.
TEST(GemmGpu, ClusterSplitKDecode) {
  KILN_REQUIRE_GPU();
  KILN_ASSERT_OK_AND_ASSIGN(DeviceInfo info, device_info(0));
  if (info.cc_major != 9) GTEST_SKIP() << "wgmma needs a Hopper GPU (sm_90a)";
  KILN_ASSERT_OK_AND_ASSIGN(TemplatePtr t, templates::find_template("gemm_wgmma_sm90"));
  using templates::Value;
  const EpilogueSpec ep = spec("bias+gelu", DType::kBF16);
  struct Case {
    int64_t m, n, k;
    int bm, bn, consumers, stages, cluster_k;
    Layout lb;
  };
  const std::vector<Case> cases = {{1, 4096, 4096, 64, 128, 1, 8, 4, Layout::kColMajor},
                                   {16, 4096, 4096, 64, 128, 1, 4, 2, Layout::kColMajor},
                                   {17, 520, 1000, 64, 64, 1, 8, 8, Layout::kRowMajor},   // K tail, 16 K blocks over 8
                                   {64, 1024, 136, 128, 64, 2, 4, 4, Layout::kColMajor}};  // a block with no K block
  std::vector<std::pair<TemplatePtr, Params>> cfgs;
  for (const Case& c : cases) {
    Params p = templates::gemm_problem_params(DType::kBF16, Layout::kRowMajor, c.lb, ep, false);
    for (auto [k, v] : std::initializer_list<std::pair<const char*, Value>>{
             {"bm", Value::integer(c.bm)}, {"bn", Value::integer(c.bn)}, {"consumers", Value::integer(c.consumers)},
             {"stages", Value::integer(c.stages)}, {"group_m", Value::integer(1)},
             {"persistent", Value::boolean(false)}, {"cluster_k", Value::integer(c.cluster_k)},
             {"blocks_per_sm", Value::integer(c.consumers == 1 && c.bm * c.bn <= 64 * 128 && c.cluster_k <= 4 ? 2 : 1)},
             {"swap_ab", Value::boolean(false)}})
      p.insert_or_assign(k, v);
    cfgs.emplace_back(t, std::move(p));
  }
  auto compiled = compile_all(cfgs, std::vector<Target>(cfgs.size(), Target{"sm_90a"}));
  for (size_t i = 0; i < cases.size(); ++i) {
    KILN_ASSERT_OK(compiled[i]);
    const Case& c = cases[i];
    GemmProblem p{c.m, c.n, c.k, DType::kBF16, Layout::kRowMajor, c.lb, ep, 1};
    const GemmData d = make_gemm_data(p, 300 + i);
    KILN_ASSERT_OK_AND_ASSIGN(GemmDevice g, upload_gemm(p, d));
    auto err = run_and_check(*compiled[i], p, d, g);
    KILN_ASSERT_OK(err);
    std::printf("  %-60s %s err %.2e\n", compiled[i]->rendered.config_name.c_str(), p.str().c_str(), *err);
    EXPECT_LE(*err, 1e-2) << compiled[i]->rendered.config_name;
    EXPECT_EQ(compiled[i]->attr.local_bytes, 0);
  }
}

// Swap-AB (gemm_wgmma_sm90, swap_ab): D^T = B^T . A^T with N on wgmma's 64-row side, stored transposed back.
// Decode and odd shapes (M = 1, 3, 17, 64, 77, 200; N not a multiple of the tile; K tails), both B layouts,
// epilogues that index D's row and column (bias, residual), fp16 and bf16, the cluster split of K and split-K
// partials, each against the float64 reference with the output poisoned first.
TEST(GemmGpu, SwapAbDecode) {
  KILN_REQUIRE_GPU();
  KILN_ASSERT_OK_AND_ASSIGN(DeviceInfo info, device_info(0));
  if (info.cc_major != 9) GTEST_SKIP() << "wgmma needs a Hopper GPU (sm_90a)";
  KILN_ASSERT_OK_AND_ASSIGN(TemplatePtr t, templates::find_template("gemm_wgmma_sm90"));
  using templates::Value;
  const Layout R = Layout::kRowMajor, C = Layout::kColMajor;
  struct Case {
    int64_t m, n, k;
    DType in;
    Layout lb;
    const char* ep;
    int bm, bn, consumers, stages, cluster_k, blocks;
    int splits;
  };
  const std::vector<Case> cases = {
      {1, 4096, 4096, DType::kBF16, C, "bias+gelu", 128, 8, 1, 8, 2, 1, 1},
      {3, 4100, 1000, DType::kBF16, C, "residual", 128, 8, 1, 8, 4, 1, 1},  // TMA needs ldb = N % 8 == 0 for row-major B
      {17, 520, 264, DType::kF16, C, "bias+silu+residual", 64, 24, 1, 6, 1, 2, 1},
      {64, 1000, 4096, DType::kBF16, R, "scale+bias+relu", 128, 64, 1, 8, 2, 1, 1},
      {77, 6144, 136, DType::kF16, C, "", 128, 80, 1, 6, 1, 1, 1},
      {200, 392, 1000, DType::kBF16, C, "bias", 128, 200, 2, 4, 1, 1, 1},
      {16, 4096, 4096, DType::kBF16, C, "", 128, 16, 1, 8, 1, 1, 4},  // split-K partials, transposed back
  };
  std::vector<std::pair<TemplatePtr, Params>> cfgs;
  for (const Case& c : cases) {
    Params p = templates::gemm_problem_params(c.in, R, c.lb, spec(c.ep, c.in), c.splits > 1);
    for (auto [k, v] : std::initializer_list<std::pair<const char*, Value>>{
             {"bm", Value::integer(c.bm)}, {"bn", Value::integer(c.bn)}, {"consumers", Value::integer(c.consumers)},
             {"stages", Value::integer(c.stages)}, {"group_m", Value::integer(1)},
             {"persistent", Value::boolean(false)}, {"cluster_k", Value::integer(c.cluster_k)},
             {"blocks_per_sm", Value::integer(c.blocks)}, {"swap_ab", Value::boolean(true)}})
      p.insert_or_assign(k, v);
    KILN_ASSERT_OK(t->check(p, DeviceLimits::from_device(info, Target{"sm_90a"})));
    cfgs.emplace_back(t, std::move(p));
  }
  auto compiled = compile_all(cfgs, std::vector<Target>(cfgs.size(), Target{"sm_90a"}));
  for (size_t i = 0; i < cases.size(); ++i) {
    KILN_ASSERT_OK(compiled[i]);
    const Case& c = cases[i];
    GemmProblem p{c.m, c.n, c.k, c.in, R, c.lb, spec(c.ep, c.in), c.splits};
    const GemmData d = make_gemm_data(p, 500 + i);
    KILN_ASSERT_OK_AND_ASSIGN(GemmDevice g, upload_gemm(p, d));
    auto err = run_and_check(*compiled[i], p, d, g);
    KILN_ASSERT_OK(err);
    const double tol = c.splits > 1 ? 1e-5 : gemm_tolerance(p.ep.out);
    std::printf("  %-64s %s regs %d err %.2e\n", compiled[i]->rendered.config_name.c_str(), p.str().c_str(),
                compiled[i]->attr.registers, *err);
    EXPECT_LE(*err, tol) << compiled[i]->rendered.config_name << " on " << p.str();
    EXPECT_EQ(compiled[i]->attr.local_bytes, 0) << compiled[i]->rendered.config_name;
  }
}

using TileField = std::pair<const char*, templates::Value>;

// A gemm_wgmma_sm90 configuration for problem `p`: the tunables a test leaves alone at their plain values (group_m
// 8, not persistent, no cluster split, one block per SM, no swap, the direct epilogue), then the test's own.
Params wgmma_config(const GemmProblem& p, std::initializer_list<TileField> fields) {
  using templates::Value;
  Params out = templates::gemm_problem_params(p.in, p.la, p.lb, p.ep, p.splits > 1);
  for (auto [k, v] : std::initializer_list<TileField>{
           {"group_m", Value::integer(8)}, {"persistent", Value::boolean(false)}, {"cluster_k", Value::integer(1)},
           {"blocks_per_sm", Value::integer(1)}, {"swap_ab", Value::boolean(false)},
           {"epi", Value::enumeration("direct")}})
    out.insert_or_assign(k, v);
  for (auto [k, v] : fields) out.insert_or_assign(k, v);
  return out;
}

// One configuration to check, on the data of `seed` (the configurations of one case share it).
struct WgmmaCheck {
  GemmProblem problem;
  Params params;
  uint64_t seed;
  int flags = 0;  // KilnGemmArgs::flags
};

// Compiles every configuration for sm_90a (each must pass the device's constraints), then runs each `runs` times
// against the float64 reference with the output poisoned first: within the output dtype's tolerance (1e-5 for
// split-K partials), the same error every run (a fixed sum order), and nothing in local memory.
// With runs > 1 every configuration runs again on the same data and must give the same bits. Stream-K ones run
// first with their flags in the poisoned workspace (lowered by the launch's memset), then with flags of their own
// that were lowered once before the second run only: each run must leave them lowered for the next.
void check_wgmma(const DeviceInfo& info, const std::vector<WgmmaCheck>& checks, int runs = 1) {
  KILN_ASSERT_OK_AND_ASSIGN(TemplatePtr t, templates::find_template("gemm_wgmma_sm90"));
  std::vector<std::pair<TemplatePtr, Params>> cfgs;
  for (const WgmmaCheck& c : checks) {
    KILN_ASSERT_OK(t->check(c.params, DeviceLimits::from_device(info, Target{"sm_90a"})));
    cfgs.emplace_back(t, c.params);
  }
  auto compiled = compile_all(cfgs, std::vector<Target>(cfgs.size(), Target{"sm_90a"}));
  for (size_t i = 0; i < checks.size(); ++i) {
    KILN_ASSERT_OK(compiled[i]);
    const GemmProblem& p = checks[i].problem;
    const GemmData d = make_gemm_data(p, checks[i].seed);
    KILN_ASSERT_OK_AND_ASSIGN(GemmDevice g, upload_gemm(p, d));
    const std::string& name = compiled[i]->rendered.config_name;
    auto err = run_and_check(*compiled[i], p, d, g, 0, checks[i].flags);
    KILN_ASSERT_OK(err);
    const bool flags = templates::gemm_takes_flags(compiled[i]->rendered.params);
    KILN_ASSERT_OK_AND_ASSIGN(DeviceBuffer lowered, DeviceBuffer::allocate(templates::kGemmFlagBytes));
    KILN_ASSERT_OK(lowered.fill_bytes(0));
    for (int r = 1; r < runs; ++r) {
      auto again = run_and_check(*compiled[i], p, d, g, flags ? lowered.ptr() : 0, checks[i].flags);
      KILN_ASSERT_OK(again);
      EXPECT_EQ(*err, *again) << name << ": the sum order changed between runs (run " << r << ")";
    }
    if (flags && runs > 1) {
      std::vector<uint32_t> left(templates::kGemmFlagBytes / 4, 1);
      KILN_ASSERT_OK(lowered.copy_to_host(left.data(), templates::kGemmFlagBytes));
      EXPECT_EQ(std::count(left.begin(), left.end(), 0u), static_cast<ptrdiff_t>(left.size()))
          << name << ": the kernel left flags raised";
    }
    const double tol = p.splits > 1 ? 1e-5 : gemm_tolerance(p.ep.out);
    std::printf("  %-64s %s regs %d err %.2e\n", name.c_str(), p.str().c_str(), compiled[i]->attr.registers, *err);
    EXPECT_LE(*err, tol) << name << " on " << p.str();
    EXPECT_EQ(compiled[i]->attr.local_bytes, 0) << name;
  }
}

// The staged epilogue (gemm_wgmma_sm90, epi=smem): each tile both ways, direct and staged, on the same data;
// M, N, K not multiples of the tile, N odd (the element-wise path: rows not 16-byte aligned), both B layouts,
// every epilogue op and output dtype (bf16, f16, f32), persistent and not, split-K partials (fp32 chunks), a
// cluster split of K, and bn = 200 (a last chunk of 8 columns); each against the float64 reference with the
// output poisoned first.
TEST(GemmGpu, WgmmaStagedEpilogue) {
  KILN_REQUIRE_GPU();
  KILN_ASSERT_OK_AND_ASSIGN(DeviceInfo info, device_info(0));
  if (info.cc_major != 9) GTEST_SKIP() << "wgmma needs a Hopper GPU (sm_90a)";
  using templates::Value;
  const Layout R = Layout::kRowMajor, C = Layout::kColMajor;
  struct Case {
    int64_t m, n, k;
    DType in;
    Layout lb;
    const char* ep;
    DType out;
    int bm, bn, consumers, stages;
    bool persistent;
    int cluster_k, splits;
  };
  const std::vector<Case> cases = {
      {4095, 1000, 1000, DType::kBF16, C, "bias+gelu", DType::kBF16, 128, 256, 2, 4, true, 1, 1},
      {333, 4104, 264, DType::kBF16, R, "scale+bias+relu", DType::kBF16, 128, 128, 2, 6, false, 1, 1},
      {1000, 129, 136, DType::kF16, C, "bias+silu+residual", DType::kF16, 128, 192, 2, 5, true, 1, 1},
      {130, 200, 72, DType::kBF16, C, "", DType::kF32, 256, 128, 2, 4, true, 1, 1},
      {77, 520, 1000, DType::kF16, R, "gelu+scale", DType::kBF16, 64, 128, 1, 6, false, 1, 1},
      {513, 1000, 200, DType::kF16, C, "relu", DType::kF16, 128, 200, 2, 4, true, 1, 1},
      {1000, 777, 520, DType::kBF16, C, "scale+residual", DType::kF32, 128, 64, 2, 8, false, 1, 1},
      {17, 520, 1000, DType::kBF16, R, "bias+gelu", DType::kBF16, 64, 64, 1, 8, false, 8, 1},
      {300, 392, 4096, DType::kBF16, C, "", DType::kF32, 128, 128, 2, 4, true, 1, 3},  // split-K partials
      {300, 393, 4096, DType::kF16, C, "", DType::kF32, 128, 64, 1, 6, false, 1, 3},  // partials, N odd
  };
  std::vector<WgmmaCheck> checks;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const GemmProblem p{c.m, c.n, c.k, c.in, R, c.lb, spec(c.ep, c.out), c.splits};
    for (const char* epi : {"direct", "smem"}) {
      checks.push_back({p,
                        wgmma_config(p, {{"bm", Value::integer(c.bm)}, {"bn", Value::integer(c.bn)},
                                         {"consumers", Value::integer(c.consumers)}, {"stages", Value::integer(c.stages)},
                                         {"persistent", Value::boolean(c.persistent)},
                                         {"cluster_k", Value::integer(c.cluster_k)}, {"epi", Value::enumeration(epi)}}),
                        700 + i});
    }
  }
  check_wgmma(info, checks);
}

// Stream-K (gemm_wgmma_sm90, stream_k): the tiles of the last, partial wave split along K to fill the grid. Cases
// cover fewer tiles than SMs (15 tiles in 8 pieces, 80 in 1: nothing to split), whole waves then a tail, exact
// waves (no tail), K tails, K too short to split, swap_ab and both epilogues; each runs twice on a poisoned
// workspace and must give the same result both times (a fixed sum order). Every case also runs with sk_even (each
// block an equal share of all the tiles' K iterations): there a tile spans up to ~10 blocks (333x576x7168: 15 tiles
// x 112 K blocks over 132), blocks take pieces of two or three tiles, and the 64x128x40 case has one iteration in all
// (a grid of one block).
TEST(GemmGpu, WgmmaStreamK) {
  KILN_REQUIRE_GPU();
  KILN_ASSERT_OK_AND_ASSIGN(DeviceInfo info, device_info(0));
  if (info.cc_major != 9) GTEST_SKIP() << "wgmma needs a Hopper GPU (sm_90a)";
  using templates::Value;
  const Layout R = Layout::kRowMajor, C = Layout::kColMajor;
  struct Case {
    int64_t m, n, k;
    DType in;
    Layout lb;
    const char* ep;
    DType out;
    int bm, bn, consumers, stages;
    bool swap_ab;
  };
  const std::vector<Case> cases = {
      {333, 576, 7168, DType::kBF16, C, "bias+gelu", DType::kBF16, 128, 128, 2, 6, false},  // 15 tiles, ~9 ways each
      {1000, 1280, 8192, DType::kBF16, C, "", DType::kF32, 128, 128, 2, 6, false},          // 80 tiles
      {4095, 1000, 1000, DType::kBF16, C, "bias+gelu", DType::kBF16, 128, 256, 2, 4, false},  // 128 tiles, K tail
      {1500, 3000, 520, DType::kBF16, C, "scale+residual", DType::kF32, 128, 192, 2, 5, false},  // 192 tiles
      {3000, 6000, 200, DType::kF16, C, "", DType::kBF16, 128, 256, 2, 4, false},  // 576: 180 shared, 3 waves whole
      {2000, 4104, 264, DType::kF16, R, "scale+bias+relu", DType::kF16, 128, 128, 2, 6, false},  // 528 = 4 x 132
      {64, 128, 40, DType::kBF16, C, "bias", DType::kBF16, 64, 128, 1, 4, false},   // one K block: one piece
      {130, 200, 1000, DType::kBF16, C, "", DType::kF32, 128, 256, 2, 4, false},    // 2 tiles in 4 pieces (K / 4)
      {1000, 1280, 8192, DType::kF16, R, "bias", DType::kF16, 256, 128, 2, 4, false},  // 40 tiles in 3 pieces
      {17, 5000, 3000, DType::kBF16, C, "bias+silu", DType::kBF16, 128, 24, 1, 8, true},  // swap_ab: 40 tiles
      {40, 4096, 4096, DType::kF16, R, "residual", DType::kF16, 64, 40, 1, 8, true},
  };
  std::vector<WgmmaCheck> checks;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const GemmProblem p{c.m, c.n, c.k, c.in, R, c.lb, spec(c.ep, c.out), 1};
    for (const char* epi : {"direct", "smem"}) {
      if (c.swap_ab && std::string_view(epi) == "smem") continue;
      if (c.bm == 256 && std::string_view(epi) == "direct") continue;  // refused (spills): GemmTemplates.WgmmaStreamKParameter
      for (bool even : {false, true}) {
        checks.push_back({p,
                          wgmma_config(p, {{"bm", Value::integer(c.bm)}, {"bn", Value::integer(c.bn)},
                                           {"consumers", Value::integer(c.consumers)}, {"stages", Value::integer(c.stages)},
                                           {"group_m", Value::integer(c.swap_ab ? 1 : 8)},
                                           {"persistent", Value::boolean(true)}, {"swap_ab", Value::boolean(c.swap_ab)},
                                           {"epi", Value::enumeration(epi)}, {"stream_k", Value::boolean(true)},
                                           {"sk_even", Value::boolean(even)}}),
                          static_cast<uint64_t>((even ? 950 : 900) + i)});
      }
    }
  }
  check_wgmma(info, checks, 3);  // the memset path, then own flags twice
}

// Ping-pong (gemm_wgmma_sm90, pingpong): two consumers take a block's tiles in turn. Cases give blocks one tile
// (the second consumer idle), two, an odd and an even count, K tails and both epilogues and B layouts.
TEST(GemmGpu, WgmmaPingPong) {
  KILN_REQUIRE_GPU();
  KILN_ASSERT_OK_AND_ASSIGN(DeviceInfo info, device_info(0));
  if (info.cc_major != 9) GTEST_SKIP() << "wgmma needs a Hopper GPU (sm_90a)";
  using templates::Value;
  const Layout R = Layout::kRowMajor, C = Layout::kColMajor;
  struct Case {
    int64_t m, n, k;
    DType in;
    Layout lb;
    const char* ep;
    DType out;
    int bm, bn, stages;
  };
  const std::vector<Case> cases = {
      {333, 576, 1000, DType::kBF16, C, "bias+gelu", DType::kBF16, 128, 128, 6},    // 15 tiles: one per block
      {1000, 4104, 264, DType::kF16, R, "scale+bias+relu", DType::kF16, 128, 128, 6},  // 264 tiles: two each
      {4095, 1000, 520, DType::kBF16, C, "residual", DType::kF32, 64, 256, 5},      // 256 tiles: 1-2 each
      {3000, 6000, 200, DType::kF16, C, "", DType::kBF16, 64, 256, 5},              // 1128 tiles: 8-9 each
      {77, 5000, 4096, DType::kBF16, R, "bias+silu", DType::kBF16, 128, 128, 6},    // 40 tiles
  };
  std::vector<WgmmaCheck> checks;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const GemmProblem p{c.m, c.n, c.k, c.in, R, c.lb, spec(c.ep, c.out), 1};
    for (const char* epi : {"direct", "smem"}) {
      checks.push_back({p,
                        wgmma_config(p, {{"bm", Value::integer(c.bm)}, {"bn", Value::integer(c.bn)},
                                         {"consumers", Value::integer(2)}, {"stages", Value::integer(c.stages)},
                                         {"persistent", Value::boolean(true)}, {"epi", Value::enumeration(epi)},
                                         {"pingpong", Value::boolean(true)}}),
                        950 + i});
    }
  }
  check_wgmma(info, checks);
}

// TMA multicast (gemm_wgmma_sm90, mcast=2): clusters of two blocks on adjacent tile columns sharing A, each
// loading half and multicasting it. Odd tile-column counts (the last pair's second block past N), M, N, K not
// multiples of the tile, A K-major (half boxes) and MN-major (whole 64-row boxes), both B layouts, persistent
// (a block and its peer walking the same tile rows) and not, both epilogue stores, split-K partials, epilogues
// with bias, residual, activations and each output dtype; against the float64 reference, output poisoned first.
TEST(GemmGpu, WgmmaMulticast) {
  KILN_REQUIRE_GPU();
  KILN_ASSERT_OK_AND_ASSIGN(DeviceInfo info, device_info(0));
  if (info.cc_major != 9) GTEST_SKIP() << "wgmma needs a Hopper GPU (sm_90a)";
  using templates::Value;
  const Layout R = Layout::kRowMajor, C = Layout::kColMajor;
  struct Case {
    int64_t m, n, k;
    DType in;
    Layout la, lb;
    const char* ep;
    DType out;
    int bm, bn, consumers, stages;
    bool persistent;
    const char* epi;
    int splits;
  };
  const std::vector<Case> cases = {
      {4095, 1000, 1000, DType::kBF16, R, C, "bias+gelu", DType::kBF16, 128, 256, 2, 4, true, "smem", 1},   // 4 columns
      {1000, 1100, 264, DType::kBF16, R, C, "scale+bias+relu", DType::kBF16, 128, 256, 2, 4, true, "direct", 1},  // 5
      {333, 4104, 1000, DType::kF16, R, R, "bias+silu+residual", DType::kF16, 128, 128, 2, 6, false, "smem", 1},
      {88, 392, 136, DType::kBF16, C, C, "", DType::kF32, 128, 128, 2, 5, false, "direct", 1},  // A MN-major, 4 cols
      {520, 200, 40, DType::kF16, C, R, "residual", DType::kF16, 128, 64, 1, 6, true, "smem", 1},  // 4 columns, K 40
      {130, 129, 72, DType::kBF16, R, C, "gelu+scale", DType::kBF16, 64, 64, 1, 8, false, "smem", 1},  // 3 columns
      {300, 392, 4096, DType::kBF16, R, C, "", DType::kF32, 128, 128, 2, 4, true, "smem", 3},  // partials
      {4096, 4096, 512, DType::kBF16, R, C, "", DType::kBF16, 128, 256, 2, 4, true, "smem", 1},
  };
  std::vector<WgmmaCheck> checks;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const GemmProblem p{c.m, c.n, c.k, c.in, c.la, c.lb, spec(c.ep, c.out), c.splits};
    checks.push_back({p,
                      wgmma_config(p, {{"bm", Value::integer(c.bm)}, {"bn", Value::integer(c.bn)},
                                       {"consumers", Value::integer(c.consumers)}, {"stages", Value::integer(c.stages)},
                                       {"persistent", Value::boolean(c.persistent)}, {"epi", Value::enumeration(c.epi)},
                                       {"mcast", Value::integer(2)}}),
                      900 + i});
  }
  check_wgmma(info, checks);
}


// Programmatic dependent launch (Launch::programmatic, on by default for gemm_wgmma_sm90): a GEMM launched with it
// may be scheduled while the previous kernel runs, and must wait for it (kiln_wait_prior_grid) before loading. The
// previous kernel here lets its dependents launch at once (griddepcontrol.launch_dependents first), spins ~1 ms, then
// writes the GEMM's A; A is poisoned (NaN) before every round, so a GEMM that loads without waiting reads NaN.
// (Checked on the H200: with the wait taken out of the kernel this test fails.) Ten rounds, each against the float64
// reference.
// Early weights (gemm_wgmma_sm90, early > 0, swap_ab): the first stages' weights are requested before the
// dependency wait when the call promises B constant. Both B layouts, two blocks per SM and one, a cluster split,
// early of part and all of the ring, K shorter than the ring, M, N, K off the tile; with and without the promise.
TEST(GemmGpu, WgmmaEarlyWeights) {
  KILN_REQUIRE_GPU();
  KILN_ASSERT_OK_AND_ASSIGN(DeviceInfo info, device_info(0));
  if (info.cc_major != 9) GTEST_SKIP() << "wgmma needs a Hopper GPU (sm_90a)";
  using templates::Value;
  const Layout R = Layout::kRowMajor, C = Layout::kColMajor;
  struct Case {
    int64_t m, n, k;
    DType in;
    Layout lb;
    const char* ep;
    int bn, stages, early, cluster_k, blocks;
    int trigger;  // 0 exit, 1 start, 2 tail
  };
  const std::vector<Case> cases = {
      {1, 4096, 7168, DType::kBF16, C, "", 8, 12, 12, 2, 2, 1},
      {3, 1000, 1000, DType::kBF16, C, "bias+gelu", 8, 12, 6, 1, 2, 2},  // K tail, N off the tile
      {16, 4104, 200, DType::kF16, R, "bias", 16, 10, 10, 1, 2, 1},     // 4 K blocks: fewer than early
      {32, 2000, 3000, DType::kBF16, R, "residual", 32, 8, 4, 2, 2, 2},
      {8, 3000, 2048, DType::kBF16, C, "scale", 8, 16, 16, 2, 1, 0},    // one block per SM
      {77, 4096, 4096, DType::kBF16, C, "bias", 80, 6, 0, 1, 2, 2},     // the trigger alone
  };
  std::vector<WgmmaCheck> checks;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const GemmProblem p{c.m, c.n, c.k, c.in, Layout::kRowMajor, c.lb, spec(c.ep, c.in), 1};
    for (int flags : {KILN_GEMM_B_CONSTANT, 0}) {
      checks.push_back({p,
                        wgmma_config(p, {{"bm", Value::integer(64)}, {"bn", Value::integer(c.bn)},
                                         {"consumers", Value::integer(1)}, {"stages", Value::integer(c.stages)},
                                         {"group_m", Value::integer(1)}, {"swap_ab", Value::boolean(true)},
                                         {"cluster_k", Value::integer(c.cluster_k)},
                                         {"blocks_per_sm", Value::integer(c.blocks)}, {"early", Value::integer(c.early)},
                                         {"trigger", Value::integer(c.trigger)}}),
                        static_cast<uint64_t>(1100 + i), flags});
    }
  }
  check_wgmma(info, checks, 2);
}

// A kernel that lets its dependent launch at once, spins ~1 ms, then copies src to dst: a GEMM launched
// programmatically after it that read dst before its dependency wait would see the poison.
constexpr const char* kLateCopySource = R"(
extern "C" __global__ void late_copy(const unsigned short* src, unsigned short* dst, long long n, long long spin) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const long long t0 = clock64();
  while (clock64() - t0 < spin) {
  }
  for (long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = src[i];
}
)";

// Compiles `fields` for bf16 problem `p` (B column-major), then ten times: poisons a copy of A (or, with late_b, of
// B) and D, has late_copy fill that copy ~1 ms after letting the GEMM launch, runs the GEMM on it programmatically
// with `flags` and expects the right D: the GEMM waited for what the previous kernel writes.
void expect_waits_for_late_copy(const GemmProblem& p, std::initializer_list<TileField> fields, bool late_b, int flags,
                                uint64_t seed) {
  const bool was = templates::programmatic_launch_enabled();
  templates::set_programmatic_launch(true);
  KILN_ASSERT_OK_AND_ASSIGN(TemplatePtr t, templates::find_template("gemm_wgmma_sm90"));
  auto compiled = compile_all({{t, wgmma_config(p, fields)}}, {Target{"sm_90a"}});
  KILN_ASSERT_OK(compiled[0]);
  KILN_ASSERT_OK_AND_ASSIGN(templates::Launch g, t->geometry(compiled[0]->rendered.params, {p.m, p.n, p.k}));
  EXPECT_TRUE(g.programmatic) << "gemm_wgmma_sm90 launches programmatically by default";
  KernelSource late{.name = "late_copy", .entry = "late_copy", .source = kLateCopySource};
  KILN_ASSERT_OK_AND_ASSIGN(Binary bin, compile(late, Target{"sm_90a"}));
  KILN_ASSERT_OK_AND_ASSIGN(Kernel copy, load_kernel(bin));
  const GemmData d = make_gemm_data(p, seed);
  KILN_ASSERT_OK_AND_ASSIGN(GemmDevice m, upload_gemm(p, d));
  const DeviceBuffer& src = late_b ? m.b : m.a;
  const long long n = late_b ? p.k * p.n : p.m * p.k;
  KILN_ASSERT_OK_AND_ASSIGN(DeviceBuffer target, DeviceBuffer::allocate(static_cast<size_t>(n) * 2));
  GemmArgs args = gemm_args(p, m);
  (late_b ? args.b : args.a) = target.as<void>();
  args.flags = flags;
  KILN_ASSERT_OK_AND_ASSIGN(const DriverApi* api, driver());
  CUstream stream = nullptr;
  ASSERT_EQ(api->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  std::vector<uint8_t> z_bytes(static_cast<size_t>(p.m * p.n) * 2);
  const long long spin = 2'000'000;  // clock cycles: ~1 ms, far longer than the GEMM takes to start
  const char* what = late_b ? "B" : "A";
  for (int round = 0; round < 10; ++round) {
    ASSERT_EQ(api->cuMemsetD8Async(target.ptr(), 0xFF, static_cast<size_t>(n) * 2, stream), CUDA_SUCCESS);
    ASSERT_EQ(api->cuMemsetD8Async(m.d.ptr(), 0xFF, z_bytes.size(), stream), CUDA_SUCCESS);
    LaunchConfig lc;
    lc.grid = {8, 1, 1};
    lc.block = {256, 1, 1};
    lc.stream = stream;
    KILN_ASSERT_OK(copy(lc, src.ptr(), target.ptr(), n, spin));
    KILN_ASSERT_OK(templates::launch_gemm(*compiled[0]->kernel, compiled[0]->rendered.params, g, args, stream));
    ASSERT_EQ(api->cuStreamSynchronize(stream), CUDA_SUCCESS);
    KILN_ASSERT_OK(m.d.copy_to_host(z_bytes.data(), z_bytes.size()));
    const std::vector<double> z = to_doubles(DType::kBF16, z_bytes, static_cast<size_t>(p.m * p.n));
    EXPECT_EQ(count_nan(z, p.n, p.m, p.n), 0) << "round " << round << ": the GEMM read " << what << " before it was written";
    EXPECT_LE(rel_norm_error(z, p.n, d.out, p.m, p.n), gemm_tolerance(DType::kBF16)) << what << " round " << round;
  }
  api->cuStreamDestroy(stream);
  templates::set_programmatic_launch(was);
}

// An early-weights configuration launched programmatically after a kernel still writing one of its operands: the
// activations (A) with the promise, the weights (B) without it. Either way it must read what was written.
TEST(GemmGpu, WgmmaEarlyWeightsWaitForWhatThePreviousKernelWrites) {
  KILN_REQUIRE_GPU();
  KILN_ASSERT_OK_AND_ASSIGN(DeviceInfo info, device_info(0));
  if (info.cc_major != 9) GTEST_SKIP() << "wgmma needs a Hopper GPU (sm_90a)";
  using templates::Value;
  const GemmProblem p{16, 2048, 1024, DType::kBF16, Layout::kRowMajor, Layout::kColMajor, spec("", DType::kBF16), 1};
  for (bool late_b : {false, true}) {
    expect_waits_for_late_copy(p,
                               {{"bm", Value::integer(64)}, {"bn", Value::integer(16)}, {"consumers", Value::integer(1)},
                                {"stages", Value::integer(10)}, {"group_m", Value::integer(1)},
                                {"swap_ab", Value::boolean(true)}, {"blocks_per_sm", Value::integer(2)},
                                {"early", Value::integer(10)}, {"trigger", Value::integer(1)}},
                               late_b, late_b ? 0 : KILN_GEMM_B_CONSTANT, 1200);
  }
}

TEST(GemmGpu, WgmmaProgrammaticLaunchWaitsForThePreviousKernel) {
  KILN_REQUIRE_GPU();
  KILN_ASSERT_OK_AND_ASSIGN(DeviceInfo info, device_info(0));
  if (info.cc_major != 9) GTEST_SKIP() << "wgmma needs a Hopper GPU (sm_90a)";
  using templates::Value;
  const GemmProblem p{256, 512, 1024, DType::kBF16, Layout::kRowMajor, Layout::kColMajor, spec("", DType::kBF16), 1};
  expect_waits_for_late_copy(p,
                             {{"bm", Value::integer(128)}, {"bn", Value::integer(64)}, {"consumers", Value::integer(2)},
                              {"stages", Value::integer(4)}},
                             false, 0, 900);
}
}  // namespace
}  // namespace kiln::testing
