// Choice generation's memo (templates::generation_cache_enabled): it gives exactly the choices generation gives
// without it, later problems of a template/dtype/layout reuse the first one's renders and grid samples (counted
// by templates::generation_stats), and a cached decision rebuilds its one choice without walking any grid.
// No GPU needed, except the last test (a tuner's warm start), which skips without one.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "kiln/jit/key.h"
#include "kiln/runtime.h"
#include "kiln/runtime/plan_ahead.h"
#include "kiln/templates/registry.h"
#include "kiln_test.h"
#include "tuning_dir.h"

namespace kiln::runtime {
namespace {

ChoiceContext context_for(const char* arch, int configs = 24) {
  auto ctx = choice_context_for_arch(Target{arch});
  EXPECT_TRUE(ctx.ok()) << ctx.status().to_string();
  ctx->max_template_configs = configs;
  return *ctx;
}

Problem gemm(int64_t m, int64_t n, int64_t k, const char* epilogue = "", DType dt = DType::kBF16,
             Layout b = Layout::kRowMajor) {
  GemmProblem g;
  g.m = m, g.n = n, g.k = k;
  g.a = g.b = dt;
  g.b_layout = b;
  g.epilogue = *templates::parse_epilogue(epilogue, dt);
  return Problem::gemm(g);
}

// Every choice's name, then each of its kernels' key (the hash of source, options, headers, entry and target).
std::vector<std::string> signature(const Problem& p, const ChoiceContext& ctx) {
  auto choices = default_ops().choices(p, ctx);
  EXPECT_TRUE(choices.ok()) << p.describe() << ": " << choices.status().to_string();
  std::vector<std::string> out;
  if (!choices.ok()) return out;
  for (const auto& c : *choices) {
    std::string s = c->name();
    for (const auto& k : c->kernels()) s += " " + make_key(k.source, k.target).hex();
    out.push_back(std::move(s));
  }
  return out;
}

templates::GenerationStats delta(const templates::GenerationStats& a, const templates::GenerationStats& b) {
  return {b.renders - a.renders, b.render_hits - a.render_hits, b.samples - a.samples, b.sample_hits - a.sample_hits};
}

// Restores the memo's switch after a test that turns it off.
class ChoiceMemo : public ::testing::Test {
 protected:
  void SetUp() override { templates::clear_generation_cache(); }
  void TearDown() override { templates::set_generation_cache(true); }
};

struct Case {
  Problem problem;
  ChoiceContext ctx;
};

std::vector<Case> spread() {
  ChoiceContext all_families = context_for("sm_90a");
  all_families.families = {"all"};  // gemm_mma_sm80 beside wgmma on Hopper
  return {
      {gemm(4096, 4096, 4096), context_for("sm_90a")},
      {gemm(16, 4096, 4096), context_for("sm_90a")},                     // decode: swap-AB seeds, split-K
      {gemm(1, 6144, 4096, "", DType::kBF16, Layout::kColMajor), context_for("sm_90a")},
      {gemm(64, 2048, 1024, "bias+gelu"), context_for("sm_90a")},         // a code parameter; unfused pairs
      {gemm(64, 2048, 1024, "bias+relu"), context_for("sm_90a")},         // the same shapes, another epilogue
      {gemm(256, 1024, 2048, "", DType::kF16), all_families},
      {gemm(128, 4096, 4096, "", DType::kF16, Layout::kColMajor), context_for("sm_80")},
      {gemm(16, 4096, 8192, "bias", DType::kBF16), context_for("sm_80")},  // sm_80 split-K with an epilogue
      {Problem::norm({.rows = 64, .cols = 4096, .residual = true}), context_for("sm_90a")},
      {Problem::norm({.layernorm = true, .rows = 8, .cols = 1024, .bias = true}), context_for("sm_80")},
      {Problem::softmax({.rows = 16, .cols = 128256}), context_for("sm_90a")},
  };
}

TEST_F(ChoiceMemo, GivesExactlyTheChoicesOfGenerationWithoutIt) {
  const std::vector<Case> cases = spread();
  templates::set_generation_cache(false);
  std::vector<std::vector<std::string>> reference;
  for (const auto& c : cases) reference.push_back(signature(c.problem, c.ctx));
  templates::set_generation_cache(true);
  for (int pass = 0; pass < 2; ++pass) {  // the first fills the memo, the second reads it
    for (size_t i = 0; i < cases.size(); ++i) {
      EXPECT_EQ(signature(cases[i].problem, cases[i].ctx), reference[i]) << cases[i].problem.describe() << " pass " << pass;
      EXPECT_FALSE(reference[i].empty());
    }
  }
}

TEST_F(ChoiceMemo, LaterProblemsOfAKindRenderAndSampleNothing) {
  const ChoiceContext ctx = context_for("sm_90a");
  // The first problem of a template/dtype/layout walks each template's grid and renders its configurations.
  auto s0 = templates::generation_stats();
  signature(gemm(4096, 4096, 4096), ctx);
  auto first = delta(s0, templates::generation_stats());
  EXPECT_GT(first.samples, 0u);
  EXPECT_GT(first.renders, 10u);
  // Other sizes of the same kind: every sample and render is reused; M in (256, 512] adds only its own swap-AB
  // seeds (M in two column tiles of round_up(M / 2, 8), one render per pipeline depth the device allows).
  for (int64_t m : {1024, 2048, 512}) {
    auto s = templates::generation_stats();
    signature(gemm(m, 4096, 4096), ctx);
    auto d = delta(s, templates::generation_stats());
    EXPECT_EQ(d.samples, 0u) << m;
    EXPECT_LE(d.renders, m == 512 ? 2u : 0u) << m;
    EXPECT_EQ(d.sample_hits, first.samples) << m;
    EXPECT_GE(d.render_hits, first.renders) << m;
  }
  // Another dtype is another kind: it samples again.
  auto s = templates::generation_stats();
  signature(gemm(4096, 4096, 4096, "", DType::kF16), ctx);
  EXPECT_GT(delta(s, templates::generation_stats()).samples, 0u);
  // Without the memo every problem pays in full.
  templates::set_generation_cache(false);
  s = templates::generation_stats();
  signature(gemm(1024, 4096, 4096), ctx);
  auto off = delta(s, templates::generation_stats());
  EXPECT_EQ(off.samples, first.samples);
  EXPECT_EQ(off.renders, first.renders);
  EXPECT_EQ(off.render_hits + off.sample_hits, 0u);
}

TEST_F(ChoiceMemo, ClearingStartsAfresh) {
  const ChoiceContext ctx = context_for("sm_90a", 6);
  const Problem p = Problem::norm({.rows = 64, .cols = 4096});
  signature(p, ctx);
  auto s = templates::generation_stats();
  signature(p, ctx);
  EXPECT_EQ(delta(s, templates::generation_stats()).renders, 0u);
  templates::clear_generation_cache();
  s = templates::generation_stats();
  signature(p, ctx);
  EXPECT_GT(delta(s, templates::generation_stats()).renders, 0u);
}

// Code parameters share a tag in configuration names but render their own text: the memo keys on the text.
TEST_F(ChoiceMemo, CodeParametersAreKeyedByTheirTextNotTheirTag) {
  templates::TemplateDef def;
  def.name = "memo_probe";
  def.problem = "memo_probe";
  def.entry = "probe";
  def.params = {templates::code_param("body", templates::ParamRole::kProblem,
                                      {templates::Value::code("return;", "x")}, "", "the kernel's body")};
  def.geometry = [](const templates::Params&, const templates::Shape&) -> Result<templates::Launch> {
    return templates::Launch{};
  };
  KILN_ASSERT_OK_AND_ASSIGN(auto t, templates::Template::create(def, "extern \"C\" __global__ void probe() { ${body} }", {}));
  KILN_ASSERT_OK_AND_ASSIGN(auto a, t->render({{"body", templates::Value::code("int a = 1;", "same")}}));
  KILN_ASSERT_OK_AND_ASSIGN(auto b, t->render({{"body", templates::Value::code("int b = 2;", "same")}}));
  EXPECT_EQ(a.config_name, b.config_name);
  EXPECT_NE(a.source.source, b.source.source);
  EXPECT_NE(b.source.source.find("int b = 2;"), std::string::npos);
  auto s = templates::generation_stats();
  KILN_ASSERT_OK_AND_ASSIGN(auto a2, t->render({{"body", templates::Value::code("int a = 1;", "same")}}));
  EXPECT_EQ(a2.source, a.source);
  EXPECT_EQ(delta(s, templates::generation_stats()).render_hits, 1u);
  // A refused parameter set is refused every time, with its reason (errors are not memoised).
  for (int i = 0; i < 2; ++i) {
    auto bad = t->render({{"body", templates::Value::integer(3)}});
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("body"), std::string::npos) << bad.status().to_string();
  }
}

// The tuner generates on several threads at once: with the memo filling and being read concurrently, every
// thread gets exactly the choices generation gives without it.
TEST_F(ChoiceMemo, ThreadsGeneratingAtOnceAgree) {
  const ChoiceContext ctx = context_for("sm_90a");
  templates::set_generation_cache(false);
  const std::vector<Problem> problems = {gemm(4096, 4096, 4096), gemm(16, 4096, 4096), gemm(64, 2048, 1024, "bias+gelu"),
                                         Problem::softmax({.rows = 16, .cols = 128256})};
  std::vector<std::vector<std::string>> reference;
  for (const auto& p : problems) reference.push_back(signature(p, ctx));
  templates::set_generation_cache(true);
  constexpr int kThreads = 4;
  std::vector<std::vector<std::vector<std::string>>> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 2; ++round) {
        for (size_t i = 0; i < problems.size(); ++i) got[t].push_back(signature(problems[(i + t) % problems.size()], ctx));
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(got[t].size(), 2 * problems.size());
    for (size_t j = 0; j < got[t].size(); ++j) EXPECT_EQ(got[t][j], reference[(j % problems.size() + t) % problems.size()]);
  }
}

