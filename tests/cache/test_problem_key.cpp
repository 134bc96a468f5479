// Problem keys: one canonical spelling per problem, round-trips, escaping, and every field matters.
#include <gtest/gtest.h>

#include "cache_test_util.h"
#include "kiln/cache/problem_key.h"
#include "kiln_test.h"

namespace kiln::cache {
namespace {

using testing::sample_problem;

TEST(ProblemKey, CanonicalRoundTrips) {
  ProblemKey p = sample_problem(16);
  std::string c = p.canonical();
  EXPECT_EQ(c,
            "p1;dev=NVIDIA H200,132,9.0;drv=13000;cuda=13.0;kiln=0.1.0;cublas=130100;op=gemm;"
            "t=f16/row/16x4096,f16/col/4096x4096,f16/row/16x4096;epi=bias;a=split_k=1");
  KILN_ASSERT_OK_AND_ASSIGN(ProblemKey back, ProblemKey::parse(c));
  EXPECT_EQ(back.canonical(), c);
  EXPECT_EQ(back.operands, p.operands);
  EXPECT_EQ(back.device, p.device);
  EXPECT_EQ(back.versions, p.versions);
  EXPECT_EQ(back.attributes, p.attributes);
}

TEST(ProblemKey, ReservedCharactersAreEscaped) {
  ProblemKey p = sample_problem(16);
  p.op = "weird;op=1,2/3%";
  p.epilogue = "line\nbreak";
  p.attributes = {{"k=v", "a,b"}, {"empty", ""}};
  p.operands.push_back({"f32", "", {}});
  p.operands.push_back({"i8", "x", {-1, 0, 7}});
  std::string c = p.canonical();
  EXPECT_EQ(c.find('\n'), std::string::npos);
  KILN_ASSERT_OK_AND_ASSIGN(ProblemKey back, ProblemKey::parse(c));
  EXPECT_EQ(back.op, p.op);
  EXPECT_EQ(back.epilogue, p.epilogue);
  EXPECT_EQ(back.operands, p.operands);
  EXPECT_EQ(back.canonical(), c);
}

TEST(ProblemKey, AttributeOrderDoesNotSplitAProblem) {
  ProblemKey a = sample_problem(16), b = sample_problem(16);
  a.attributes = {{"x", "1"}, {"a", "2"}};
  b.attributes = {{"a", "2"}, {"x", "1"}};
  EXPECT_EQ(a.canonical(), b.canonical());
}

TEST(ProblemKey, EveryFieldChangesTheKey) {
  const std::string base = sample_problem(16).canonical();
  std::vector<std::function<void(ProblemKey&)>> changes = {
      [](ProblemKey& p) { p.op = "gemm2"; },
      [](ProblemKey& p) { p.operands[0].dtype = "bf16"; },
      [](ProblemKey& p) { p.operands[1].layout = "row"; },
      [](ProblemKey& p) { p.operands[2].shape[1] = 4097; },
      [](ProblemKey& p) { p.operands.pop_back(); },
      [](ProblemKey& p) { p.epilogue = "relu"; },
      [](ProblemKey& p) { p.attributes[0].second = "2"; },
      [](ProblemKey& p) { p.device.name = "NVIDIA H100"; },
      [](ProblemKey& p) { p.device.sm_count = 114; },
      [](ProblemKey& p) { p.device.cc_minor = 1; },
      [](ProblemKey& p) { p.versions.driver = 13010; },
      [](ProblemKey& p) { p.versions.cuda = "13.1"; },
      [](ProblemKey& p) { p.versions.cublas = "130200"; },
      [](ProblemKey& p) { p.versions.kiln = "0.2.0"; },
  };
  std::set<std::string> seen{base};
  for (auto& change : changes) {
    ProblemKey p = sample_problem(16);
    change(p);
    EXPECT_TRUE(seen.insert(p.canonical()).second) << p.canonical();
  }
}

TEST(ProblemKey, ParseRefusesWhatCanonicalWouldNotWrite) {
  std::string c = sample_problem(16).canonical();
  EXPECT_FALSE(ProblemKey::parse("").ok());
  EXPECT_FALSE(ProblemKey::parse("p2" + c.substr(2)).ok());
  EXPECT_FALSE(ProblemKey::parse(c + ";extra=1").ok());
  std::string unsorted = c.substr(0, c.rfind(";a=")) + ";a=z=1,a=2";
  EXPECT_FALSE(ProblemKey::parse(unsorted).ok());
  std::string needless_escape = c;
  needless_escape.replace(needless_escape.find("gemm"), 4, "%67emm");
  EXPECT_FALSE(ProblemKey::parse(needless_escape).ok());
  std::string bad_shape = c;
  bad_shape.replace(bad_shape.find("16x4096"), 7, "16xabc");
  EXPECT_FALSE(ProblemKey::parse(bad_shape).ok());
  EXPECT_FALSE(ProblemKey::parse(c.substr(0, c.size() - 5) + "%4").ok());
}

TEST(ProblemKey, EnvironmentPrefixSelectsADevice) {
  ProblemKey p = sample_problem(16);
  std::string prefix = environment_prefix(p.device, p.versions);
  EXPECT_EQ(p.canonical().rfind(prefix, 0), 0u);
  ProblemKey other = p;
  other.device.sm_count = 114;
  EXPECT_NE(other.canonical().rfind(prefix, 0), 0u);
}

}  // namespace
}  // namespace kiln::cache
