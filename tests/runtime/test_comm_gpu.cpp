// Communicators on 2+ GPUs: run_local_group with NCCL, the control collectives, wrap() of an application's
// communicator, an owned one's teardown, CUDA IPC peer buffers, and a rank that dies inside a collective.
//
// This process never initialises CUDA: every check that needs the GPU runs inside a rank (a forked child
// cannot use CUDA once its parent has), including the probe that decides whether to skip. Ranks cannot use
// gtest's assertions (their process ends with _exit), so they return a kWrongResult error saying what differed
// and this process asserts on the outcomes.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kiln/jit/driver.h"
#include "kiln/runtime/comm.h"
#include "kiln_test.h"
#include "nccl_api.h"

namespace kiln::runtime {
namespace {

using namespace std::chrono_literals;

#define RANK_CHECK(cond, ...)                                                                           \
  do {                                                                                                  \
    if (!(cond)) {                                                                                      \
      return make_error(ErrorCode::kWrongResult, fmt::format("rank {}: {} [line {}]", rank, #cond " - " \
                                                             + fmt::format(__VA_ARGS__), __LINE__));    \
    }                                                                                                   \
  } while (0)

/// Why these tests cannot run here, or empty. Decided once, in a rank of its own.
std::string skip_reason() {
  static const std::string reason = [] {
    if (auto v = nccl_version(); !v.ok()) return "needs NCCL: " + v.status().to_string();
    GroupOptions probe;
    probe.world = 1;
    probe.nccl = false;
    probe.timeout = 2min;
    auto outcomes = run_local_group(probe, [](int, Communicator*) -> Result<std::string> {
      KILN_ASSIGN_OR_RETURN(int n, device_count());
      return std::to_string(n);
    });
    if (!outcomes.ok()) return "cannot start a probe rank: " + outcomes.status().to_string();
    const RankOutcome& o = (*outcomes)[0];
    if (!o.status.ok()) return "needs 2 GPUs: " + o.status.to_string();
    if (std::stoi(o.result) < 2) return fmt::format("needs 2 GPUs, this machine has {}", o.result);
    return std::string();
  }();
  return reason;
}

#define REQUIRE_TWO_GPUS()                              \
  do {                                                  \
    std::string why = skip_reason();                    \
    if (!why.empty()) GTEST_SKIP() << why;              \
  } while (0)

GroupOptions two_ranks() {
  GroupOptions o;
  o.world = 2;
  o.timeout = 3min;
  o.grace = 30s;
  return o;
}

void expect_all_ok(const Result<std::vector<RankOutcome>>& outcomes) {
  ASSERT_TRUE(outcomes.ok()) << outcomes.status().to_string_with_detail();
  for (const RankOutcome& o : *outcomes) {
    EXPECT_TRUE(o.status.ok()) << "rank " << o.rank << ": " << o.status.to_string_with_detail();
  }
}

TEST(CommGpu, TheGroupsCommunicatorsAreWhatTheyClaim) {
  REQUIRE_TWO_GPUS();
  expect_all_ok(run_local_group(two_ranks(), [](int rank, Communicator* comm) -> Result<std::string> {
    RANK_CHECK(comm != nullptr, "no communicator");
    RANK_CHECK(comm->rank() == rank && comm->world() == 2 && comm->device() == rank, "{} {} {}", comm->rank(),
               comm->world(), comm->device());
    RANK_CHECK(comm->nccl() != nullptr && comm->context() != nullptr && comm->stream() != nullptr, "handles");
    KILN_ASSIGN_OR_RETURN(CUcontext current, current_context());
    RANK_CHECK(current == comm->context(), "the rank's current context is not the communicator's");
    KILN_ASSIGN_OR_RETURN(int device, current_device());
    RANK_CHECK(device == rank, "current device {}", device);
    return std::string();
  }));
}

TEST(CommGpu, ABarrierReturnsOnlyOnceEveryRankHasEnteredIt) {
  REQUIRE_TWO_GPUS();
  // Rank 0 writes a byte before entering; rank 1 reads without blocking after leaving: the byte must be there.
  int p[2];
  ASSERT_EQ(::pipe2(p, O_NONBLOCK), 0);
  auto outcomes = run_local_group(two_ranks(), [&](int rank, Communicator* comm) -> Result<std::string> {
    for (int round = 0; round < 3; ++round) {
      if (rank == 0) RANK_CHECK(::write(p[1], "b", 1) == 1, "write");
      KILN_RETURN_IF_ERROR(comm->barrier());
      if (rank == 1) {
        char c = 0;
        RANK_CHECK(::read(p[0], &c, 1) == 1 && c == 'b', "round {}: left the barrier before rank 0 entered it",
                   round);
      }
      KILN_RETURN_IF_ERROR(comm->barrier());  // rank 0 writes again only after rank 1 has read
    }
    return std::string();
  });
  ::close(p[0]);
  ::close(p[1]);
  expect_all_ok(outcomes);
}

TEST(CommGpu, AllReduceMaxGivesTheMaximumOverRanks) {
  REQUIRE_TWO_GPUS();
  expect_all_ok(run_local_group(two_ranks(), [](int rank, Communicator* comm) -> Result<std::string> {
    std::vector<double> v = {double(rank), -double(rank), 10.0 * rank + 1.5, rank == 0 ? 100.0 : -100.0};
    KILN_RETURN_IF_ERROR(comm->all_reduce_max(v));
    RANK_CHECK((v == std::vector<double>{1.0, 0.0, 11.5, 100.0}), "{}", fmt::join(v, ","));

    std::vector<double> big(8192);
    for (size_t i = 0; i < big.size(); ++i) big[i] = (int(i % 2) == rank) ? double(i) : -double(i) - 1;
    KILN_RETURN_IF_ERROR(comm->all_reduce_max(big));
    for (size_t i = 0; i < big.size(); ++i) RANK_CHECK(big[i] == double(i), "value {} is {}", i, big[i]);

    std::vector<double> empty;
    KILN_RETURN_IF_ERROR(comm->all_reduce_max(empty));
    // Ranks that disagree on the length, or pass too many values, all get the same error, and no one hangs.
    std::vector<double> uneven(rank == 0 ? 3 : 4, 1.0);
    Status st = comm->all_reduce_max(uneven);
    RANK_CHECK(st.code() == ErrorCode::kInvalidArgument, "uneven: {}", st.to_string());
    std::vector<double> too_many(8193, 1.0);
    st = comm->all_reduce_max(too_many);
    RANK_CHECK(st.code() == ErrorCode::kInvalidArgument, "too many: {}", st.to_string());
    // The communicator is still usable afterwards.
    std::vector<double> again = {double(rank)};
    KILN_RETURN_IF_ERROR(comm->all_reduce_max(again));
    RANK_CHECK(again[0] == 1.0, "{}", again[0]);
    return std::string();
  }));
}

TEST(CommGpu, AllGatherReturnsEveryRanksBytesInRankOrder) {
  REQUIRE_TWO_GPUS();
  auto bytes_of = [](int rank, size_t n) {
    std::string s(n, '\0');
    for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 7 + 13 * static_cast<size_t>(rank)) & 0xff);
    return s;
  };
  expect_all_ok(run_local_group(two_ranks(), [&](int rank, Communicator* comm) -> Result<std::string> {
    for (size_t n : {size_t{1}, size_t{1000}, size_t{64} << 10}) {
      KILN_ASSIGN_OR_RETURN(auto all, comm->all_gather(bytes_of(rank, n)));
      RANK_CHECK(all.size() == 2, "{}", all.size());
      for (int r = 0; r < 2; ++r) RANK_CHECK(all[size_t(r)] == bytes_of(r, n), "slot {} of a {}-byte gather", r, n);
    }
    KILN_ASSIGN_OR_RETURN(auto none, comm->all_gather(std::string()));
    RANK_CHECK(none.size() == 2 && none[0].empty() && none[1].empty(), "empty gather");
    auto uneven = comm->all_gather(std::string(rank == 0 ? 5 : 6, 'x'));
    RANK_CHECK(uneven.status().code() == ErrorCode::kInvalidArgument, "uneven: {}", uneven.status().to_string());
    auto too_big = comm->all_gather(std::string((64 << 10) + 1, 'x'));
    RANK_CHECK(too_big.status().code() == ErrorCode::kInvalidArgument, "too big: {}", too_big.status().to_string());
    KILN_ASSIGN_OR_RETURN(auto after, comm->all_gather(fmt::format("r{}", rank)));
    RANK_CHECK(after[0] == "r0" && after[1] == "r1", "after the errors");
    return std::string();
  }));
}

