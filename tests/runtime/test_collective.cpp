// The collective tuner's host-side rules (no GPU): the decision rule every rank applies to the all-reduced
// figures, the fixed iteration counts, and the all-reduce templates' parameter checks.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/pool/gate.h"
#include "kiln/runtime/collective.h"
#include "kiln/templates/registry.h"
#include "kiln_test.h"

namespace kiln::runtime {
namespace {

TEST(PickCollective, FastestWinsAndFailuresNever) {
  EXPECT_EQ(pick_collective({30, 10, 20}), 1);
  EXPECT_EQ(pick_collective({1e30, 10, 20}), 1);          // a failure's figure
  EXPECT_EQ(pick_collective({INFINITY, 1e30, 0}), -1);    // nothing usable
  EXPECT_EQ(pick_collective({}), -1);
}

TEST(PickCollective, NearTiesGoToTheEarlierChoice) {
  // NCCL (index 0) within 1% of the fastest template wins; outside 1% it does not.
  EXPECT_EQ(pick_collective({10.09, 10.0, 12}), 0);
  EXPECT_EQ(pick_collective({10.2, 10.0, 12}), 1);
}

TEST(PickCollective, RanksThatMeasuredDifferentlyDecideAlikeOnTheReducedFigures) {
  // Rank 1's clock says choice 2 is fastest; rank 0's says choice 1. Both decide on the element-wise maximum,
  // which is what Communicator::all_reduce_max gives every rank, so both pick the same.
  std::vector<double> rank0{20, 10, 14}, rank1{21, 25, 12};
  std::vector<double> reduced(3);
  for (int i = 0; i < 3; ++i) reduced[i] = std::max(rank0[i], rank1[i]);
  EXPECT_NE(pick_collective(rank0), pick_collective(rank1));
  EXPECT_EQ(pick_collective(reduced), 2);  // max: {21, 25, 14}
}

TEST(CollectiveIterations, FixedBySizeOnly) {
  EXPECT_EQ(collective_iterations(4096), collective_iterations(4096));
  EXPECT_EQ(collective_iterations(1024), 100);
  EXPECT_EQ(collective_iterations(size_t{256} << 20), 5);
  for (size_t b = 1024; b <= (size_t{256} << 20); b *= 2) {
    EXPECT_GE(collective_iterations(b), 5);
    EXPECT_LE(collective_iterations(b), 100);
    EXPECT_GE(collective_iterations(b), collective_iterations(b * 2));
  }
}

TEST(AllReduceTemplates, RefuseWhatTheyCannotRun) {
  KILN_ASSERT_OK_AND_ASSIGN(templates::TemplatePtr t, templates::find_template("allreduce"));
  KILN_ASSERT_OK_AND_ASSIGN(templates::DeviceLimits lim, templates::DeviceLimits::for_target(Target{"sm_90"}));
  templates::Params p{{"dtype", templates::Value::dtype(templates::DType::kBF16)},
                      {"world", templates::Value::integer(2)},
                      {"algo", templates::Value::enumeration("twoshot")},
                      {"vec", templates::Value::integer(8)},
                      {"threads", templates::Value::integer(512)},
                      {"blocks", templates::Value::integer(32)}};
  KILN_ASSERT_OK_AND_ASSIGN(templates::Params full, t->complete(p));
  KILN_EXPECT_OK(t->check(full, lim));
  KILN_EXPECT_OK(t->check_problem(full, templates::Shape{.m = 4096}));
  EXPECT_EQ(t->check_problem(full, templates::Shape{.m = 4100}).code(), ErrorCode::kInvalidArgument);  // not a multiple of vec
  auto wide = full;
  wide["world"] = templates::Value::integer(16);
  EXPECT_EQ(t->check(wide, lim).code(), ErrorCode::kOutOfRange);
  auto f32 = full;
  f32["dtype"] = templates::Value::dtype(templates::DType::kF32);  // 8 x 4 bytes is over 16
  EXPECT_EQ(t->check(f32, lim).code(), ErrorCode::kOutOfRange);
  KILN_ASSERT_OK_AND_ASSIGN(templates::Rendered r, t->render(p));
  EXPECT_EQ(r.config_name, "allreduce_bf16_w2_twoshot_v8_t512_b32");
  EXPECT_NE(r.source.source.find("constexpr bool kTwoShot = true;"), std::string::npos);

  KILN_ASSERT_OK_AND_ASSIGN(templates::TemplatePtr fused, templates::find_template("allreduce_rmsnorm"));
  templates::Params fp{{"dtype", templates::Value::dtype(templates::DType::kBF16)},
                       {"world", templates::Value::integer(2)},
                       {"algo", templates::Value::enumeration("push")},
                       {"vec", templates::Value::integer(8)},
                       {"threads", templates::Value::integer(512)},
                       {"blocks", templates::Value::integer(32)},
                       {"items", templates::Value::integer(1)}};
  KILN_ASSERT_OK_AND_ASSIGN(templates::Params ffull, fused->complete(fp));
  KILN_EXPECT_OK(fused->check_problem(ffull, templates::Shape{.m = 16, .n = 4096}));  // 512 x 8 x 1 columns
  EXPECT_EQ(fused->check_problem(ffull, templates::Shape{.m = 16, .n = 8192}).code(), ErrorCode::kInvalidArgument);
  KILN_ASSERT_OK_AND_ASSIGN(templates::Rendered fr, fused->render(fp));
  EXPECT_EQ(fr.config_name, "allreduce_rmsnorm_bf16_w2_push_v8_t512_b32_i1");
  EXPECT_NE(fr.source.source.find("constexpr bool kPush = true;"), std::string::npos);
}

}  // namespace
}  // namespace kiln::runtime

