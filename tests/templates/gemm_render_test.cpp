// GEMM templates without a GPU: registration, parameters, constraints, problem checks, geometry, names,
// deterministic rendering, and a handful of configurations per family compiled with NVRTC (sm_80 / sm_90a)
// whose PTX holds the instructions the family is about (mma.sync + cp.async; wgmma + TMA).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <regex>
#include <thread>

#include "kiln/jit.h"
#include "kiln/templates/gemm.h"
#include "kiln/templates/templates.h"
#include "kiln_test.h"

namespace kiln::templates {
namespace {

Params sm80_params(int64_t bm, int64_t bn, int64_t bk, int64_t wm, int64_t wn, int64_t stages, int64_t align,
                   DType in = DType::kBF16, Layout la = Layout::kRowMajor, Layout lb = Layout::kRowMajor,
                   bool partials = false, std::string_view ep = "bias+gelu", DType out = DType::kBF16) {
  Params p = gemm_problem_params(in, la, lb, *parse_epilogue(ep, out), partials);
  p.emplace("align", Value::integer(align));
  p.emplace("bm", Value::integer(bm));
  p.emplace("bn", Value::integer(bn));
  p.emplace("bk", Value::integer(bk));
  p.emplace("warps_m", Value::integer(wm));
  p.emplace("warps_n", Value::integer(wn));
  p.emplace("stages", Value::integer(stages));
  p.emplace("group_m", Value::integer(8));
  return p;
}

Params sm90_params(int64_t bm, int64_t bn, int64_t consumers, int64_t stages, bool persistent, DType in = DType::kBF16,
                   Layout la = Layout::kRowMajor, Layout lb = Layout::kColMajor, bool partials = false,
                   std::string_view ep = "bias+gelu", DType out = DType::kBF16) {
  Params p = gemm_problem_params(in, la, lb, *parse_epilogue(ep, out), partials);
  p.emplace("bm", Value::integer(bm));
  p.emplace("bn", Value::integer(bn));
  p.emplace("consumers", Value::integer(consumers));
  p.emplace("stages", Value::integer(stages));
  p.emplace("group_m", Value::integer(8));
  p.emplace("persistent", Value::boolean(persistent));
  p.emplace("cluster_k", Value::integer(1));
  p.emplace("blocks_per_sm", Value::integer(1));
  p.emplace("swap_ab", Value::boolean(false));
  return p;
}

DeviceLimits limits(const char* arch) { return *DeviceLimits::for_target(Target{arch}); }

TEST(GemmTemplates, BothFamiliesRegisterCleanly) {
  for (const Status& s : registry_errors()) ADD_FAILURE() << s.to_string_with_detail();
  auto gemms = templates_for("gemm");
  std::vector<std::string> names;
  for (const auto& t : gemms) names.push_back(t->name());
  EXPECT_NE(std::find(names.begin(), names.end(), "gemm_mma_sm80"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "gemm_wgmma_sm90"), names.end());
  // Both declare the bool problem parameter the split-K subgraph needs.
  for (const auto& t : gemms) {
    const ParamSpec* p = t->param("partials");
    ASSERT_NE(p, nullptr) << t->name();
    EXPECT_EQ(p->kind, ParamKind::kBool);
    EXPECT_EQ(p->role, ParamRole::kProblem);
  }
}

TEST(GemmTemplates, ConfigNamesAreStableAndReadable) {
  auto sm80 = *find_template("gemm_mma_sm80");
  auto sm90 = *find_template("gemm_wgmma_sm90");
  EXPECT_EQ(*sm80->config_name(sm80_params(128, 128, 32, 2, 2, 3, 8)), "gemm_mma_128x128x32_w2x2_s3_g8_a8_bf16_rr_bias_gelu_bf16");
  EXPECT_EQ(*sm90->config_name(sm90_params(128, 256, 2, 4, true, DType::kF16, Layout::kColMajor, Layout::kRowMajor, true,
                                           "", DType::kF32)),
            "gemm_wgmma_128x256x64_c2_s4_g8_p_f16_cr_none_f32_partials");
}

TEST(GemmTemplates, BadParametersAreNamedErrors) {
  auto sm80 = *find_template("gemm_mma_sm80");
  Params p = sm80_params(128, 128, 32, 2, 2, 3, 8);
  Params unknown = p;
  unknown.emplace("bmm", Value::integer(64));
  auto r = sm80->render(unknown);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().to_string().find("bmm"), std::string::npos) << r.status().to_string();

  Params missing = p;
  missing.erase("stages");
  r = sm80->render(missing);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().to_string().find("stages"), std::string::npos) << r.status().to_string();

  Params wrong_kind = p;
  wrong_kind.insert_or_assign("bm", Value::boolean(true));
  r = sm80->render(wrong_kind);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().to_string().find("bm"), std::string::npos) << r.status().to_string();

  // The derived wgmma wrapper cannot be given.
  auto sm90 = *find_template("gemm_wgmma_sm90");
  Params derived = sm90_params(128, 128, 2, 4, false);
  derived.emplace("wgmma", Value::code("x", "x"));
  EXPECT_FALSE(sm90->render(derived).ok());
}