TEST(CommGpu, PeerBuffersMapEveryRanksMemory) {
  REQUIRE_TWO_GPUS();
  expect_all_ok(run_local_group(two_ranks(), [](int rank, Communicator* comm) -> Result<std::string> {
    KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
    const size_t bytes = (1 << 20) + 12;  // not a multiple of the allocation granularity
    const size_t words = bytes / 4;
    const int peer = 1 - rank;
    KILN_ASSIGN_OR_RETURN(auto peers, PeerBuffers::create(*comm, bytes));
    RANK_CHECK(peers->bytes() == bytes, "{}", peers->bytes());
    RANK_CHECK(peers->all().size() == 2, "{}", peers->all().size());
    RANK_CHECK(peers->all()[size_t(rank)] == peers->local() && peers->ptr(rank) == peers->local(), "own slot");
    RANK_CHECK(peers->local() != 0 && peers->ptr(peer) != 0 && peers->ptr(peer) != peers->local(), "mapped");
    RANK_CHECK(peers->ptr(2) == 0 && peers->ptr(-1) == 0, "out of range");

    // Zeroed at creation, seen from both sides (no one writes before the barrier).
    std::vector<uint32_t> host(words, 0xdeadbeef);
    KILN_CHECK(d->cuMemcpyDtoH(host.data(), peers->local(), words * 4));
    for (size_t i = 0; i < words; ++i) RANK_CHECK(host[i] == 0, "own word {} is {:#x}", i, host[i]);
    std::fill(host.begin(), host.end(), 0xdeadbeef);
    KILN_CHECK(d->cuMemcpyDtoH(host.data(), peers->ptr(peer), words * 4));
    for (size_t i = 0; i < words; ++i) RANK_CHECK(host[i] == 0, "peer word {} is {:#x}", i, host[i]);
    KILN_RETURN_IF_ERROR(comm->barrier());

    // Each rank writes its pattern into the first half of its own buffer and into the second half of its
    // peer's; after a barrier each reads both halves of its peer's buffer.
    auto pattern = [](int r, size_t i) { return static_cast<uint32_t>((r + 1) * 0x01010101u) ^ static_cast<uint32_t>(i); };
    const size_t half = words / 2;
    for (size_t i = 0; i < words; ++i) host[i] = pattern(rank, i);
    KILN_CHECK(d->cuMemcpyHtoD(peers->local(), host.data(), half * 4));
    KILN_CHECK(d->cuMemcpyHtoD(peers->ptr(peer) + half * 4, host.data() + half, (words - half) * 4));
    KILN_CHECK(d->cuCtxSynchronize());
    KILN_RETURN_IF_ERROR(comm->barrier());
    KILN_CHECK(d->cuMemcpyDtoH(host.data(), peers->ptr(peer), words * 4));
    for (size_t i = 0; i < half; ++i) RANK_CHECK(host[i] == pattern(peer, i), "peer's own word {}", i);
    for (size_t i = half; i < words; ++i) RANK_CHECK(host[i] == pattern(rank, i), "word {} this rank wrote", i);

    KILN_RETURN_IF_ERROR(peers->release());
    KILN_RETURN_IF_ERROR(peers->release());  // idempotent, and not collective the second time
    RANK_CHECK(peers->local() == 0 && peers->all().empty() && peers->ptr(peer) == 0, "after release");
    peers.reset();
    // The communicator is still in step on both ranks after the release's barrier.
    KILN_RETURN_IF_ERROR(comm->barrier());

    // Ranks asking for different sizes all fail alike (and stay in step).
    auto uneven = PeerBuffers::create(*comm, rank == 0 ? (1 << 20) : (2 << 20));
    RANK_CHECK(uneven.status().code() == ErrorCode::kInvalidArgument, "uneven: {}", uneven.status().to_string());
    KILN_RETURN_IF_ERROR(comm->barrier());
    return std::string();
  }));
}

