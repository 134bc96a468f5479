// Problems, their cache keys and workload files (no GPU needed).
#include <gtest/gtest.h>

#include <set>

#include "kiln/runtime/problem.h"
#include "kiln/runtime/workload.h"
#include "kiln_test.h"

namespace kiln::runtime {
namespace {

const cache::DeviceFingerprint kH200{"NVIDIA H200", 132, 9, 0};
const cache::VersionStamp kVersions{13000, "13.0", "130100", "0.1.0"};

GemmProblem gemm(int64_t m, int64_t n, int64_t k) {
  GemmProblem g;
  g.m = m, g.n = n, g.k = k;
  return g;
}

TEST(Problem, DescribesAndValidates) {
  GemmProblem g = gemm(16, 4096, 4096);
  g.epilogue = *templates::parse_epilogue("bias+gelu", DType::kBF16);
  Problem p = Problem::gemm(g);
  EXPECT_EQ(p.describe(), "gemm 16x4096x4096 bf16·bf16→bf16 row·row +bias_gelu_bf16");
  KILN_EXPECT_OK(p.validate());
  EXPECT_EQ(p.dynamic_size(), 16);
  EXPECT_EQ(std::get<GemmProblem>(p.with_dynamic_size(64).desc).m, 64);
  EXPECT_EQ(Problem::gemm(gemm(0, 1, 1)).validate().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(Problem::gemm(gemm(1, int64_t{1} << 31, 1)).validate().message().find("n = 2147483648"), std::string::npos);
  GemmProblem f32 = gemm(1, 1, 1);
  f32.a = DType::kF32;
  EXPECT_EQ(Problem::gemm(f32).validate().code(), ErrorCode::kInvalidArgument);
  NormProblem n{.layernorm = false, .rows = 8, .cols = 4096, .bias = true};
  EXPECT_NE(Problem::norm(n).validate().message().find("rmsnorm has no bias"), std::string::npos);
}

TEST(Problem, KeyNamesEverythingThatChangesTheChoice) {
  std::set<std::string> keys;
  auto add = [&](const Problem& p, const char* what) {
    EXPECT_TRUE(keys.insert(p.key(kH200, kVersions).canonical()).second) << what;
  };
  GemmProblem base = gemm(16, 4096, 4096);
  add(Problem::gemm(base), "base");
  GemmProblem g = base;
  g.m = 17;
  add(Problem::gemm(g), "m");
  g = base;
  g.k = 4095;
  add(Problem::gemm(g), "k");
  g = base;
  g.b_layout = Layout::kColMajor;
  add(Problem::gemm(g), "layout");
  g = base;
  g.a = g.b = DType::kF16;
  add(Problem::gemm(g), "dtype");
  g = base;
  g.epilogue.out = DType::kF32;
  add(Problem::gemm(g), "output dtype");
  g = base;
  g.epilogue = *templates::parse_epilogue("bias+relu", DType::kBF16);
  add(Problem::gemm(g), "epilogue");
  g.epilogue.bias_dtype = DType::kF32;
  add(Problem::gemm(g), "bias dtype");
  g = base;
  g.b_constant = true;
  add(Problem::gemm(g), "B constant");
  EXPECT_NE(Problem::gemm(g).describe().find("B constant"), std::string::npos);
  // Without the promise the key is what it was before the field existed: no attribute at all.
  for (const auto& [name, value] : Problem::gemm(base).key(kH200, kVersions).attributes) EXPECT_NE(name, "b_constant");
  add(Problem::norm({.rows = 16, .cols = 4096}), "rmsnorm");
  add(Problem::norm({.layernorm = true, .rows = 16, .cols = 4096}), "layernorm");
  add(Problem::norm({.rows = 16, .cols = 4096, .residual = true}), "residual");
  add(Problem::softmax({.rows = 16, .cols = 4096}), "softmax");
  // The device and the versions are part of the key too.
  cache::DeviceFingerprint h100{"NVIDIA H100 80GB HBM3", 132, 9, 0};
  EXPECT_NE(Problem::gemm(base).key(h100, kVersions).canonical(), Problem::gemm(base).key(kH200, kVersions).canonical());
  cache::VersionStamp newer = kVersions;
  newer.cublas = "130200";
  EXPECT_NE(Problem::gemm(base).key(kH200, newer).canonical(), Problem::gemm(base).key(kH200, kVersions).canonical());
  // And it is stable: the same problem gives the same bytes.
  EXPECT_EQ(Problem::gemm(base).key(kH200, kVersions).canonical(), Problem::gemm(gemm(16, 4096, 4096)).key(kH200, kVersions).canonical());
}

TEST(Workload, ExpandsListsAndDefaults) {
  auto w = parse_workload(R"({"name": "t", "problems": [
      {"op": "gemm", "name": "qkv", "m": [1, 16], "n": [6144, 4096], "k": 4096, "epilogue": "bias+gelu"},
      {"op": "rmsnorm", "rows": [1, 2, 3], "cols": 4096, "residual": true, "eps": 1e-5},
      {"op": "softmax", "rows": 4, "cols": 128256, "dtype": "f16", "scale": 0.5}]})");
  KILN_ASSERT_OK(w);
  EXPECT_EQ(w->name, "t");
  ASSERT_EQ(w->problems.size(), 4u + 3u + 1u);
  EXPECT_EQ(w->labels[0], "qkv");
  const auto& g = std::get<GemmProblem>(w->problems[3].desc);
  EXPECT_EQ(g.m, 16);
  EXPECT_EQ(g.n, 4096);
  EXPECT_EQ(g.epilogue.tag(), "bias_gelu_bf16");
  const auto& n = std::get<NormProblem>(w->problems[6].desc);
  EXPECT_TRUE(n.residual);
  EXPECT_FLOAT_EQ(n.eps, 1e-5f);
  EXPECT_EQ(n.rows, 3);
  const auto& s = std::get<SoftmaxProblem>(w->problems[7].desc);
  EXPECT_EQ(s.dtype, DType::kF16);
  EXPECT_FLOAT_EQ(s.scale, 0.5f);
}

TEST(Workload, ErrorsNameTheEntryAndField) {
  struct Case {
    const char* text;
    const char* expect;
  } cases[] = {
      {R"({"problems": [{"op": "gemm", "m": 1, "n": 2}]})", "entry 0: missing \"k\""},
      {R"({"problems": [{"op": "gemm", "m": 1, "n": 2, "k": 3}, {"op": "conv"}]})", "entry 1: unknown op \"conv\""},
      {R"({"problems": [{"op": "gemm", "m": [1, -2], "n": 2, "k": 3}]})", "\"m\" has -2"},
      {R"({"problems": [{"op": "gemm", "m": 1, "n": 2, "k": 3, "dtype": "f8"}]})", "f8"},
      {R"({"problems": [{"op": "gemm", "m": 1, "n": 2, "k": 3, "epilogue": "bias+tanh"}]})", "tanh"},
      {R"({"problems": [{"op": "rmsnorm", "rows": 1, "cols": 2, "residual": "yes"}]})", "\"residual\" must be true or false"},
      {R"({"problem": []})", "expected {\"problems\""},
      {R"(not json)", "not JSON"},
  };
  for (const auto& c : cases) {
    auto w = parse_workload(c.text);
    ASSERT_FALSE(w.ok()) << c.text;
    EXPECT_EQ(w.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(w.status().message().find(c.expect), std::string::npos) << w.status().message();
  }
}

TEST(Workload, FieldsOfTheWrongTypeOrRangeAreErrorsNotExceptions) {
  for (const char* entry : {R"({"op": "gemm", "m": 16, "n": 64, "k": 64, "epilogue": 5})",
                            R"({"op": "rmsnorm", "rows": 1, "cols": 64, "residual": 3})",
                            R"({"op": "rmsnorm", "rows": 1, "cols": 64, "eps": "small"})",
                            R"({"op": "rmsnorm", "rows": 1, "cols": 64, "eps": 0})",
                            R"({"op": "softmax", "rows": 1, "cols": 64, "scale": 1e300})",
                            R"({"op": "gemm", "m": 18446744073709551615, "n": 64, "k": 64})",
                            R"({"op": "gemm", "m": 2147483648, "n": 64, "k": 64})",
                            R"({"op": "gemm", "m": 2000000000, "n": 2000000000, "k": 8})"}) {
    auto w = runtime::parse_workload(std::string(R"({"problems": [)") + entry + "]}");
    ASSERT_FALSE(w.ok()) << entry;
    EXPECT_EQ(w.status().code(), ErrorCode::kInvalidArgument) << w.status().to_string();
    EXPECT_NE(w.status().message().find("entry 0"), std::string::npos) << w.status().to_string();
  }
}

// A number inside a field's range that rounds onto its edge as a float is refused, and one that stays inside
// reads back from its own JSON: what problem_from_json accepts, problem_to_json must write readably (the bench
// worker's wire carries problems this way; the fuzzer found 0.99999999-like values that did not come back).
TEST(Workload, ARangeHoldsForTheFloatAProblemKeeps) {
  for (const char* entry : {R"({"op": "rmsnorm", "rows": 1, "cols": 64, "eps": 0.99999999})",
                            R"({"op": "rmsnorm", "rows": 1, "cols": 64, "eps": 1e-50})",
                            R"({"op": "softmax", "rows": 1, "cols": 64, "scale": 9.99999999e29})",
                            R"({"op": "softmax", "rows": 1, "cols": 64, "scale": -9.99999999e29})"}) {
    auto w = runtime::parse_workload(std::string(R"({"problems": [)") + entry + "]}");
    ASSERT_FALSE(w.ok()) << entry;
    EXPECT_NE(w.status().message().find("as a float"), std::string::npos) << w.status().to_string();
  }
  for (const char* entry : {R"({"op": "rmsnorm", "rows": 1, "cols": 64, "eps": 0.9999})",
                            R"({"op": "rmsnorm", "rows": 1, "cols": 64, "eps": 1e-40})",
                            R"({"op": "softmax", "rows": 1, "cols": 64, "scale": 9.9e29})"}) {
    auto p = problem_from_json(entry);
    KILN_ASSERT_OK(p);
    auto back = problem_from_json(problem_to_json(*p));
    ASSERT_TRUE(back.ok()) << problem_to_json(*p) << ": " << back.status().to_string();
    EXPECT_EQ(*back, *p) << problem_to_json(*p);
  }
}

TEST(Workload, ExpansionIsCountedBeforeItHappens) {
  std::string m;
  for (int i = 1; i <= 1000; ++i) m += (i > 1 ? "," : "") + std::to_string(i);
  auto w = runtime::parse_workload(R"({"problems": [{"op": "gemm", "m": [)" + m + R"(], "n": [)" + m +
                                   R"(], "k": [)" + m + "]}]}");
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), ErrorCode::kOutOfRange);
  EXPECT_NE(w.status().message().find("1000000000 problems"), std::string::npos) << w.status().to_string();
  EXPECT_NE(w.status().message().find("KILN_MAX_WORKLOAD_PROBLEMS"), std::string::npos);
}

