// A few configurations of each of the non-GEMM templates compile with NVRTC for sm_90 (no GPU needed). The
// CLI test (templates_cli_check) compiles a covering sample of every template; this one keeps a fast,
// focused check with the compile log in the failure.
#include <gtest/gtest.h>

#include <thread>

#include "kiln/jit/compiler.h"
#include "kiln_test.h"
#include "kiln/templates/templates.h"

namespace kiln::templates {
namespace {

class CompileTest : public ::testing::TestWithParam<const char*> {};

TEST_P(CompileTest, SampleCompilesForSm90) {
  KILN_ASSERT_OK_AND_ASSIGN(TemplatePtr t, find_template(GetParam()));
  KILN_ASSERT_OK_AND_ASSIGN(DeviceLimits lim, DeviceLimits::for_target(Target{"sm_90"}));
  KILN_ASSERT_OK_AND_ASSIGN(Grid g, Grid::create(t));
  auto picks = sample(g, lim, 1);
  picks.resize(std::min<size_t>(picks.size(), 4));  // the first picks of the cover: every dtype, varied tunables
  std::vector<Status> results(picks.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < picks.size(); ++i) {
    threads.emplace_back([&, i] {
      auto r = t->render(picks[i]);
      if (!r.ok()) {
        results[i] = r.status();
        return;
      }
      auto b = compile(r->source, Target{"sm_90"});
      results[i] = b.ok() ? Status() : std::move(b).status().with_context(r->config_name);
      if (b.ok() && b->cubin.empty()) results[i] = make_error(ErrorCode::kInternal, "empty cubin");
    });
  }
  for (auto& th : threads) th.join();
  for (const Status& s : results) KILN_EXPECT_OK(s);
}

INSTANTIATE_TEST_SUITE_P(Templates, CompileTest, ::testing::Values("rmsnorm", "layernorm", "softmax", "softmax_cluster", "splitk_reduce",
                                                                   "allreduce", "allreduce_rmsnorm"));

}  // namespace
}  // namespace kiln::templates
