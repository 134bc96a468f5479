// kiln's all-reduce on two GPUs, one process per rank (run_local_group): every choice against a CPU reduction
// (copy-in, zero-copy and in place; NCCL's symmetric-memory choice offered exactly when NCCL has it), tuning for
// in-place calls,
// rank agreement with one rank's timings distorted, the size dispatcher inside a CUDA graph, the fused
// all-reduce + residual + RMSNorm, decisions reused from the cache by a new group, clean teardown, and a rank
// that fails; symmetric heap tensors: zero-copy in and out of place against the staged result, their own tuned
// tables, sizes that differ across ranks (an error on every rank, no hang), and a free while a call is in flight.
// Skips without two GPUs. This process never initialises CUDA itself (its children do).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include <fmt/format.h>

#include "kiln/cache/tuning.h"
#include "kiln/jit/device.h"
#include "kiln/jit/driver.h"
#include "kiln/runtime/collective.h"
#include "kiln_test.h"

namespace kiln::runtime {
namespace {

// GPUs the NVIDIA driver lists, without initialising CUDA in this process (its children could not use it).
int visible_gpus() {
  std::error_code ec;
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
    (void)e;
    ++n;
  }
  return ec ? 0 : n;
}

#define KILN_NEED_TWO_GPUS()                                                                        \
  if (visible_gpus() < 2) GTEST_SKIP() << "needs two NVIDIA GPUs (found " << visible_gpus() << ")"

// Runs `fn` on two ranks and returns their result strings; fails the test on any rank's error.
std::vector<std::string> on_two_gpus(const RankFunction& fn) {
  install_crash_trace();
  GroupOptions g;
  g.world = 2;
  g.timeout = std::chrono::minutes(4);
  auto outcomes = run_local_group(g, fn);
  EXPECT_TRUE(outcomes.ok()) << outcomes.status().to_string();
  std::vector<std::string> out;
  if (!outcomes.ok()) return out;
  for (const auto& o : *outcomes) {
    EXPECT_TRUE(o.status.ok()) << "rank " << o.rank << ": " << o.status.to_string();
    out.push_back(o.result);
  }
  return out;
}

// on_two_gpus() for a function whose result both ranks must agree on (their decisions, figures, picks): that
// result.
std::string agreed_on_two_gpus(const RankFunction& fn) {
  auto results = on_two_gpus(fn);
  EXPECT_EQ(results.size(), 2u);
  if (results.size() != 2) return std::string();
  EXPECT_EQ(results[0], results[1]) << "the ranks disagree";
  return results[0];
}

float value(int rank, int64_t i) { return static_cast<float>((i * 5 + rank * 11) % 13) - 6.f; }

Status fill_rank_input(const DeviceBuffer& in, int rank, int64_t count) {
  std::vector<uint16_t> h(count);
  for (int64_t i = 0; i < count; ++i) templates::store_element(templates::DType::kBF16, value(rank, i), &h[i]);
  return in.copy_from_host(h.data(), count * 2);
}

Status check_sum(const DeviceBuffer& out, int world, int64_t count, const std::string& what) {
  std::vector<uint16_t> h(count);
  KILN_RETURN_IF_ERROR(out.copy_to_host(h.data(), count * 2));
  for (int64_t i = 0; i < count; ++i) {
    float want = 0;
    for (int r = 0; r < world; ++r) want += value(r, i);
    const float got = templates::load_element(templates::DType::kBF16, &h[i]);
    if (got != want) {
      return make_error(ErrorCode::kInternal, fmt::format("{}: element {} of {} is {}, want {}", what, i, count, got, want));
    }
  }
  return Status();
}

AllReduceOptions small_options() {
  AllReduceOptions o;
  o.max_bytes = size_t{8} << 20;
  o.heap_bytes = size_t{32} << 20;
  o.max_configs = 8;
  o.runs = 3;
  return o;
}

TEST(CollectiveGpu, EveryChoiceMatchesTheCpuReduction) {
  KILN_NEED_TWO_GPUS();
  const std::string agreed = agreed_on_two_gpus([](int rank, Communicator* comm) -> Result<std::string> {
    KILN_ASSIGN_OR_RETURN(auto ar, AllReduce::create(*comm, small_options()));
    int checked = 0;
    for (int64_t count : {int64_t{8}, int64_t{1000}, int64_t{65536}, int64_t{3 << 20}}) {
      KILN_ASSIGN_OR_RETURN(DeviceBuffer in, DeviceBuffer::allocate(count * 2));
      KILN_ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::allocate(count * 2));
      KILN_RETURN_IF_ERROR(fill_rank_input(in, rank, count));
      for (const auto& name : ar->choice_names(count)) {
        KILN_RETURN_IF_ERROR(out.fill_bytes(0xff));
        KILN_RETURN_IF_ERROR(ar->run_choice(name, in.ptr(), out.ptr(), count, nullptr));
        KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
        KILN_CHECK(d->cuCtxSynchronize());
        KILN_RETURN_IF_ERROR(check_sum(out, comm->world(), count, name));
        // Zero-copy: the input already in the staging buffer (re-written each time: two-shot reduces in place).
        KILN_CHECK(d->cuMemcpyDtoD(ar->input_buffer(), in.ptr(), count * 2));
        KILN_RETURN_IF_ERROR(out.fill_bytes(0xff));
        KILN_RETURN_IF_ERROR(ar->run_choice(name, ar->input_buffer(), out.ptr(), count, nullptr));
        KILN_CHECK(d->cuCtxSynchronize());
        KILN_RETURN_IF_ERROR(check_sum(out, comm->world(), count, name + " (zero-copy)"));
        // In place: input and output the staging buffer. Every choice but the read one-shot can; that one is
        // refused before anything is launched, alike on every rank.
        KILN_CHECK(d->cuMemcpyDtoD(ar->input_buffer(), in.ptr(), count * 2));
        Status in_place = ar->run_choice(name, ar->input_buffer(), ar->input_buffer(), count, nullptr);
        if (name.find("_oneshot_") != std::string::npos) {
          if (in_place.code() != ErrorCode::kInvalidArgument) {
            return make_error(ErrorCode::kInternal, name + " accepted an in-place call: " + in_place.to_string());
          }
        } else {
          KILN_RETURN_IF_ERROR(in_place);
          KILN_CHECK(d->cuCtxSynchronize());
          KILN_CHECK(d->cuMemcpyDtoD(out.ptr(), ar->input_buffer(), count * 2));
          KILN_RETURN_IF_ERROR(check_sum(out, comm->world(), count, name + " (in place)"));
        }
        ++checked;
      }
    }
    // NCCL 2.27 and newer register a symmetric window, and its all-reduce is one of the choices.
    KILN_ASSIGN_OR_RETURN(int version, nccl_version());
    const auto small = ar->choice_names(1024);
    const bool symmetric = std::find(small.begin(), small.end(), "nccl_symmetric") != small.end();
    if (symmetric != (version >= 22700)) {
      return make_error(ErrorCode::kInternal, fmt::format("NCCL {}: nccl_symmetric offered: {}", version, symmetric));
    }
    // An output inside the staging buffer is refused (the peers read it while the kernel would write it).
    const auto names = ar->choice_names(1024);
    if (names.size() < 3) return make_error(ErrorCode::kInternal, "no template choice at 1024 elements");
    Status aliased = ar->run_choice(names.back(), ar->input_buffer(), ar->input_buffer() + 4096, 1024, nullptr);
    if (aliased.code() != ErrorCode::kInvalidArgument) return make_error(ErrorCode::kInternal, "aliased output accepted: " + aliased.to_string());
    return std::to_string(checked);
  });
  EXPECT_GT(std::atoi(agreed.c_str()), 8);  // NCCL and several templates at each size
}

