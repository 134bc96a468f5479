#include <gtest/gtest.h>

#include "kiln/status.h"

namespace kiln {
namespace {

Result<int> parse_positive(int v) {
  if (v <= 0) return make_error(ErrorCode::kInvalidArgument, "not positive");
  return v;
}

Result<int> doubled(int v) {
  KILN_ASSIGN_OR_RETURN(int x, parse_positive(v));
  return 2 * x;
}

Status check_both(int a, int b) {
  KILN_RETURN_IF_ERROR(parse_positive(a));
  KILN_RETURN_IF_ERROR(parse_positive(b).with_context("checking b"));
  return Status();
}

TEST(Status, OkIsCheapAndEmpty) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), ErrorCode::kOk);
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.to_string(), "ok");
}

TEST(Status, ErrorCarriesCodeMessageDetailAndContext) {
  Status s = make_error(ErrorCode::kCompileError, "bad kernel", "line 3: error");
  s.with_context("compiling gemm");
  s.with_context("tuning problem P");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ErrorCode::kCompileError);
  EXPECT_EQ(s.detail(), "line 3: error");
  EXPECT_EQ(s.to_string(), "compile error: bad kernel (while compiling gemm; while tuning problem P)");
  EXPECT_EQ(s.to_string_with_detail(), s.to_string() + "\nline 3: error");
  Status copy = s;
  EXPECT_EQ(copy.to_string(), s.to_string());
}

TEST(Status, MakeErrorRefusesOk) {
  Status s = make_error(ErrorCode::kOk, "oops");
  EXPECT_EQ(s.code(), ErrorCode::kInternal);
}

TEST(Result, ValueAndErrorPropagate) {
  auto good = doubled(21);
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, 42);
  auto bad = doubled(-1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(bad.value_or(7), 7);
}

TEST(Result, ReturnIfErrorAddsContext) {
  EXPECT_TRUE(check_both(1, 2).ok());
  Status s = check_both(1, -2);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  ASSERT_EQ(s.context().size(), 1u);
  EXPECT_EQ(s.context()[0], "checking b");
}

TEST(Result, OkStatusWithoutValueBecomesInternalError) {
  Result<int> r{Status()};
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kInternal);
}

TEST(Result, HoldsMoveOnlyValues) {
  Result<std::unique_ptr<int>> r(std::make_unique<int>(5));
  ASSERT_TRUE(r.ok());
  std::unique_ptr<int> p = std::move(r).value();
  EXPECT_EQ(*p, 5);
}

}  // namespace
}  // namespace kiln