TEST(GemmTemplates, ConstraintsPruneWithReasons) {
  auto sm80 = *find_template("gemm_mma_sm80");
  auto sm90 = *find_template("gemm_wgmma_sm90");
  EXPECT_TRUE(sm80->check(sm80_params(128, 256, 32, 2, 4, 4, 8), limits("sm_80")).ok());
  // 4 x (256x64 + 64x256) x 2 bytes = 256 KiB > 163 KiB on sm_80.
  Status s = sm80->check(sm80_params(256, 256, 64, 2, 4, 4, 8), limits("sm_80"));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("shared memory"), std::string::npos) << s.to_string();
  // A 128x128 warp tile needs ~600 registers per thread.
  s = sm80->check(sm80_params(128, 128, 32, 1, 1, 2, 8), limits("sm_80"));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("registers"), std::string::npos) << s.to_string();
  // Warp tiles must be whole m16n16 pieces.
  EXPECT_FALSE(sm80->check(sm80_params(32, 64, 32, 4, 1, 3, 8), limits("sm_80")).ok());

  EXPECT_TRUE(sm90->check(sm90_params(128, 256, 2, 4, true), limits("sm_90a")).ok());
  // wgmma needs the arch-specific target, and Hopper.
  EXPECT_EQ(sm90->check(sm90_params(128, 256, 2, 4, true), limits("sm_90")).code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(sm90->check(sm90_params(128, 256, 2, 4, true), limits("sm_80")).code(), ErrorCode::kFailedPrecondition);
  // 6 x 48 KiB stages > 227 KiB; a 128x256 tile for one warpgroup is 256 accumulators per thread.
  EXPECT_FALSE(sm90->check(sm90_params(128, 256, 2, 6, true), limits("sm_90a")).ok());
  EXPECT_FALSE(sm90->check(sm90_params(128, 256, 1, 3, true), limits("sm_90a")).ok());
  // Cluster split-K: not with persistence or partials; the cluster is the launch's.
  Params ck = sm90_params(64, 128, 1, 8, false);
  ck.insert_or_assign("cluster_k", Value::integer(4));
  EXPECT_TRUE(sm90->check(ck, limits("sm_90a")).ok());
  auto g = sm90->geometry(ck, Shape{16, 4096, 4096});
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->grid.x, 32u * 4u);
  EXPECT_EQ(g->cluster.x, 4u);
  EXPECT_EQ(*sm90->config_name(ck), "gemm_wgmma_64x128x64_c1_s8_g8_ck4_bf16_rc_bias_gelu_bf16");
  ck.insert_or_assign("persistent", Value::boolean(true));
  EXPECT_FALSE(sm90->check(ck, limits("sm_90a")).ok());
  ck.insert_or_assign("persistent", Value::boolean(false));
  ck.insert_or_assign("bn", Value::integer(256));  // 128 accumulators: the cluster reduction would spill
  EXPECT_FALSE(sm90->check(ck, limits("sm_90a")).ok());
  // Two blocks per SM: small tiles only (64 accumulators per thread), and both blocks' shared memory must fit.
  Params two = sm90_params(64, 128, 1, 4, false);
  two.insert_or_assign("blocks_per_sm", Value::integer(2));
  EXPECT_TRUE(sm90->check(two, limits("sm_90a")).ok());
  two.insert_or_assign("stages", Value::integer(6));
  EXPECT_FALSE(sm90->check(two, limits("sm_90a")).ok());
  EXPECT_FALSE(sm90->check([&] { Params p = sm90_params(128, 256, 2, 3, false); p.insert_or_assign("blocks_per_sm", Value::integer(2)); return p; }(),
                           limits("sm_90a")).ok());
  EXPECT_FALSE(sm90->check([&] { Params p = sm90_params(128, 64, 2, 3, false); p.insert_or_assign("blocks_per_sm", Value::integer(2)); return p; }(),
                           limits("sm_90a")).ok());  // 64 accumulators, but two consumer warpgroups
}

// epi: a tunable added after configurations were stored. A set without it is the direct epilogue (same text,
// same name); smem adds its staging buffer to the shared memory it asks for and to the name, and is refused with
// swap_ab and where the buffer no longer fits.
TEST(GemmTemplates, WgmmaStagedEpilogueParameter) {
  const Layout R = Layout::kRowMajor, C = Layout::kColMajor;
  auto sm90 = *find_template("gemm_wgmma_sm90");
  const ParamSpec* epi = sm90->param("epi");
  ASSERT_NE(epi, nullptr);
  EXPECT_EQ(epi->role, ParamRole::kTunable);
  ASSERT_TRUE(epi->default_value.has_value());
  EXPECT_EQ(*epi->default_value, Value::enumeration("direct"));

  const Params old = sm90_params(128, 256, 2, 4, true);
  ASSERT_FALSE(old.contains("epi"));
  Params direct = old, smem = old;
  direct.insert_or_assign("epi", Value::enumeration("direct"));
  smem.insert_or_assign("epi", Value::enumeration("smem"));
  auto a = sm90->render(old), b = sm90->render(direct), c = sm90->render(smem);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->source.source, b->source.source);
  EXPECT_EQ(a->config_name, "gemm_wgmma_128x256x64_c2_s4_g8_p_bf16_rc_bias_gelu_bf16");
  EXPECT_EQ(b->config_name, a->config_name);
  EXPECT_EQ(c->config_name, "gemm_wgmma_128x256x64_c2_s4_g8_p_es_bf16_rc_bias_gelu_bf16");
  EXPECT_NE(c->source.source, a->source.source);

  const Shape big{4096, 4096, 4096};
  auto ga = sm90->geometry(old, big), gc = sm90->geometry(smem, big);
  ASSERT_TRUE(ga.ok() && gc.ok());
  EXPECT_EQ(ga->shared_bytes, 4u * 384 * 128 + 1024 + 4 * 16);
  // The stages, the barriers rounded to 128 bytes, then bm rows of 128 bytes.
  EXPECT_EQ(gc->shared_bytes, 4u * 384 * 128 + 1024 + 128 + 128 * 128);
  EXPECT_TRUE(sm90->check(smem, limits("sm_90a")).ok());
  // 256x128 with 4 stages fits by 2 KiB with the buffer (256 x 128 bytes); 128x128 with 7 stages fits without it,
  // not with it.
  Params tall = sm90_params(256, 128, 2, 4, true);
  tall.insert_or_assign("epi", Value::enumeration("smem"));
  EXPECT_TRUE(sm90->check(tall, limits("sm_90a")).ok());
  Params wide = sm90_params(128, 128, 2, 7, true);
  EXPECT_TRUE(sm90->check(wide, limits("sm_90a")).ok());
  wide.insert_or_assign("epi", Value::enumeration("smem"));
  EXPECT_EQ(sm90->check(wide, limits("sm_90a")).code(), ErrorCode::kOutOfRange);

  Params swab = sm90_params(128, 16, 1, 8, false);
  swab.insert_or_assign("swap_ab", Value::boolean(true));
  EXPECT_TRUE(sm90->check(swab, limits("sm_90a")).ok());
  swab.insert_or_assign("epi", Value::enumeration("smem"));
  EXPECT_EQ(sm90->check(swab, limits("sm_90a")).code(), ErrorCode::kInvalidArgument);
  // Two blocks per SM with swap_ab: one m64 row of accumulators per consumer (two spilled on the device's NVRTC).
  Params two = sm90_params(128, 64, 1, 4, true, DType::kF16, C, R, true, "", DType::kF32);
  two.insert_or_assign("swap_ab", Value::boolean(true));
  two.insert_or_assign("blocks_per_sm", Value::integer(2));
  EXPECT_EQ(sm90->check(two, limits("sm_90a")).code(), ErrorCode::kOutOfRange);
  two.insert_or_assign("bm", Value::integer(64));
  EXPECT_TRUE(sm90->check(two, limits("sm_90a")).ok());
  two.insert_or_assign("bn", Value::integer(128));  // 64 accumulators in one m64 row: still allowed
  EXPECT_TRUE(sm90->check(two, limits("sm_90a")).ok());
  Params bad = old;
  bad.insert_or_assign("mcast", Value::integer(3));
  EXPECT_FALSE(sm90->check(bad, limits("sm_90a")).ok());
  bad = old;
  bad.insert_or_assign("epi", Value::enumeration("tma"));
  EXPECT_FALSE(sm90->render(bad).ok());
}