TEST(CommGpu, PeerBuffersAreReleasedByTheirDestructor) {
  REQUIRE_TWO_GPUS();
  auto outcomes = run_local_group(two_ranks(), [](int rank, Communicator* comm) -> Result<std::string> {
    KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
    auto round = [&](int i) -> Result<size_t> {
      {
        KILN_ASSIGN_OR_RETURN(auto peers, PeerBuffers::create(*comm, size_t{256} << 20));
        RANK_CHECK(peers->ptr(1 - rank) != 0, "round {}", i);
      }  // destroyed: released collectively on both ranks
      size_t free = 0, total = 0;
      KILN_CHECK(d->cuMemGetInfo(&free, &total));
      return free;
    };
    // The first round pays the driver's one-time costs (peer access between the devices, IPC bookkeeping);
    // after it, four more rounds of 256 MiB would show as a gigabyte if the buffers leaked.
    size_t before = 0, total = 0;
    KILN_CHECK(d->cuMemGetInfo(&before, &total));
    KILN_ASSIGN_OR_RETURN(size_t warm, round(0));
    std::string frees = fmt::format("{} | {}", before >> 20, warm >> 20);
    size_t last = warm;
    for (int i = 1; i <= 4; ++i) {
      KILN_ASSIGN_OR_RETURN(last, round(i));
      frees += fmt::format(" {}", last >> 20);
    }
    RANK_CHECK(last + (size_t{128} << 20) >= warm, "free MiB after each round: {}", frees);
    return frees;
  });
  expect_all_ok(outcomes);
  if (outcomes.ok()) {
    for (const RankOutcome& o : *outcomes) std::cout << "rank " << o.rank << " free MiB after each round: " << o.result << "\n";
  }
}