TEST(Workload, TheFileIsReadWithABound) {
  auto w = runtime::load_workload("/dev/zero");
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), ErrorCode::kOutOfRange);
  EXPECT_NE(w.status().message().find("/dev/zero"), std::string::npos) << w.status().to_string();
}

TEST(Workload, ShippedLlamaExampleParses) {
  auto w = load_workload(std::string(KILN_SOURCE_DIR) + "/examples/llama3-8b.json");
  KILN_ASSERT_OK(w);
  EXPECT_EQ(w->name, "llama3-8b");
  EXPECT_EQ(w->problems.size(), 4u * 6u + 6u + 3u);
  std::set<std::string> seen;
  for (const auto& p : w->problems) {
    KILN_EXPECT_OK(p.validate());
    EXPECT_TRUE(seen.insert(p.describe()).second) << "duplicate " << p.describe();
  }
}

TEST(Workload, ProblemJsonRoundTrips) {
  GemmProblem g = gemm(7, 4096, 40);
  g.b_layout = Layout::kColMajor;
  g.epilogue = *templates::parse_epilogue("scale+bias+relu", DType::kF32);
  g.epilogue.bias_dtype = DType::kBF16;
  GemmProblem weights = gemm(1, 4096, 4096);
  weights.b_constant = true;
  EXPECT_NE(problem_to_json(Problem::gemm(weights)).find("\"b_constant\":true"), std::string::npos);
  EXPECT_EQ(problem_to_json(Problem::gemm(g)).find("b_constant"), std::string::npos) << "written only when promised";
  for (const Problem& p : {Problem::gemm(g), Problem::gemm(weights), Problem::norm({.layernorm = true, .rows = 3, .cols = 5, .bias = true, .eps = 1e-3f}),
                           Problem::softmax({.rows = 2, .cols = 9, .dtype = DType::kF32, .scale = 0.25f})}) {
    auto back = problem_from_json(problem_to_json(p));
    KILN_ASSERT_OK(back);
    EXPECT_EQ(*back, p) << problem_to_json(p);
  }
}

}  // namespace
}  // namespace kiln::runtime