// mcast: a tunable added later (default 1: the name and text of older sets are unchanged); 2 pairs blocks along N
// in clusters of two, the tile columns rounded up to pairs; it excludes swap_ab, cluster_k and two blocks per SM,
// and needs bm to split A in whole TMA boxes.
TEST(GemmTemplates, WgmmaMulticastParameter) {
  const Layout R = Layout::kRowMajor, C = Layout::kColMajor;
  auto sm90 = *find_template("gemm_wgmma_sm90");
  const ParamSpec* mc = sm90->param("mcast");
  ASSERT_NE(mc, nullptr);
  ASSERT_TRUE(mc->default_value.has_value());
  EXPECT_EQ(*mc->default_value, Value::integer(1));
  // Not sampled (measured slower so far), but an explicit 2 is a valid configuration.
  EXPECT_EQ(mc->values, std::vector<Value>{Value::integer(1)});
  const Params old = sm90_params(128, 256, 2, 4, true);
  Params one = old, two = old;
  one.insert_or_assign("mcast", Value::integer(1));
  two.insert_or_assign("mcast", Value::integer(2));
  auto a = sm90->render(old), b = sm90->render(one), c = sm90->render(two);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->source.source, b->source.source);
  EXPECT_EQ(b->config_name, a->config_name);
  EXPECT_EQ(c->config_name, "gemm_wgmma_128x256x64_c2_s4_g8_p_mc2_bf16_rc_bias_gelu_bf16");
  two.insert_or_assign("epi", Value::enumeration("smem"));
  EXPECT_EQ(*sm90->config_name(two), "gemm_wgmma_128x256x64_c2_s4_g8_p_es_mc2_bf16_rc_bias_gelu_bf16");
  KILN_EXPECT_OK(sm90->check(two, limits("sm_90a")));

  // 4095 x 1000: 32 tile rows x 4 tile columns (2 pairs); 1000 x 1100: 8 x 5 columns -> 3 pairs, 6 blocks a row.
  auto g = sm90->geometry(two, Shape{4095, 1000, 64});
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->grid.x, 32u * 4u);
  EXPECT_EQ(g->cluster.x, 2u);
  g = sm90->geometry(two, Shape{1000, 1100, 64});
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->grid.x, 8u * 6u);
  EXPECT_EQ(g->grid.x % 2, 0u);

  auto with = [&](Params p, const char* k, Value v) {
    p.insert_or_assign(k, v);
    p.insert_or_assign("mcast", Value::integer(2));
    return p;
  };
  EXPECT_EQ(sm90->check(with(sm90_params(128, 16, 1, 8, false), "swap_ab", Value::boolean(true)), limits("sm_90a")).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(sm90->check(with(sm90_params(64, 128, 1, 4, false), "cluster_k", Value::integer(2)), limits("sm_90a")).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(sm90->check(with(sm90_params(64, 64, 1, 4, false), "blocks_per_sm", Value::integer(2)), limits("sm_90a")).code(),
            ErrorCode::kInvalidArgument);
  // K-major A (row-major): half of 64 rows is fine; MN-major A (col-major) needs two whole 64-row boxes.
  KILN_EXPECT_OK(sm90->check(with(sm90_params(64, 128, 1, 4, false, DType::kBF16, R, C), "group_m", Value::integer(8)),
                             limits("sm_90a")));
  EXPECT_EQ(sm90->check(with(sm90_params(64, 128, 1, 4, false, DType::kBF16, C, C), "group_m", Value::integer(8)),
                        limits("sm_90a")).code(),
            ErrorCode::kInvalidArgument);
  KILN_EXPECT_OK(sm90->check(with(sm90_params(128, 128, 2, 4, false, DType::kBF16, C, C), "group_m", Value::integer(8)),
                             limits("sm_90a")));
}

// stream_k: a tunable added later (default false: older sets keep their name and text); persistent grids only,
// not with the other K splits or multicast; its workspace is a flag area plus a bm x bn fp32 slot per block.
// The compile-cost estimate a pool orders its queue by: larger accumulator tiles, stream-K's fix-up and the
// staged epilogue cost more; the value rides along with the rendered source. Templates without a model give 0.
TEST(GemmTemplates, WgmmaCompileCostRanksWhatCompilesLonger) {
  auto sm90 = *find_template("gemm_wgmma_sm90");
  auto cost = [&](const Params& p) {
    auto r = sm90->render(p);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? r->compile_cost : -1.0;
  };
  const Params small = sm90_params(64, 64, 1, 4, true), large = sm90_params(128, 128, 1, 4, true);
  Params streamed = small, staged = small;
  streamed.insert_or_assign("stream_k", Value::boolean(true));
  staged.insert_or_assign("epi", Value::enumeration("smem"));
  const double c_small = cost(small), c_large = cost(large);
  EXPECT_GT(c_small, 0.01);  // seconds: tens to hundreds of milliseconds
  EXPECT_LT(c_large, 2.0);
  EXPECT_GT(c_large, 1.5 * c_small);
  EXPECT_GT(cost(streamed), 1.2 * c_small);
  EXPECT_GT(cost(staged), 1.1 * c_small);
  // Two consumers split the tile: each unrolls half of it.
  EXPECT_LT(cost(sm90_params(128, 128, 2, 4, true)), c_large);
  // The mma.sync family: the tile each warp unrolls.
  auto sm80 = *find_template("gemm_mma_sm80");
  auto sm80_cost = [&](const Params& p) {
    auto r = sm80->render(p);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? r->compile_cost : -1.0;
  };
  const double four_warps = sm80_cost(sm80_params(128, 128, 32, 2, 2, 3, 8));
  EXPECT_GT(four_warps, 0.01);
  EXPECT_GT(sm80_cost(sm80_params(128, 128, 32, 1, 2, 3, 8)), 1.2 * four_warps);  // twice the tile per warp
  // Templates without a model give 0 (unknown: queued after the estimated ones, in order).
  auto norm = *find_template("rmsnorm");
  auto grid = Grid::create(norm);
  ASSERT_TRUE(grid.ok()) << grid.status().to_string();
  auto picks = sample(*grid, limits("sm_90a"), 1);
  ASSERT_FALSE(picks.empty());
  auto rendered = norm->render(picks[0]);
  ASSERT_TRUE(rendered.ok()) << rendered.status().to_string();
  EXPECT_EQ(rendered->compile_cost, 0.0);
}

TEST(GemmTemplates, WgmmaStreamKParameter) {
  auto sm90 = *find_template("gemm_wgmma_sm90");
  const ParamSpec* sk = sm90->param("stream_k");
  ASSERT_NE(sk, nullptr);
  ASSERT_TRUE(sk->default_value.has_value());
  EXPECT_EQ(*sk->default_value, Value::boolean(false));
  const Params old = sm90_params(128, 128, 2, 6, true);
  Params off = old, on = old;
  off.insert_or_assign("stream_k", Value::boolean(false));
  on.insert_or_assign("stream_k", Value::boolean(true));
  auto a = sm90->render(old), b = sm90->render(off), c = sm90->render(on);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->source.source, b->source.source);
  EXPECT_EQ(a->config_name, b->config_name);
  EXPECT_NE(b->source.source, c->source.source);
  EXPECT_EQ(c->config_name, "gemm_wgmma_128x128x64_c2_s6_g8_p_sk_bf16_rc_bias_gelu_bf16");
  KILN_EXPECT_OK(sm90->check(on, limits("sm_90a")));
  EXPECT_EQ(sm90->workspace_bytes(*sm90->complete(off)), 0u);

  auto with = [&](Params p, const char* k, Value v) {
    p.insert_or_assign(k, v);
    p.insert_or_assign("stream_k", Value::boolean(true));
    return p;
  };
  for (const Params& bad : {with(old, "persistent", Value::boolean(false)), with(sm90_params(64, 64, 1, 4, true), "cluster_k", Value::integer(2)),
                            with(old, "mcast", Value::integer(2)),
                            with(sm90_params(128, 128, 2, 6, true, DType::kBF16, Layout::kRowMajor, Layout::kColMajor, true, ""),
                                 "group_m", Value::integer(8))}) {
    const Status st = sm90->check(bad, limits("sm_90a"));
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.to_string().find("stream_k"), std::string::npos) << st.to_string();
  }
  // 256x128 over two consumers (two m64 rows of 128 accumulators each) spills with the direct epilogue.
  Params tall = with(sm90_params(256, 128, 2, 4, true), "group_m", Value::integer(8));
  EXPECT_EQ(sm90->check(tall, limits("sm_90a")).code(), ErrorCode::kOutOfRange);
  tall.insert_or_assign("epi", Value::enumeration("smem"));
  KILN_EXPECT_OK(sm90->check(tall, limits("sm_90a")));

  // sk_even, stream-K's free-running form: only with stream_k, its own name, its own text, the same workspace.
  const ParamSpec* even = sm90->param("sk_even");
  ASSERT_NE(even, nullptr);
  ASSERT_TRUE(even->default_value.has_value());
  EXPECT_EQ(*even->default_value, Value::boolean(false));
  Params ev = on;
  ev.insert_or_assign("sk_even", Value::boolean(true));
  KILN_EXPECT_OK(sm90->check(ev, limits("sm_90a")));
  auto e = sm90->render(ev);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->config_name, "gemm_wgmma_128x128x64_c2_s6_g8_p_ske_bf16_rc_bias_gelu_bf16");
  EXPECT_NE(e->source.source, c->source.source);
  EXPECT_NE(e->source.source.find("constexpr bool SK_EVEN = true;"), std::string::npos);
  EXPECT_NE(c->source.source.find("constexpr bool SK_EVEN = false;"), std::string::npos);
  ev.insert_or_assign("stream_k", Value::boolean(false));
  const Status st = sm90->check(ev, limits("sm_90a"));
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.to_string().find("sk_even"), std::string::npos) << st.to_string();
}