// The push one-shot serves messages up to one slot of its area (push_area_bytes / (2 world)): 8 MiB here (the
// staging bound), the 6 MiB message above included; a smaller area leaves it out above its slot, 0 everywhere.
TEST(CollectiveGpu, PushAreaBoundsThePushChoices) {
  KILN_NEED_TWO_GPUS();
  const std::string agreed = agreed_on_two_gpus([](int, Communicator* comm) -> Result<std::string> {
    auto pushes = [](const std::vector<std::string>& names) {
      return std::count_if(names.begin(), names.end(), [](const std::string& n) { return n.find("_push_") != std::string::npos; });
    };
    std::string out;
    for (size_t area : {size_t{128} << 20, size_t{16} << 20, size_t{0}}) {
      AllReduceOptions o = small_options();
      o.push_area_bytes = area;
      KILN_ASSIGN_OR_RETURN(auto ar, AllReduce::create(*comm, o));
      out += fmt::format("{}:{}/{} ", area >> 20, int{pushes(ar->choice_names(int64_t{3} << 20)) > 0},
                         int{pushes(ar->choice_names(1024)) > 0});
    }
    return out;
  });
  // 128 MiB: 32 MiB slots (bounded by max_bytes 8 MiB); 16 MiB: 4 MiB slots (not 6 MiB); 0: none.
  EXPECT_EQ(agreed, "128:1/1 16:0/1 0:0/0 ");
}

TEST(CollectiveGpu, RanksAgreeWhenOneRanksTimingsAreDistorted) {
  KILN_NEED_TWO_GPUS();
  const std::string agreed = agreed_on_two_gpus([](int rank, Communicator* comm) -> Result<std::string> {
    AllReduceOptions o = small_options();
    // Rank 1 sees NCCL as 100x slower and every two-shot configuration as 10x faster than it measured: alone,
    // it would choose differently from rank 0.
    o.distort = [](int r, const std::string& name, double us) {
      if (r != 1) return us;
      if (name == "nccl") return us * 100;
      return name.find("twoshot") != std::string::npos ? us / 10 : us;
    };
    KILN_ASSIGN_OR_RETURN(auto ar, AllReduce::create(*comm, o));
    KILN_ASSIGN_OR_RETURN(auto reports, ar->tune({4096, 65536, 1 << 20}));
    // Every figure each rank decided on, in order: identical on both ranks, or the decisions could differ.
    std::string seen;
    for (const auto& r : reports) {
      seen += r.chosen + ";";
      for (const auto& c : r.choices) seen += fmt::format("{}={:.4f};", c.name, c.ok ? c.us : -1.0);
    }
    (void)rank;
    return seen;
  });
  // Rank 1's inflated NCCL figure is everyone's (the maximum over ranks), so NCCL is never chosen.
  EXPECT_EQ(agreed.find(";nccl;"), std::string::npos) << agreed;
  EXPECT_NE(agreed.rfind("nccl;", 0), 0u) << agreed;
}