// An NCCL id made by rank 0 and handed to the others through the group's communicator.
Result<NcclId> shared_id(Communicator& comm) {
  NcclId id{};
  if (comm.rank() == 0) {
    KILN_ASSIGN_OR_RETURN(id, nccl_unique_id());
  }
  KILN_ASSIGN_OR_RETURN(auto all, comm.all_gather(std::string(id.data(), id.size())));
  std::memcpy(id.data(), all[0].data(), id.size());
  return id;
}

TEST(CommGpu, WrapUsesTheApplicationsCommunicatorAndLeavesItAlive) {
  REQUIRE_TWO_GPUS();
  expect_all_ok(run_local_group(two_ranks(), [](int rank, Communicator* group) -> Result<std::string> {
    KILN_ASSIGN_OR_RETURN(const detail::NcclApi* api, detail::nccl());
    KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
    KILN_ASSIGN_OR_RETURN(NcclId id, shared_id(*group));
    ncclUniqueId nid;
    std::memcpy(nid.internal, id.data(), sizeof nid.internal);
    ncclComm_t app = nullptr;
    KILN_CHECK(api->ncclCommInitRank(&app, 2, nid, rank));

    auto wrong = Communicator::wrap(app, 1 - rank, 2, rank);
    RANK_CHECK(wrong.status().code() == ErrorCode::kInvalidArgument, "wrong rank: {}", wrong.status().to_string());
    {
      KILN_ASSIGN_OR_RETURN(auto wrapped, Communicator::wrap(app, rank, 2, rank));
      RANK_CHECK(wrapped->nccl() == app, "wrapped handle");
      KILN_RETURN_IF_ERROR(wrapped->barrier());
      std::vector<double> v = {double(rank) * 3};
      KILN_RETURN_IF_ERROR(wrapped->all_reduce_max(v));
      RANK_CHECK(v[0] == 3.0, "{}", v[0]);
      KILN_ASSIGN_OR_RETURN(auto all, wrapped->all_gather(fmt::format("w{}", rank)));
      RANK_CHECK(all[0] == "w0" && all[1] == "w1", "gather through the wrapped communicator");
    }  // the wrapper is gone; the application's communicator must still work
    CUdeviceptr buf = 0;
    KILN_CHECK(d->cuMemAlloc(&buf, sizeof(float)));
    float one = 1.0f + rank, sum = 0;
    KILN_CHECK(d->cuMemcpyHtoD(buf, &one, sizeof one));
    KILN_CHECK(api->ncclAllReduce(reinterpret_cast<void*>(buf), reinterpret_cast<void*>(buf), 1, ncclFloat32, ncclSum,
                                  app, nullptr));
    KILN_CHECK(d->cuCtxSynchronize());
    KILN_CHECK(d->cuMemcpyDtoH(&sum, buf, sizeof sum));
    KILN_CHECK(d->cuMemFree(buf));
    RANK_CHECK(sum == 3.0f, "the application's all-reduce after the wrapper gave {}", sum);
    KILN_CHECK(api->ncclCommDestroy(app));
    return std::string();
  }));
}