// early: a tunable added later (default 0): swap-AB stages whose weights load before the dependency wait.
TEST(GemmTemplates, WgmmaEarlyWeightsParameter) {
  auto sm90 = *find_template("gemm_wgmma_sm90");
  const ParamSpec* early = sm90->param("early");
  ASSERT_NE(early, nullptr);
  ASSERT_TRUE(early->default_value.has_value());
  EXPECT_EQ(*early->default_value, Value::integer(0));
  Params old = sm90_params(64, 8, 1, 12, false);
  old.insert_or_assign("swap_ab", Value::boolean(true));
  old.insert_or_assign("blocks_per_sm", Value::integer(2));
  old.insert_or_assign("group_m", Value::integer(1));
  Params off = old, on = old;
  off.insert_or_assign("early", Value::integer(0));
  on.insert_or_assign("early", Value::integer(6));
  auto a = sm90->render(old), b = sm90->render(off), c = sm90->render(on);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->source.source, b->source.source);
  EXPECT_EQ(a->config_name, b->config_name);
  EXPECT_EQ(c->config_name, "gemm_wgmma_swab_64x8x64_c1_s12_g1_b2_e6_bf16_rc_bias_gelu_bf16");
  EXPECT_NE(c->source.source.find("constexpr int EARLY = 6;"), std::string::npos);
  KILN_EXPECT_OK(sm90->check(on, limits("sm_90a")));
  Params deep = on;
  deep.insert_or_assign("early", Value::integer(13));
  Status st = sm90->check(deep, limits("sm_90a"));
  EXPECT_EQ(st.code(), ErrorCode::kOutOfRange) << st.to_string();
  EXPECT_NE(st.to_string().find("early"), std::string::npos) << st.to_string();
  Params plain = sm90_params(128, 128, 2, 6, true);
  plain.insert_or_assign("early", Value::integer(2));
  st = sm90->check(plain, limits("sm_90a"));
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.to_string().find("swap_ab"), std::string::npos) << st.to_string();

  // trigger (default 0: the kernel never calls it): 1 at the start, 2 after the producer's last load.
  const ParamSpec* trigger = sm90->param("trigger");
  ASSERT_NE(trigger, nullptr);
  ASSERT_TRUE(trigger->default_value.has_value());
  EXPECT_EQ(*trigger->default_value, Value::integer(0));
  EXPECT_NE(a->source.source.find("static_cast<Trigger>(0)"), std::string::npos);
  for (int where : {1, 2}) {
    Params t = on;
    t.insert_or_assign("trigger", Value::integer(where));
    KILN_EXPECT_OK(sm90->check(t, limits("sm_90a")));
    auto r = sm90->render(t);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->config_name, std::string("gemm_wgmma_swab_64x8x64_c1_s12_g1_b2_e6_") + (where == 1 ? "ts" : "tt") +
                                  "_bf16_rc_bias_gelu_bf16");
    EXPECT_NE(r->source.source.find(fmt::format("static_cast<Trigger>({})", where)), std::string::npos);
  }
  for (int nowhere : {-1, 3}) {
    Params t = on;
    t.insert_or_assign("trigger", Value::integer(nowhere));
    const Status bad = sm90->check(t, limits("sm_90a"));
    EXPECT_EQ(bad.code(), ErrorCode::kOutOfRange) << bad.to_string();
    EXPECT_NE(bad.to_string().find("trigger"), std::string::npos) << bad.to_string();
  }
}