// The warm path's rebuild: a cached decision's choice comes back from its stored parameters with at most its
// own kernels rendered, and no grid walked.
TEST_F(ChoiceMemo, ACachedDecisionRebuildsItsChoiceWithoutWalkingAGrid) {
  const ChoiceContext ctx = context_for("sm_90a");
  for (const Problem& p : {gemm(16, 4096, 4096), gemm(64, 2048, 1024, "bias+gelu"), gemm(4096, 4096, 4096),
                           Problem::norm({.rows = 64, .cols = 4096, .residual = true}),
                           Problem::softmax({.rows = 16, .cols = 128256})}) {
    KILN_ASSERT_OK_AND_ASSIGN(auto def, default_ops().find(p.op));
    KILN_ASSERT_OK_AND_ASSIGN(auto choices, default_ops().choices(p, ctx));
    for (const auto& c : choices) {
      if (c->kernels().empty()) continue;  // extern library choices: nothing to render
      auto params = c->parameters();
      std::vector<std::pair<std::string, std::string>> stored(params.begin(), params.end());
      templates::clear_generation_cache();  // a new process: nothing memoised
      auto s = templates::generation_stats();
      KILN_ASSERT_OK_AND_ASSIGN(auto again, def->rebuild(p, c->name(), stored, ctx));
      auto d = delta(s, templates::generation_stats());
      EXPECT_EQ(d.samples + d.sample_hits, 0u) << c->name();
      EXPECT_GE(d.renders, 1u) << c->name();                         // rendered afresh: the memo was empty
      EXPECT_LE(d.renders, c->kernels().size() + 1) << c->name();  // a split-K graph: its GEMM, partials, reduce
      ASSERT_EQ(again->kernels().size(), c->kernels().size());
      for (size_t i = 0; i < c->kernels().size(); ++i) {
        EXPECT_EQ(make_key(again->kernels()[i].source, again->kernels()[i].target).hex(),
                  make_key(c->kernels()[i].source, c->kernels()[i].target).hex())
            << c->name();
      }
    }
  }
}