TEST(CollectiveGpu, DispatcherPicksPerSizeAndRunsInsideACudaGraph) {
  KILN_NEED_TWO_GPUS();
  agreed_on_two_gpus([](int rank, Communicator* comm) -> Result<std::string> {
    KILN_ASSIGN_OR_RETURN(auto ar, AllReduce::create(*comm, small_options()));
    KILN_ASSIGN_OR_RETURN(auto reports, ar->tune({4096, 65536, size_t{4} << 20}));
    const std::vector<int64_t> counts{1000, 20000, 1 << 20};
    std::string picks;
    for (int64_t c : counts) picks += ar->choice_for(c) + ";";
    KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
    KILN_ASSIGN_OR_RETURN(Stream stream, Stream::create());
    std::vector<DeviceBuffer> ins, outs;
    for (int64_t c : counts) {
      KILN_ASSIGN_OR_RETURN(DeviceBuffer in, DeviceBuffer::allocate(c * 2));
      KILN_ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::allocate(c * 2));
      KILN_RETURN_IF_ERROR(fill_rank_input(in, rank, c));
      ins.push_back(std::move(in));
      outs.push_back(std::move(out));
    }
    // Capture one call of each size twice, replay the graph three times: the epochs and staging buffers must
    // carry over between calls and replays.
    CUgraph graph = nullptr;
    KILN_CHECK(d->cuStreamBeginCapture(stream.get(), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    Status st;
    for (int rep = 0; rep < 2 && st.ok(); ++rep) {
      for (size_t i = 0; i < counts.size() && st.ok(); ++i) st = ar->run(ins[i].ptr(), outs[i].ptr(), counts[i], stream.get());
    }
    KILN_CHECK(d->cuStreamEndCapture(stream.get(), &graph));
    KILN_RETURN_IF_ERROR(st);
    CUgraphExec exec = nullptr;
    KILN_CHECK(d->cuGraphInstantiateWithFlags(&exec, graph, 0));
    for (int i = 0; i < 3; ++i) KILN_CHECK(d->cuGraphLaunch(exec, stream.get()));
    KILN_RETURN_IF_ERROR(stream.synchronize());
    d->cuGraphExecDestroy(exec);
    d->cuGraphDestroy(graph);
    for (size_t i = 0; i < counts.size(); ++i) {
      KILN_RETURN_IF_ERROR(check_sum(outs[i], comm->world(), counts[i], "graph replay of " + ar->choice_for(counts[i])));
    }
    // Above the last bucket: NCCL.
    if (ar->choice_for(int64_t{3} << 20) != "nccl") return make_error(ErrorCode::kInternal, "above the last bucket is not NCCL");
    return picks;
  });
}

TEST(CollectiveGpu, InPlaceTuningLeavesOutTheReadOneShotAndReducesInPlace) {
  KILN_NEED_TWO_GPUS();
  agreed_on_two_gpus([](int rank, Communicator* comm) -> Result<std::string> {
    AllReduceOptions o = small_options();
    o.in_place = true;
    KILN_ASSIGN_OR_RETURN(auto ar, AllReduce::create(*comm, o));
    const std::vector<size_t> buckets{4096, size_t{4} << 20};
    KILN_ASSIGN_OR_RETURN(auto reports, ar->tune(buckets));
    std::string picks;
    KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
    for (const auto& r : reports) {
      bool twoshot = false;
      for (const auto& c : r.choices) {
        if (c.name.find("_oneshot_") != std::string::npos) return make_error(ErrorCode::kInternal, "measured " + c.name);
        twoshot = twoshot || (c.ok && c.name.find("_twoshot_") != std::string::npos);
      }
      if (!twoshot) return make_error(ErrorCode::kInternal, fmt::format("no two-shot measured at {} bytes", r.bytes));
      const int64_t count = static_cast<int64_t>(r.bytes / 2);
      KILN_ASSIGN_OR_RETURN(DeviceBuffer in, DeviceBuffer::allocate(r.bytes));
      KILN_RETURN_IF_ERROR(fill_rank_input(in, rank, count));
      // Twice: the second call's input is written over the first call's result.
      for (int rep = 0; rep < 2; ++rep) {
        KILN_CHECK(d->cuMemcpyDtoD(ar->input_buffer(), in.ptr(), r.bytes));
        KILN_RETURN_IF_ERROR(ar->run(ar->input_buffer(), ar->input_buffer(), count, nullptr));
        KILN_CHECK(d->cuCtxSynchronize());
        KILN_ASSIGN_OR_RETURN(DeviceBuffer result, DeviceBuffer::allocate(r.bytes));
        KILN_CHECK(d->cuMemcpyDtoD(result.ptr(), ar->input_buffer(), r.bytes));
        KILN_RETURN_IF_ERROR(check_sum(result, comm->world(), count, "in place with " + r.chosen));
      }
      picks += r.chosen + ";";
    }
    return picks;
  });
}

// The writes-only two-shot (push2) serves in-place calls on peer-mapped memory: heap tensors and the staging
// buffer, back to back without a sync (its slots alternate by launch parity), at sizes whose chunks are not whole
// tiles of the grid; an out-of-place call is refused on every rank before anything is launched.
TEST(CollectiveGpu, WritesOnlyTwoShotReducesInPlaceBackToBack) {
  KILN_NEED_TWO_GPUS();
  const std::string agreed = agreed_on_two_gpus([](int rank, Communicator* comm) -> Result<std::string> {
    AllReduceOptions o = small_options();
    o.in_place = true;
    KILN_ASSIGN_OR_RETURN(auto ar, AllReduce::create(*comm, o));
    KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
    int checked = 0;
    for (int64_t count : {int64_t{8}, int64_t{1000}, int64_t{65544}, int64_t{3 << 20}}) {
      const size_t bytes = static_cast<size_t>(count) * 2;
      KILN_ASSIGN_OR_RETURN(DeviceBuffer in, DeviceBuffer::allocate(bytes));
      KILN_ASSIGN_OR_RETURN(DeviceBuffer got, DeviceBuffer::allocate(bytes));
      KILN_RETURN_IF_ERROR(fill_rank_input(in, rank, count));
      std::vector<CUdeviceptr> xs;
      for (int i = 0; i < 3; ++i) {
        KILN_ASSIGN_OR_RETURN(CUdeviceptr x, ar->allocate(bytes));
        xs.push_back(x);
      }
      int push2 = 0;
      for (const auto& name : ar->choice_names(count)) {
        if (name.find("_push2_") == std::string::npos) continue;
        ++push2;
        for (CUdeviceptr x : xs) KILN_CHECK(d->cuMemcpyDtoD(x, in.ptr(), bytes));
        for (CUdeviceptr x : xs) KILN_RETURN_IF_ERROR(ar->run_choice(name, x, x, count, nullptr));
        KILN_CHECK(d->cuCtxSynchronize());
        for (size_t i = 0; i < xs.size(); ++i) {
          KILN_CHECK(d->cuMemcpyDtoD(got.ptr(), xs[i], bytes));
          KILN_RETURN_IF_ERROR(check_sum(got, comm->world(), count, fmt::format("{} (heap, call {})", name, i)));
        }
        KILN_CHECK(d->cuMemcpyDtoD(ar->input_buffer(), in.ptr(), bytes));
        KILN_RETURN_IF_ERROR(ar->run_choice(name, ar->input_buffer(), ar->input_buffer(), count, nullptr));
        KILN_CHECK(d->cuCtxSynchronize());
        KILN_CHECK(d->cuMemcpyDtoD(got.ptr(), ar->input_buffer(), bytes));
        KILN_RETURN_IF_ERROR(check_sum(got, comm->world(), count, name + " (staging, in place)"));
        Status out_of_place = ar->run_choice(name, xs[0], xs[1], count, nullptr);
        if (out_of_place.code() != ErrorCode::kInvalidArgument) {
          return make_error(ErrorCode::kInternal, name + " accepted an out-of-place call: " + out_of_place.to_string());
        }
        ++checked;
      }
      if (push2 == 0) return make_error(ErrorCode::kInternal, fmt::format("no push2 choice at {} elements", count));
      for (CUdeviceptr x : xs) KILN_RETURN_IF_ERROR(ar->free(x));
    }
    return std::to_string(checked);
  });
  EXPECT_GE(std::atoi(agreed.c_str()), 8);
}

TEST(CollectiveGpu, FusedAllReduceResidualRmsNormMatchesAndRanksAgree) {
  KILN_NEED_TWO_GPUS();
  const std::string agreed = agreed_on_two_gpus([](int rank, Communicator* comm) -> Result<std::string> {
    std::string out;
    int fused_ok = 0;
    // x where the fused kernel reads it (zero-copy), then x anywhere (the kernel copies it into the staging buffer).
    for (bool zero_copy : {true, false}) {
      AllReduceOptions o = small_options();
      o.zero_copy = zero_copy;
      KILN_ASSIGN_OR_RETURN(auto ar, AllReduce::create(*comm, o));
      KILN_RETURN_IF_ERROR(ar->tune({8192, 65536, 1 << 20}).status());
      // tune_fused checks every fused configuration and both unfused pairs against a CPU reference before it may
      // win (a wrong one is recorded as failed), so a failure shows in the reports.
      KILN_ASSIGN_OR_RETURN(auto reports, ar->tune_fused(4096, {1, 16, 64}));
      for (const auto& r : reports) {
        out += r.chosen + ";";
        for (const auto& c : r.choices) {
          if (!c.ok && c.error.find("wrong") != std::string::npos) return make_error(ErrorCode::kInternal, c.name + ": " + c.error);
          if (c.ok && c.name.rfind("unfused:", 0) != 0) ++fused_ok;
          if (c.ok && c.name.rfind("unfused:", 0) == 0) out += "pair;";
        }
      }
    }
    if (fused_ok == 0) return make_error(ErrorCode::kInternal, "no fused configuration ran: " + out);
    (void)rank;
    return out;
  });
  // At least one unfused pair was measured at each of the three row counts, in both runs.
  size_t pairs = 0;
  for (size_t p = agreed.find("pair;"); p != std::string::npos; p = agreed.find("pair;", p + 1)) ++pairs;
  EXPECT_GE(pairs, 6u) << agreed;
}

TEST(CollectiveGpu, ANewGroupUsesTheStoredDecisions) {
  KILN_NEED_TWO_GPUS();
  const std::string dir = fmt::format("/tmp/kiln_collective_cache_{}", ::getpid());
  std::filesystem::remove_all(dir);
  auto tune_once = [&](int, Communicator* comm) -> Result<std::string> {
    AllReduceOptions o = small_options();
    cache::StoreOptions so;
    so.dir = dir;
    KILN_ASSIGN_OR_RETURN(auto c, cache::TuningCache::open(cache::TuneMode::kTune, so));
    o.cache = std::move(c);
    KILN_ASSIGN_OR_RETURN(auto ar, AllReduce::create(*comm, o));
    KILN_ASSIGN_OR_RETURN(auto reports, ar->tune({4096, 1 << 20}));
    std::string out;
    for (const auto& r : reports) out += fmt::format("{}:{};", r.chosen, r.from_cache ? "cached" : "tuned");
    return out;
  };
  const std::string first = agreed_on_two_gpus(tune_once);
  const std::string second = agreed_on_two_gpus(tune_once);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(first.find("cached"), std::string::npos) << first;
  std::string expect = first;
  for (size_t p = expect.find("tuned"); p != std::string::npos; p = expect.find("tuned")) expect.replace(p, 5, "cached");
  EXPECT_EQ(second, expect);
}

TEST(CollectiveGpu, RepeatedCreateAndDestroyReleasesEverything) {
  KILN_NEED_TWO_GPUS();
  auto results = on_two_gpus([](int rank, Communicator* comm) -> Result<std::string> {
    KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
    size_t free0 = 0, total = 0, free1 = 0;
    {
      // The first creation loads kernels and NCCL's own buffers; measure from after it.
      KILN_ASSIGN_OR_RETURN(auto warm, AllReduce::create(*comm, small_options()));
    }
    KILN_CHECK(d->cuMemGetInfo(&free0, &total));
    for (int i = 0; i < 3; ++i) {
      AllReduceOptions o = small_options();
      o.max_bytes = size_t{64} << 20;
      KILN_ASSIGN_OR_RETURN(auto ar, AllReduce::create(*comm, o));
      KILN_ASSIGN_OR_RETURN(DeviceBuffer in, DeviceBuffer::allocate(8192));
      KILN_ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::allocate(8192));
      KILN_RETURN_IF_ERROR(fill_rank_input(in, rank, 4096));
      KILN_RETURN_IF_ERROR(ar->run(in.ptr(), out.ptr(), 4096, nullptr));
      KILN_CHECK(d->cuCtxSynchronize());
      KILN_RETURN_IF_ERROR(check_sum(out, comm->world(), 4096, "after re-creation"));
    }
    KILN_CHECK(d->cuMemGetInfo(&free1, &total));
    // Three 64 MiB staging buffers would be 192 MiB if leaked; allow 16 MiB of allocator noise.
    if (free1 + (size_t{16} << 20) < free0) {
      return make_error(ErrorCode::kInternal, fmt::format("{} MiB not released", (free0 - free1) >> 20));
    }
    return std::string("ok");
  });
  ASSERT_EQ(results.size(), 2u);
}