// pingpong: a tunable added later (default false); two consumers each take whole bm x bn tiles, so bm need only be a
// multiple of 64 and the accumulators (and the staged epilogue's buffer) are a whole tile per consumer.
TEST(GemmTemplates, WgmmaPingPongParameter) {
  auto sm90 = *find_template("gemm_wgmma_sm90");
  const ParamSpec* pp = sm90->param("pingpong");
  ASSERT_NE(pp, nullptr);
  ASSERT_TRUE(pp->default_value.has_value());
  EXPECT_EQ(*pp->default_value, Value::boolean(false));
  Params on = sm90_params(128, 128, 2, 6, true);
  const auto before = sm90->render(on);
  on.insert_or_assign("pingpong", Value::boolean(true));
  auto r = sm90->render(on);
  ASSERT_TRUE(r.ok() && before.ok());
  EXPECT_NE(r->source.source, before->source.source);
  EXPECT_EQ(r->config_name, "gemm_wgmma_128x128x64_c2_s6_g8_p_pp_bf16_rc_bias_gelu_bf16");
  KILN_EXPECT_OK(sm90->check(on, limits("sm_90a")));
  Params wide = sm90_params(64, 256, 2, 5, true);  // one m64 row of 128 accumulators per consumer
  wide.insert_or_assign("pingpong", Value::boolean(true));
  KILN_EXPECT_OK(sm90->check(wide, limits("sm_90a")));
  wide.insert_or_assign("bm", Value::integer(128));  // a whole 128x256 tile per consumer: 256 accumulators
  EXPECT_EQ(sm90->check(wide, limits("sm_90a")).code(), ErrorCode::kOutOfRange);
  for (auto [k, v] : std::initializer_list<std::pair<const char*, Value>>{
           {"persistent", Value::boolean(false)}, {"stream_k", Value::boolean(true)}, {"consumers", Value::integer(1)}}) {
    Params bad = on;
    bad.insert_or_assign(k, v);
    const Status st = sm90->check(bad, limits("sm_90a"));
    EXPECT_FALSE(st.ok()) << k;
    EXPECT_NE(st.to_string().find("pingpong"), std::string::npos) << st.to_string();
  }
}

// Swap-AB (decode): the kernel computes D^T = B^T . A^T, N on wgmma's 64-row side and M in the tile's bn.
// A small bn needs the kernel's B (A^T) K-major: A row-major; the kernel's A is B^T, MN-major for B row-major.
TEST(GemmTemplates, SwapAbTilesGeometryAndNames) {
  auto sm90 = *find_template("gemm_wgmma_sm90");
  auto swap = [](int64_t bm, int64_t bn, Layout la, Layout lb, int64_t ck = 1) {
    Params p = sm90_params(bm, bn, 1, 8, false, DType::kBF16, la, lb);
    p.insert_or_assign("swap_ab", Value::boolean(true));
    p.insert_or_assign("cluster_k", Value::integer(ck));
    p.insert_or_assign("group_m", Value::integer(1));
    return p;
  };
  const Layout R = Layout::kRowMajor, C = Layout::kColMajor;
  for (int64_t bn : {8, 16, 24, 40, 64}) {
    EXPECT_TRUE(sm90->check(swap(128, bn, R, C), limits("sm_90a")).ok()) << bn;
    EXPECT_TRUE(sm90->check(swap(64, bn, R, R), limits("sm_90a")).ok()) << bn;
  }
  // A col-major: A^T is M-contiguous, loaded in 64-wide boxes; bn must be a multiple of 64 then.
  Status s = sm90->check(swap(128, 16, C, C), limits("sm_90a"));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("multiple of 64"), std::string::npos) << s.to_string();
  EXPECT_TRUE(sm90->check(swap(128, 64, C, C), limits("sm_90a")).ok());
  // Without swap, small tiles serve a K-major (col-major) B only.
  EXPECT_TRUE(sm90->check(sm90_params(64, 32, 1, 8, false, DType::kBF16, R, C), limits("sm_90a")).ok());
  EXPECT_FALSE(sm90->check(sm90_params(64, 32, 1, 8, false, DType::kBF16, R, R), limits("sm_90a")).ok());
  EXPECT_FALSE(sm90->check(swap(128, 12, R, C), limits("sm_90a")).ok());  // wgmma n is a multiple of 8

  // Tiles walk N by bm and M by bn: M = 3, N = 4100 with 128 x 8 tiles is 33 x 1 tiles, x 2 for the cluster.
  auto g = sm90->geometry(swap(128, 8, R, C, 2), Shape{3, 4100, 4096});
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->grid.x, 33u * 2u);
  EXPECT_EQ(g->cluster.x, 2u);
  g = sm90->geometry(swap(64, 16, R, R), Shape{40, 1000, 512});
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->grid.x, 16u * 3u);
  EXPECT_EQ(*sm90->config_name(swap(128, 8, R, C, 2)), "gemm_wgmma_swab_128x8x64_c1_s8_g1_ck2_bf16_rc_bias_gelu_bf16");
  EXPECT_EQ(*sm90->config_name(sm90_params(128, 256, 2, 4, true)), "gemm_wgmma_128x256x64_c2_s4_g8_p_bf16_rc_bias_gelu_bf16");

  // The wgmma wrapper's transpose flags are the kernel's operands': B row-major makes B^T MN-major (tnspA = 1),
  // A row-major makes A^T K-major (tnspB = 0).
  auto r = sm90->render(swap(64, 16, R, R));
  ASSERT_TRUE(r.ok());
  EXPECT_NE(r->source.source.find("m64n16k16.f32.bf16.bf16"), std::string::npos);
  EXPECT_NE(r->source.source.find("p, 1, 1, 1, 0;"), std::string::npos);
  EXPECT_NE(r->source.source.find("constexpr bool SWAP_AB = true;"), std::string::npos);
  r = sm90->render(swap(128, 8, R, C));
  ASSERT_TRUE(r.ok());
  EXPECT_NE(r->source.source.find("p, 1, 1, 0, 0;"), std::string::npos);
}