// A tuner's warm start from an injected decision: it rebuilds the decided choice, generates no others and
// walks no grid (GPU: the tuner compiles and loads the one kernel).
TEST_F(ChoiceMemo, ATunersWarmStartGeneratesNoChoices) {
  KILN_REQUIRE_GPU();
  TuningDir dir("kiln_choice_memo");
  const Problem p = gemm(64, 2048, 1024);
  TuneOptions o;
  o.cache = dir.open(cache::TuneMode::kTune);
  auto made = make_tuner(o);
  KILN_ASSERT_OK(made);
  auto& tuner = **made;
  // The decision a cold tune would have stored for the first template choice.
  KILN_ASSERT_OK_AND_ASSIGN(auto choices, default_ops().choices(p, tuner.context()));
  ChoicePtr pick;
  for (const auto& c : choices) {
    if (c->kind() == ChoiceKind::kTemplate) pick = c;
  }
  ASSERT_NE(pick, nullptr);
  cache::Decision d;
  d.problem = tuner.key(p);
  d.choice = pick->name();
  for (const auto& [k, v] : pick->parameters()) d.params.emplace_back(k, v);
  d.median_us = 1;
  KILN_ASSERT_OK(o.cache->record_decision(d));
  templates::clear_generation_cache();
  auto s = templates::generation_stats();
  KILN_ASSERT_OK_AND_ASSIGN(auto sel, tuner.tune(p));
  auto dl = delta(s, templates::generation_stats());
  EXPECT_TRUE(sel->report().decision_from_cache);
  EXPECT_EQ(sel->choice_name(), pick->name());
  EXPECT_EQ(sel->report().candidates, 0) << "the warm start generated every choice";
  EXPECT_EQ(dl.samples + dl.sample_hits, 0u);
  EXPECT_LE(dl.renders, 1u);
}