namespace kiln::runtime {
namespace {

// What AllReduce::create does before it needs a GPU, inside the ranks of a group (forked processes, as the
// benchmark and the multi-GPU tests run it): render a sample of both templates and compile it through the
// default executor and a precompile gate.
TEST(AllReduceTemplates, CompileThroughTheGateInsideGroupRanks) {
  GroupOptions g;
  g.world = 2;
  g.nccl = false;
  auto outcomes = run_local_group(g, [](int, Communicator*) -> Result<std::string> {
    KILN_ASSIGN_OR_RETURN(auto executor, make_executor());
    GateOptions go;
    go.executor = executor;
    KILN_ASSIGN_OR_RETURN(auto gate, PrecompileGate::create(std::move(go)));
    KILN_ASSIGN_OR_RETURN(templates::DeviceLimits lim, templates::DeviceLimits::for_target(Target{"sm_90"}));
    int compiled = 0;
    for (const char* name : {"allreduce", "allreduce_rmsnorm"}) {
      KILN_ASSIGN_OR_RETURN(templates::TemplatePtr t, templates::find_template(name));
      templates::Params fixed{{"dtype", templates::Value::dtype(templates::DType::kBF16)},
                              {"world", templates::Value::integer(2)}};
      KILN_ASSIGN_OR_RETURN(templates::Grid grid, templates::Grid::create(t, fixed));
      std::vector<Future<Binary>> futures;
      for (auto& p : templates::sample(grid, lim, 3)) {
        KILN_ASSIGN_OR_RETURN(templates::Rendered r, t->render(p));
        // What AllReduce checks per call, on the rendered (complete) parameters.
        templates::Shape shape{.m = 16, .n = 1024};
        if (t->name() == "allreduce") shape = templates::Shape{.m = 65536};
        KILN_RETURN_IF_ERROR(t->check_problem(r.params, shape).with_context(r.config_name));
        KILN_RETURN_IF_ERROR(t->geometry(r.params, shape).status());
        futures.push_back(gate->precompile(r.source, Target{"sm_90"}));
      }
      for (auto& f : futures) {
        KILN_RETURN_IF_ERROR(f.get().status());
        ++compiled;
      }
    }
    return std::to_string(compiled);
  });
  ASSERT_TRUE(outcomes.ok()) << outcomes.status().to_string();
  for (const auto& o : *outcomes) {
    ASSERT_TRUE(o.status.ok()) << "rank " << o.rank << ": " << o.status.to_string();
    EXPECT_GE(std::stoi(o.result), 6);
  }
}

}  // namespace
}  // namespace kiln::runtime