TEST(GemmTemplates, ProblemChecksAlignmentAndGeometry) {
  auto sm80 = *find_template("gemm_mma_sm80");
  auto sm90 = *find_template("gemm_wgmma_sm90");
  EXPECT_EQ(gemm_alignment(4096, 4096), 8);
  EXPECT_EQ(gemm_alignment(4100, 4096), 4);
  EXPECT_EQ(gemm_alignment(40, 129), 1);
  // B row-major with N = 129 has ldb = 129: only align 1 serves it; TMA cannot.
  const Shape odd{64, 129, 64};
  EXPECT_FALSE(sm80->check_problem(sm80_params(64, 64, 32, 2, 2, 3, 8), odd).ok());
  EXPECT_TRUE(sm80->check_problem(sm80_params(64, 64, 32, 2, 2, 3, 1), odd).ok());
  EXPECT_FALSE(sm90->check_problem(sm90_params(128, 128, 2, 4, false, DType::kBF16, Layout::kRowMajor,
                                               Layout::kRowMajor), odd).ok());
  EXPECT_TRUE(sm90->check_problem(sm90_params(128, 128, 2, 4, false), odd).ok());  // B col-major: ldb = K

  auto g = sm80->geometry(sm80_params(128, 256, 32, 2, 4, 4, 8), Shape{4095, 1000, 40});
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->grid.x, 32u * 4u);
  EXPECT_EQ(g->grid.z, 1u);
  EXPECT_EQ(g->block.x, 256u);
  EXPECT_EQ(g->shared_bytes, 4u * (128 * 32 + 32 * 256) * 2);
  Shape split{16, 4096, 4096, 1, 4};
  g = sm80->geometry(sm80_params(16, 64, 64, 1, 4, 4, 8, DType::kBF16, Layout::kRowMajor, Layout::kRowMajor, true), split);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->grid.z, 4u);
  g = sm90->geometry(sm90_params(128, 256, 2, 4, false, DType::kBF16, Layout::kRowMajor, Layout::kColMajor, true), split);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->grid.x, 16u * 4u);  // one tile row x 16 tile columns x 4 slices
  EXPECT_EQ(g->block.x, 384u);
  EXPECT_FALSE(sm80->check_problem(sm80_params(64, 64, 32, 2, 2, 3, 8), split).ok());  // splits without partials
}

TEST(GemmTemplates, WgmmaWrapperAndDeterministicRendering) {
  const std::string w = render_wgmma(256, DType::kBF16, false, true);
  EXPECT_NE(w.find("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16"), std::string::npos);
  EXPECT_NE(w.find("%127}"), std::string::npos);  // 128 accumulator registers
  EXPECT_NE(w.find("p, 1, 1, 0, 1;"), std::string::npos);
  EXPECT_NE(render_wgmma(64, DType::kF16, true, false).find("m64n64k16.f32.f16.f16"), std::string::npos);

  auto sm90 = *find_template("gemm_wgmma_sm90");
  auto a = sm90->render(sm90_params(128, 128, 2, 4, false));
  auto b = sm90->render(sm90_params(128, 128, 2, 4, false));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->source.source, b->source.source);
  EXPECT_EQ(a->source.options, b->source.options);
  EXPECT_EQ(a->config_name, b->config_name);
  EXPECT_EQ(a->source.entry, "kiln_gemm_wgmma_sm90");
  auto c = sm90->render(sm90_params(128, 64, 2, 4, false));
  EXPECT_NE(a->source.source, c->source.source);
}