TEST(CollectiveGpu, ARankThatFailsEndsTheGroupWithItsError) {
  KILN_NEED_TWO_GPUS();
  GroupOptions g;
  g.world = 2;
  g.grace = std::chrono::seconds(5);
  g.timeout = std::chrono::minutes(2);
  auto outcomes = run_local_group(g, [](int rank, Communicator* comm) -> Result<std::string> {
    if (rank == 1) return make_error(ErrorCode::kInternal, "rank 1 gives up before the collective");
    // Rank 0 enters a collective that rank 1 never joins: it can only end by being killed.
    KILN_ASSIGN_OR_RETURN(auto ar, AllReduce::create(*comm, small_options()));
    return std::string("unreachable");
  });
  ASSERT_TRUE(outcomes.ok()) << outcomes.status().to_string();
  ASSERT_EQ(outcomes->size(), 2u);
  EXPECT_NE((*outcomes)[1].status.message().find("gives up"), std::string::npos) << (*outcomes)[1].status.to_string();
  EXPECT_FALSE((*outcomes)[0].status.ok());
  EXPECT_NE((*outcomes)[0].status.to_string().find("rank 1"), std::string::npos) << (*outcomes)[0].status.to_string();
}

// Symmetric tensors: every choice, out of place (the input keeps its value: the two-shot's all-gather must not
// write into it) and in place, gives the CPU reduction, as the staged call does; run() classifies the calls.
TEST(CollectiveGpu, HeapTensorsReduceZeroCopyLikeTheStagedPath) {
  KILN_NEED_TWO_GPUS();
  const std::string agreed = agreed_on_two_gpus([](int rank, Communicator* comm) -> Result<std::string> {
    KILN_ASSIGN_OR_RETURN(auto ar, AllReduce::create(*comm, small_options()));
    KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
    int checked = 0;
    for (int64_t count : {int64_t{8}, int64_t{1000}, int64_t{65536}, int64_t{3 << 20}}) {
      const size_t bytes = static_cast<size_t>(count) * 2;
      KILN_ASSIGN_OR_RETURN(DeviceBuffer in, DeviceBuffer::allocate(bytes));
      KILN_ASSIGN_OR_RETURN(DeviceBuffer got, DeviceBuffer::allocate(bytes));
      KILN_RETURN_IF_ERROR(fill_rank_input(in, rank, count));
      KILN_ASSIGN_OR_RETURN(CUdeviceptr x, ar->allocate(bytes));
      KILN_ASSIGN_OR_RETURN(CUdeviceptr y, ar->allocate(bytes));
      if (!ar->is_symmetric(x, bytes) || ar->is_symmetric(in.ptr(), bytes) || ar->is_symmetric(x, bytes + 4096)) {
        return make_error(ErrorCode::kInternal, "is_symmetric is wrong");
      }
      if (ar->call_kind(x, y, count) != AllReduceCall::kSymmetric ||
          ar->call_kind(x, x, count) != AllReduceCall::kSymmetricInPlace ||
          ar->call_kind(in.ptr(), y, count) != AllReduceCall::kStaged) {
        return make_error(ErrorCode::kInternal, "call_kind is wrong");
      }
      for (const auto& name : ar->choice_names(count)) {
        KILN_CHECK(d->cuMemcpyDtoD(x, in.ptr(), bytes));
        KILN_CHECK(d->cuMemsetD8(y, 0xff, bytes));
        KILN_RETURN_IF_ERROR(ar->run_choice(name, x, y, count, nullptr));
        KILN_CHECK(d->cuCtxSynchronize());
        KILN_CHECK(d->cuMemcpyDtoD(got.ptr(), y, bytes));
        KILN_RETURN_IF_ERROR(check_sum(got, comm->world(), count, name + " (heap, out of place)"));
        KILN_CHECK(d->cuMemcpyDtoD(got.ptr(), x, bytes));
        {
          std::vector<uint16_t> a(count), b(count);
          KILN_RETURN_IF_ERROR(in.copy_to_host(a.data(), bytes));
          KILN_RETURN_IF_ERROR(got.copy_to_host(b.data(), bytes));
          if (a != b) return make_error(ErrorCode::kInternal, name + " overwrote its heap input out of place");
        }
        Status in_place = ar->run_choice(name, x, x, count, nullptr);
        if (name.find("_oneshot_") != std::string::npos) {
          if (in_place.code() != ErrorCode::kInvalidArgument) {
            return make_error(ErrorCode::kInternal, name + " accepted an in-place call: " + in_place.to_string());
          }
        } else {
          KILN_RETURN_IF_ERROR(in_place);
          KILN_CHECK(d->cuCtxSynchronize());
          KILN_CHECK(d->cuMemcpyDtoD(got.ptr(), x, bytes));
          KILN_RETURN_IF_ERROR(check_sum(got, comm->world(), count, name + " (heap, in place)"));
        }
        ++checked;
      }
      KILN_RETURN_IF_ERROR(ar->free(y));
      KILN_RETURN_IF_ERROR(ar->free(x));
    }
    if (ar->heap_used() != 0) return make_error(ErrorCode::kInternal, fmt::format("{} heap bytes left", ar->heap_used()));
    return std::to_string(checked);
  });
  EXPECT_GT(std::atoi(agreed.c_str()), 8);
}