// What a workload's plan ahead is made of (kiln tune, the Python warm-up, the suite bench): the problems without a
// cached decision, in the order given, and each workload problem's place among them (GPU: a tuner needs a device).
TEST_F(ChoiceMemo, APlanAheadTakesTheUndecidedProblemsInTheOrderGiven) {
  KILN_REQUIRE_GPU();
  TuningDir dir("kiln_choice_memo");
  TuneOptions o;
  o.cache = dir.open(cache::TuneMode::kTune);
  auto made = make_tuner(o);
  KILN_ASSERT_OK(made);
  auto& tuner = **made;
  const std::vector<Problem> workload{gemm(64, 2048, 1024), gemm(128, 2048, 1024), gemm(256, 2048, 1024)};
  cache::Decision d;
  d.problem = tuner.key(workload[1]);
  d.choice = "cublas_default";
  d.median_us = 1;
  KILN_ASSERT_OK(o.cache->record_decision(d));
  const UndecidedProblems all = undecided_problems(tuner, workload);
  ASSERT_EQ(all.problems.size(), 2u);
  EXPECT_EQ(all.problems[0], workload[0]);
  EXPECT_EQ(all.problems[1], workload[2]);
  EXPECT_EQ(all.index, (std::vector<std::ptrdiff_t>{0, -1, 1}));
  // A budget's order (kiln tune --budget), with an index repeated and one past the end: each problem once.
  const UndecidedProblems ordered = undecided_problems(tuner, workload, {2, 1, 0, 2, 7});
  ASSERT_EQ(ordered.problems.size(), 2u);
  EXPECT_EQ(ordered.problems[0], workload[2]);
  EXPECT_EQ(ordered.problems[1], workload[0]);
  EXPECT_EQ(ordered.index, (std::vector<std::ptrdiff_t>{1, -1, 0}));
}

// `kiln tune` plans every problem (to precompile in the background) and then tunes it: the choices are
// generated once, by the plan, and the tune takes them (GPU: a tuner needs a device).
TEST_F(ChoiceMemo, PlanningThenTuningGeneratesOnce) {
  KILN_REQUIRE_GPU();
  TuningDir dir("kiln_choice_memo");
  OpRegistry ops;
  auto gemm_def = default_ops().find("gemm");
  KILN_ASSERT_OK(gemm_def);
  auto generations = std::make_shared<std::atomic<int>>(0);
  OpDef counted = **gemm_def;
  counted.choices = [inner = counted.choices, generations](const Problem& p, const ChoiceContext& ctx) {
    generations->fetch_add(1);
    return inner(p, ctx);
  };
  KILN_ASSERT_OK(ops.add(counted));
  TuneServices services = default_services();
  services.ops = &ops;
  TuneOptions o;
  o.cache = dir.open(cache::TuneMode::kTune);
  o.max_template_configs = 4;
  o.bench.budget_ms = 2;
  auto made = Tuner::create(o, services);
  KILN_ASSERT_OK(made);
  const Problem p = gemm(64, 2048, 1024);
  KILN_ASSERT_OK_AND_ASSIGN(auto planned, (*made)->planned_choices(p));
  EXPECT_FALSE(planned.empty());
  EXPECT_EQ(generations->load(), 1);
  KILN_ASSERT_OK_AND_ASSIGN(auto sel, (*made)->tune(p));
  EXPECT_FALSE(sel->report().decision_from_cache);
  EXPECT_EQ(generations->load(), 1) << "tune() generated the planned problem's choices again";
  // A problem nobody planned generates its own.
  KILN_ASSERT_OK((*made)->tune(gemm(128, 2048, 1024)).status());
  EXPECT_EQ(generations->load(), 2);
}

}  // namespace
}  // namespace kiln::runtime