// A handful of configurations per family, NVRTC-compiled for real (CI has no GPU; these must still build).
TEST(GemmTemplates, SampleCompilesWithNvrtc) {
  auto sm80 = *find_template("gemm_mma_sm80");
  auto sm90 = *find_template("gemm_wgmma_sm90");
  struct Job {
    TemplatePtr t;
    Params p;
    const char* arch;
    std::vector<const char*> ptx_must_have;
  };
  const Layout R = Layout::kRowMajor, C = Layout::kColMajor;
  auto es = [](Params p) {
    p.insert_or_assign("epi", Value::enumeration("smem"));
    return p;
  };
  std::vector<Job> jobs = {
      // epi=smem: the staged epilogue (swizzled shared-memory chunks, 16-byte coalesced stores): the 4096^3
      // tile persistent with bias+gelu; 128x192 (three chunks) to fp32; partials (fp32 chunks of 32 columns)
      // with f16 and both operands MN-major; a cluster split of K; bn = 200 (a last chunk of 8 columns).
      {sm90, es(sm90_params(128, 256, 2, 4, true)), "sm_90a",
       {"wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16", "st.global.v4", "ld.shared.v4.b32", "bar.sync"}},
      {sm90, es(sm90_params(128, 192, 2, 5, false, DType::kBF16, R, R, false, "scale+bias+silu+residual", DType::kF32)),
       "sm_90a", {"wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16", "st.global.v4", "st.shared.v2.f32"}},
      {sm90, es(sm90_params(64, 128, 1, 6, false, DType::kF16, C, R, true, "", DType::kF32)), "sm_90a",
       {"wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16", "st.global.v4"}},
      {sm90, [&] { Params p = es(sm90_params(64, 128, 1, 4, false)); p.insert_or_assign("cluster_k", Value::integer(4)); return p; }(),
       "sm_90a", {"mapa.shared::cluster", "st.global.v4", "st.shared.b32"}},
      {sm90, es(sm90_params(256, 200, 2, 3, true, DType::kF16, R, C, false, "relu", DType::kF16)), "sm_90a",
       {"wgmma.mma_async.sync.aligned.m64n200k16.f32.f16.f16", "st.global.v4"}},
      // mcast=2: pairs of blocks multicasting halves of A (K-major A: half boxes; MN-major A: whole 64-row boxes),
      // with remote arrivals on the peer's empty barriers; with the staged epilogue and with partials.
      {sm90, [&] { Params p = es(sm90_params(128, 256, 2, 4, true)); p.insert_or_assign("mcast", Value::integer(2)); return p; }(),
       "sm_90a", {"multicast::cluster", "mbarrier.arrive.shared::cluster.b64", "mapa.shared::cluster",
                  "barrier.cluster.arrive", "st.global.v4"}},
      {sm90, [&] { Params p = sm90_params(128, 128, 1, 6, false, DType::kF16, C, R, true, "", DType::kF32);
                   p.insert_or_assign("mcast", Value::integer(2)); return p; }(),
       "sm_90a", {"multicast::cluster", "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16"}},
      // stream_k: partials parked in the workspace behind a release flag, acquired and read through L2; with the
      // staged epilogue, the direct one at 128 accumulators (it spilled once), and swap_ab with fp16.
      {sm90, [&] { Params p = sm90_params(128, 256, 2, 4, true); p.insert_or_assign("stream_k", Value::boolean(true)); return p; }(),
       "sm_90a", {"ld.acquire.gpu", "st.global.v4.f32"}},
      {sm90, [&] { Params p = es(sm90_params(128, 192, 2, 5, true, DType::kBF16, R, C, false, "scale+residual", DType::kF32));
                   p.insert_or_assign("stream_k", Value::boolean(true)); return p; }(),
       "sm_90a", {"ld.acquire.gpu"}},
      {sm90, [&] { Params p = es(sm90_params(128, 256, 2, 4, true)); p.insert_or_assign("stream_k", Value::boolean(true)); return p; }(),
       "sm_90a", {"ld.acquire.gpu", "fence.acq_rel.gpu", "ld.global.cg.v4.f32", "st.global.v4.f32", "st.global.v4"}},
      {sm90, [&] { Params p = sm90_params(128, 32, 1, 8, true, DType::kF16, R, R, false, "bias", DType::kF16);
                   p.insert_or_assign("swap_ab", Value::boolean(true)); p.insert_or_assign("stream_k", Value::boolean(true));
                   return p; }(),
       "sm_90a", {"wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16", "ld.acquire.gpu"}},
      // sk_even (free-running stream-K) on the decode tiles it is for: swap-AB 64x80 deep and 128x16, bf16 and fp16.
      {sm90, [&] { Params p = sm90_params(64, 80, 1, 12, true, DType::kBF16, R, C, false, "", DType::kBF16);
                   p.insert_or_assign("group_m", Value::integer(1)); p.insert_or_assign("swap_ab", Value::boolean(true));
                   p.insert_or_assign("stream_k", Value::boolean(true)); p.insert_or_assign("sk_even", Value::boolean(true));
                   return p; }(),
       "sm_90a", {"wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16", "ld.acquire.gpu", "fence.acq_rel.gpu"}},
      {sm90, [&] { Params p = sm90_params(128, 16, 1, 8, true, DType::kF16, R, R, false, "bias+silu", DType::kF16);
                   p.insert_or_assign("group_m", Value::integer(1)); p.insert_or_assign("swap_ab", Value::boolean(true));
                   p.insert_or_assign("stream_k", Value::boolean(true)); p.insert_or_assign("sk_even", Value::boolean(true));
                   return p; }(),
       "sm_90a", {"wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16", "ld.acquire.gpu"}},
      // early weights: two swap-AB blocks per SM letting the next kernel launch at their start or tail; bf16 with a cluster
      // split, fp16 with row-major B (MN-major boxes of the weights) and a bias.
      {sm90, [&] { Params p = sm90_params(64, 8, 1, 12, false); p.insert_or_assign("swap_ab", Value::boolean(true));
                   p.insert_or_assign("blocks_per_sm", Value::integer(2)); p.insert_or_assign("cluster_k", Value::integer(2));
                   p.insert_or_assign("early", Value::integer(12)); p.insert_or_assign("trigger", Value::integer(1));
                   return p; }(),
       "sm_90a", {"griddepcontrol.launch_dependents", "griddepcontrol.wait", "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16"}},
      {sm90, [&] { Params p = sm90_params(64, 16, 1, 10, false, DType::kF16, R, R, false, "bias", DType::kF16);
                   p.insert_or_assign("swap_ab", Value::boolean(true)); p.insert_or_assign("blocks_per_sm", Value::integer(2));
                   p.insert_or_assign("group_m", Value::integer(1)); p.insert_or_assign("early", Value::integer(5));
                   p.insert_or_assign("trigger", Value::integer(2)); return p; }(),
       "sm_90a", {"griddepcontrol.launch_dependents", "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16"}},
      // pingpong: named-barrier turns between the consumers; 64x256 staged, 128x128 direct with fp16 row-major B.
      {sm90, [&] { Params p = es(sm90_params(64, 256, 2, 5, true)); p.insert_or_assign("pingpong", Value::boolean(true)); return p; }(),
       "sm_90a", {"bar.arrive", "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16", "st.global.v4"}},
      {sm90, [&] { Params p = sm90_params(128, 128, 2, 6, true, DType::kF16, R, R, false, "bias+residual", DType::kF16);
                   p.insert_or_assign("pingpong", Value::boolean(true)); return p; }(),
       "sm_90a", {"bar.arrive", "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16"}},
      {sm80, sm80_params(128, 256, 32, 2, 4, 4, 8), "sm_80",
       {"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", "cp.async.cg.shared.global", "ldmatrix.sync.aligned.m8n8.x4.trans"}},
      {sm80, sm80_params(16, 64, 64, 1, 4, 3, 1, DType::kF16, C, C, true, "", DType::kF32), "sm_90",
       {"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", "ldmatrix.sync.aligned.m8n8.x4.trans"}},
      {sm80, sm80_params(64, 128, 64, 2, 2, 3, 4, DType::kBF16, C, R, false, "scale+bias+silu+residual", DType::kF16),
       "sm_90", {"cp.async.ca.shared.global", "mma.sync"}},
      {sm90, sm90_params(128, 256, 2, 4, true), "sm_90a",
       {"wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16", "cp.async.bulk.tensor.2d", "setmaxnreg.inc",
        "mbarrier.try_wait.parity"}},
      {sm90, sm90_params(64, 128, 1, 6, false, DType::kF16, C, R, true, "", DType::kF32), "sm_90a",
       {"wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16", "cp.async.bulk.tensor.2d"}},
      {sm90, [&] { Params p = sm90_params(64, 128, 1, 4, false); p.insert_or_assign("cluster_k", Value::integer(4)); return p; }(),
       "sm_90a", {"barrier.cluster.arrive", "mapa.shared::cluster", "ld.shared::cluster.v4.f32"}},
      // Swap-AB decode tiles: M = 1 in an n8 wgmma with the K split over a cluster; B row-major (MN-major B^T)
      // with fp16 and a residual epilogue (which indexes D's own row and column); split-K partials.
      {sm90, [&] { Params p = sm90_params(128, 8, 1, 8, false); p.insert_or_assign("swap_ab", Value::boolean(true));
                   p.insert_or_assign("cluster_k", Value::integer(2)); return p; }(),
       "sm_90a", {"wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16", "mapa.shared::cluster", "cp.async.bulk.tensor.2d"}},
      {sm90, [&] { Params p = sm90_params(64, 40, 1, 6, false, DType::kF16, R, R, false, "bias+residual", DType::kF16);
                   p.insert_or_assign("swap_ab", Value::boolean(true)); p.insert_or_assign("blocks_per_sm", Value::integer(2));
                   return p; }(),
       "sm_90a", {"wgmma.mma_async.sync.aligned.m64n40k16.f32.f16.f16"}},
      {sm90, [&] { Params p = sm90_params(128, 64, 2, 4, false, DType::kBF16, R, C, true, "", DType::kF32);
                   p.insert_or_assign("swap_ab", Value::boolean(true)); return p; }(),
       "sm_90a", {"wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16"}},
  };
  std::vector<Result<Binary>> out(jobs.size(), make_error(ErrorCode::kCancelled, "not run"));
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < jobs.size();) {
      auto r = jobs[i].t->render(jobs[i].p);
      if (!r.ok()) {
        out[i] = r.status();
        continue;
      }
      CompileSettings settings;
      settings.want_ptx = true;
      KernelSource src = r->source;
      src.options.push_back("--ptxas-options=-v");  // ptxas reports spills into the log
      out[i] = compile(src, Target{jobs[i].arch}, settings);
    }
  };
  std::thread t1(worker), t2(worker);
  t1.join();
  t2.join();
  for (size_t i = 0; i < jobs.size(); ++i) {
    KILN_ASSERT_OK(out[i]);
    EXPECT_GT(out[i]->cubin.size(), 0u);
    for (const char* s : jobs[i].ptx_must_have) EXPECT_NE(out[i]->ptx.find(s), std::string::npos) << out[i]->name << ": " << s;
    // Hopper configurations keep their accumulators in registers (a spill costs the mainloop; measured on the GPU
    // by GemmGpu's local_bytes checks too, but ptxas says so here without one).
    // (Only configurations the constraints accept: some jobs here render outside them on purpose.)
    if (std::string_view(jobs[i].arch) == "sm_90a" && jobs[i].t->check(jobs[i].p, limits("sm_90a")).ok()) {
      EXPECT_NE(out[i]->log.find("bytes spill stores"), std::string::npos) << out[i]->name << ": no ptxas report";
      EXPECT_FALSE(std::regex_search(out[i]->log, std::regex("[1-9][0-9]* bytes spill stores")))
          << out[i]->name << " spills:\n" << out[i]->log;
    }
  }
}