// Each kind of call has its own table: tuned separately, run() dispatches heap tensors from theirs (the in-place
// table never holds the read one-shot), and the results are right, eager and inside a CUDA graph.
TEST(CollectiveGpu, EachKindOfCallDispatchesFromItsOwnTable) {
  KILN_NEED_TWO_GPUS();
  agreed_on_two_gpus([](int rank, Communicator* comm) -> Result<std::string> {
    KILN_ASSIGN_OR_RETURN(auto ar, AllReduce::create(*comm, small_options()));
    const std::vector<size_t> buckets{4096, 65536, size_t{4} << 20};
    std::string picks;
    for (AllReduceCall call : {AllReduceCall::kStaged, AllReduceCall::kSymmetric, AllReduceCall::kSymmetricInPlace}) {
      KILN_ASSIGN_OR_RETURN(auto reports, ar->tune(call, buckets));
      for (const auto& r : reports) {
        if (r.call != call_name(call)) return make_error(ErrorCode::kInternal, "report of the wrong kind: " + r.call);
        if (call == AllReduceCall::kSymmetricInPlace && r.chosen.find("_oneshot_") != std::string::npos) {
          return make_error(ErrorCode::kInternal, "the in-place table holds " + r.chosen);
        }
        if (ar->choice_for(static_cast<int64_t>(r.bytes / 2), call) != r.chosen) {
          return make_error(ErrorCode::kInternal, "choice_for disagrees with the report");
        }
        picks += r.chosen + ";";
      }
    }
    KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
    KILN_ASSIGN_OR_RETURN(Stream stream, Stream::create());
    for (int64_t count : {int64_t{2000}, int64_t{30000}, int64_t{1 << 20}}) {
      const size_t bytes = static_cast<size_t>(count) * 2;
      KILN_ASSIGN_OR_RETURN(DeviceBuffer in, DeviceBuffer::allocate(bytes));
      KILN_ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::allocate(bytes));
      KILN_RETURN_IF_ERROR(fill_rank_input(in, rank, count));
      KILN_ASSIGN_OR_RETURN(CUdeviceptr x, ar->allocate(bytes));
      KILN_ASSIGN_OR_RETURN(CUdeviceptr y, ar->allocate(bytes));
      // Staged, symmetric out of place, symmetric in place (twice: the second reduces the first's input again).
      KILN_RETURN_IF_ERROR(ar->run(in.ptr(), out.ptr(), count, stream.get()));
      KILN_RETURN_IF_ERROR(stream.synchronize());
      KILN_RETURN_IF_ERROR(check_sum(out, comm->world(), count, "staged " + ar->choice_for(count, AllReduceCall::kStaged)));
      KILN_CHECK(d->cuMemcpyDtoD(x, in.ptr(), bytes));
      KILN_RETURN_IF_ERROR(ar->run(x, y, count, stream.get()));
      KILN_RETURN_IF_ERROR(stream.synchronize());
      KILN_CHECK(d->cuMemcpyDtoD(out.ptr(), y, bytes));
      KILN_RETURN_IF_ERROR(check_sum(out, comm->world(), count, "symmetric " + ar->choice_for(count, AllReduceCall::kSymmetric)));
      KILN_RETURN_IF_ERROR(ar->run(x, x, count, stream.get()));
      KILN_RETURN_IF_ERROR(stream.synchronize());
      KILN_CHECK(d->cuMemcpyDtoD(out.ptr(), x, bytes));
      KILN_RETURN_IF_ERROR(check_sum(out, comm->world(), count,
                                     "in place " + ar->choice_for(count, AllReduceCall::kSymmetricInPlace)));
      // Inside a CUDA graph: heap tensors out of place, replayed three times.
      KILN_CHECK(d->cuMemcpyDtoD(x, in.ptr(), bytes));
      CUgraph graph = nullptr;
      KILN_CHECK(d->cuStreamBeginCapture(stream.get(), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
      Status st = ar->run(x, y, count, stream.get());
      KILN_CHECK(d->cuStreamEndCapture(stream.get(), &graph));
      KILN_RETURN_IF_ERROR(st);
      CUgraphExec exec = nullptr;
      KILN_CHECK(d->cuGraphInstantiateWithFlags(&exec, graph, 0));
      for (int i = 0; i < 3; ++i) KILN_CHECK(d->cuGraphLaunch(exec, stream.get()));
      KILN_RETURN_IF_ERROR(stream.synchronize());
      d->cuGraphExecDestroy(exec);
      d->cuGraphDestroy(graph);
      KILN_CHECK(d->cuMemcpyDtoD(out.ptr(), y, bytes));
      KILN_RETURN_IF_ERROR(check_sum(out, comm->world(), count, "graph replay on heap tensors"));
      KILN_RETURN_IF_ERROR(ar->free(x));
      KILN_RETURN_IF_ERROR(ar->free(y));
    }
    return picks;
  });
}

// A rank that asks another size gets an error naming both sizes, and so does its peer: no rank allocates, no
// rank hangs, and the next agreeing allocate works. Ranks whose heaps diverged (one freed a tensor the other
// kept) are told so at the next allocate. Double and foreign frees are refused by pointer.
TEST(CollectiveGpu, MismatchedAllocationsFailOnEveryRankWithoutHanging) {
  KILN_NEED_TWO_GPUS();
  install_crash_trace();
  GroupOptions g;
  g.world = 2;
  g.timeout = std::chrono::minutes(2);  // a hang ends the test as a timed-out rank
  auto outcomes = run_local_group(g, [](int rank, Communicator* comm) -> Result<std::string> {
    KILN_ASSIGN_OR_RETURN(auto ar, AllReduce::create(*comm, small_options()));
    std::string out;
    auto mismatched = ar->allocate(rank == 0 ? 4096 : 8192);
    if (mismatched.ok()) return make_error(ErrorCode::kInternal, "mismatched sizes allocated");
    out += fmt::format("{}|{};", static_cast<int>(mismatched.status().code()), mismatched.status().message());
    if (ar->heap_used() != 0) return make_error(ErrorCode::kInternal, "a refused allocate kept its range");
    KILN_ASSIGN_OR_RETURN(CUdeviceptr a, ar->allocate(4096));
    KILN_ASSIGN_OR_RETURN(CUdeviceptr b, ar->allocate(4096));
    // Rank 1 frees a tensor rank 0 keeps: the next allocate says the heaps diverged, on both ranks.
    if (rank == 1) KILN_RETURN_IF_ERROR(ar->free(a));
    auto diverged = ar->allocate(4096);
    if (diverged.ok()) return make_error(ErrorCode::kInternal, "diverged heaps allocated");
    out += fmt::format("{}|{};", static_cast<int>(diverged.status().code()),
                       diverged.status().message().find("diverged") != std::string::npos ? "diverged" : diverged.status().message());
    if (rank == 0) KILN_RETURN_IF_ERROR(ar->free(a));
    KILN_ASSIGN_OR_RETURN(CUdeviceptr c, ar->allocate(4096));
    out += c == a ? "reused;" : "not reused;";
    KILN_RETURN_IF_ERROR(ar->free(c));
    Status twice = ar->free(c);
    out += fmt::format("{};", static_cast<int>(twice.code()));
    Status foreign = ar->free(ar->input_buffer());
    out += fmt::format("{};", static_cast<int>(foreign.code()));
    KILN_RETURN_IF_ERROR(ar->free(b));
    return out;
  });
  ASSERT_TRUE(outcomes.ok()) << outcomes.status().to_string();
  ASSERT_EQ(outcomes->size(), 2u);
  for (const auto& o : *outcomes) {
    ASSERT_TRUE(o.status.ok()) << "rank " << o.rank << ": " << o.status.to_string();
    const std::string inv = std::to_string(static_cast<int>(ErrorCode::kInvalidArgument));
    EXPECT_EQ(o.result.rfind(inv + "|", 0), 0u) << o.result;
    EXPECT_NE(o.result.find("4096"), std::string::npos) << o.result;
    EXPECT_NE(o.result.find("8192"), std::string::npos) << o.result;
    EXPECT_NE(o.result.find(inv + "|diverged;"), std::string::npos) << o.result;
    EXPECT_NE(o.result.find("reused;" + inv + ";" + inv + ";"), std::string::npos) << o.result;
  }
  EXPECT_EQ((*outcomes)[0].result, (*outcomes)[1].result);
}

// A heap tensor freed while calls that read it are still queued: the next allocate hands the same range out
// again (the offsets must stay deterministic) only once those calls have completed, so writing the new tensor
// cannot corrupt their results.
TEST(CollectiveGpu, FreeWhileInFlightThenAllocateWaitsForTheCalls) {
  KILN_NEED_TWO_GPUS();
  agreed_on_two_gpus([](int rank, Communicator* comm) -> Result<std::string> {
    KILN_ASSIGN_OR_RETURN(auto ar, AllReduce::create(*comm, small_options()));
    KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
    const int64_t count = int64_t{4} << 20;  // 8 MiB: long enough calls that some are still queued
    const size_t bytes = static_cast<size_t>(count) * 2;
    KILN_ASSIGN_OR_RETURN(DeviceBuffer in, DeviceBuffer::allocate(bytes));
    KILN_RETURN_IF_ERROR(fill_rank_input(in, rank, count));
    KILN_ASSIGN_OR_RETURN(Stream stream, Stream::create());
    KILN_ASSIGN_OR_RETURN(CUdeviceptr x, ar->allocate(bytes));
    std::vector<DeviceBuffer> outs;
    KILN_CHECK(d->cuMemcpyDtoD(x, in.ptr(), bytes));
    // A kiln template (the two-shot: it reads every peer's x and writes the peers' staging), the same on both ranks.
    const auto names = ar->choice_names(count);
    std::string name = names.back();
    for (const auto& n : names) {
      if (n.find("_twoshot_") != std::string::npos) name = n;
    }
    for (int i = 0; i < 16; ++i) {
      KILN_ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::allocate(bytes));
      KILN_RETURN_IF_ERROR(ar->run_choice(name, x, out.ptr(), count, stream.get()));
      outs.push_back(std::move(out));
    }
    KILN_RETURN_IF_ERROR(ar->free(x));  // local, immediate; the 16 calls may still be running
    KILN_ASSIGN_OR_RETURN(CUdeviceptr again, ar->allocate(bytes));
    if (again != x) return make_error(ErrorCode::kInternal, "the freed range was not reused at the same offset");
    // allocate() returned: every call that used the range must be done.
    if (d->cuStreamQuery(stream.get()) != CUDA_SUCCESS) {
      return make_error(ErrorCode::kInternal, "allocate handed out a range still used by a queued call");
    }
    KILN_CHECK(d->cuMemsetD8(again, 0x7f, bytes));  // the new owner writes it
    KILN_RETURN_IF_ERROR(stream.synchronize());
    for (const auto& out : outs) KILN_RETURN_IF_ERROR(check_sum(out, comm->world(), count, "a call queued before the free"));
    KILN_RETURN_IF_ERROR(ar->free(again));
    return name;
  });
}

}  // namespace
}  // namespace kiln::runtime