TEST(CommGpu, AnOwnedCommunicatorIsDestroyedWithItsObject) {
  REQUIRE_TWO_GPUS();
  expect_all_ok(run_local_group(two_ranks(), [](int rank, Communicator* group) -> Result<std::string> {
    for (int round = 0; round < 3; ++round) {
      KILN_ASSIGN_OR_RETURN(NcclId id, shared_id(*group));
      KILN_ASSIGN_OR_RETURN(auto owned, Communicator::init(id, rank, 2, rank));
      std::vector<double> v = {double(round * 10 + rank)};
      KILN_RETURN_IF_ERROR(owned->all_reduce_max(v));
      RANK_CHECK(v[0] == round * 10 + 1, "round {}: {}", round, v[0]);
    }  // each destroyed with ncclCommDestroy; the next init on the same devices must work
    KILN_RETURN_IF_ERROR(group->barrier());
    return std::string();
  }));
}

TEST(CommGpu, ARankThatDiesInsideACollectiveTakesTheGroupDownNotTheCaller) {
  REQUIRE_TWO_GPUS();
  GroupOptions o = two_ranks();
  o.grace = 2s;  // rank 0 is blocked in a barrier that can never complete
  auto outcomes = run_local_group(o, [](int rank, Communicator* comm) -> Result<std::string> {
    KILN_RETURN_IF_ERROR(comm->barrier());
    if (rank == 1) ::_exit(9);
    KILN_RETURN_IF_ERROR(comm->barrier());
    return std::string("rank 0 passed a barrier its peer never entered");
  });
  ASSERT_TRUE(outcomes.ok()) << outcomes.status().to_string();
  const Status& died = (*outcomes)[1].status;
  EXPECT_EQ(died.code(), ErrorCode::kWorkerCrashed) << died.to_string();
  EXPECT_NE(died.message().find("exited with status 9"), std::string::npos) << died.to_string();
  const Status& blocked = (*outcomes)[0].status;
  // NCCL may notice the dead peer itself (an error out of the barrier) or spin until the grace ends.
  EXPECT_FALSE(blocked.ok()) << (*outcomes)[0].result;
  if (blocked.code() == ErrorCode::kCancelled) {
    EXPECT_NE(blocked.message().find("killed: rank 1 failed first"), std::string::npos) << blocked.to_string();
  }
}

}  // namespace
}  // namespace kiln::runtime