// The N widths of 128-row tiles that fill whole waves: 2048x7392 on 132 SMs has 16 tile rows, so 4 waves are 33
// columns of 224 (the width that won there on an H200); widths past 256, multiples of 64 and repeats are left out.
TEST(GemmTemplates, WaveFitWidthsFillWholeWaves) {
  const std::vector<int64_t> w = wave_fit_widths(2048, 7392, 132);
  EXPECT_NE(std::find(w.begin(), w.end(), 224), w.end());
  for (int64_t bn : w) {
    EXPECT_GT(bn, 64);
    EXPECT_LE(bn, 256);
    EXPECT_NE(bn % 64, 0) << bn;
    EXPECT_EQ(bn % 8, 0) << bn;
    EXPECT_EQ(std::count(w.begin(), w.end(), bn), 1) << bn;
    EXPECT_LE(16 * ((7392 + bn - 1) / bn), 6 * 132) << bn << ": no more than 6 waves of tiles";
  }
  EXPECT_EQ(16 * ((7392 + 224 - 1) / 224), 4 * 132);
  EXPECT_EQ(wave_fit_widths(2048, 7392, 132, 3).size(), 0u) << "3 waves of 16 rows need widths past 256";
  EXPECT_TRUE(wave_fit_widths(0, 7392, 132).empty());
  EXPECT_TRUE(wave_fit_widths(2048, 7392, 0).empty());
  EXPECT_TRUE(wave_fit_widths(-5, -5, -5).empty());
}


// gemm_wgmma_sm90 launches with programmatic dependent launch unless it is turned off (KILN_PDL=0 or
// set_programmatic_launch(false)), and its kernel waits for the previous grid before touching memory; gemm_mma_sm80
// (for devices before Hopper) never asks for it.
TEST(GemmTemplates, WgmmaLaunchesProgrammaticallyUnlessTurnedOff) {
  auto sm90 = *find_template("gemm_wgmma_sm90");
  auto sm80 = *find_template("gemm_mma_sm80");
  const bool was = programmatic_launch_enabled();
  const Params p = sm90_params(128, 128, 2, 4, false);
  set_programmatic_launch(true);
  auto on = sm90->geometry(p, Shape{333, 4096, 4096});
  ASSERT_TRUE(on.ok());
  EXPECT_TRUE(on->programmatic);
  EXPECT_TRUE(on->config(nullptr).programmatic);
  auto old = sm80->geometry(sm80_params(128, 128, 32, 64, 64, 3, 8), Shape{333, 4096, 4096});
  ASSERT_TRUE(old.ok()) << old.status().to_string();
  EXPECT_FALSE(old->programmatic);
  set_programmatic_launch(false);
  auto off = sm90->geometry(p, Shape{333, 4096, 4096});
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->programmatic);
  EXPECT_FALSE(off->config(nullptr).programmatic);
  set_programmatic_launch(was);

  auto r = sm90->render(p);
  ASSERT_TRUE(r.ok());
  const std::string& src = r->source.source;
  // B (the weights when swapped, activations otherwise) is only ever loaded after the wait; the kernel's A before
  // it only in the early block, under the caller's promise that B is constant (which with swap_ab A is).
  const size_t wait = src.find("kiln_wait_prior_grid();\n"), b_load = src.find("tma_load(sb");
  const size_t early = src.find("if constexpr (EARLY > 0) {"), promise = src.find("(args.flags & KILN_GEMM_B_CONSTANT)");
  const size_t early_load = src.find("load_a(base"), loop_load = src.find("load_a(sa, k");
  for (size_t at : {wait, b_load, early, promise, early_load, loop_load}) ASSERT_NE(at, std::string::npos);
  EXPECT_LT(wait, b_load) << "the kernel waits for the previous grid before it loads B";
  EXPECT_LT(wait, loop_load) << "the mainloop's loads come after the wait";
  EXPECT_LT(early, promise);
  EXPECT_LT(promise, early_load) << "loads before the wait only under the promise";
  EXPECT_LT(early_load, wait);
  EXPECT_NE(src.find("static_assert(EARLY == 0 || (SWAP_AB"), std::string::npos) << "early loads only the weights";
}
}  // namespace
}  // namespace kiln::templates
