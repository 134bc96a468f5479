// Shared test helpers: GPU tests skip with a clear message where there is no driver or device.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "kiln/jit/device.h"
#include "kiln/status.h"

namespace kiln::testing {

/// Why GPU tests cannot run here, or empty when a device is usable (its primary context is then current).
inline std::string gpu_unavailable_reason() {
  auto ctx = kiln::ensure_context(0);
  return ctx.ok() ? std::string() : ctx.status().to_string();
}

/// Sets an environment variable for one scope, then restores what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace kiln::testing

/// Skips the test (with the reason) unless a GPU is present; makes device 0's primary context current.
#define KILN_REQUIRE_GPU()                                                              \
  do {                                                                                  \
    std::string kiln_gpu_reason_ = ::kiln::testing::gpu_unavailable_reason();           \
    if (!kiln_gpu_reason_.empty()) GTEST_SKIP() << "needs a GPU: " << kiln_gpu_reason_; \
  } while (0)

/// Asserts that a Status or Result is ok, printing the error (with detail) when it is not.
#define KILN_ASSERT_OK(expr)                                                  \
  do {                                                                        \
    ::kiln::Status kiln_s_ = ::kiln::detail::as_status((expr));               \
    ASSERT_TRUE(kiln_s_.ok()) << kiln_s_.to_string_with_detail();             \
  } while (0)
#define KILN_EXPECT_OK(expr)                                                  \
  do {                                                                        \
    ::kiln::Status kiln_s_ = ::kiln::detail::as_status((expr));               \
    EXPECT_TRUE(kiln_s_.ok()) << kiln_s_.to_string_with_detail();             \
  } while (0)
/// `KILN_ASSERT_OK_AND_ASSIGN(auto x, f());`
#define KILN_ASSERT_OK_AND_ASSIGN(lhs, expr) \
  KILN_ASSERT_OK_AND_ASSIGN_IMPL(KILN_CONCAT(kiln_r_, __LINE__), lhs, expr)
#define KILN_ASSERT_OK_AND_ASSIGN_IMPL(tmp, lhs, expr)                        \
  auto tmp = (expr);                                                          \
  ASSERT_TRUE(tmp.ok()) << tmp.status().to_string_with_detail();              \
  lhs = std::move(tmp).value()
