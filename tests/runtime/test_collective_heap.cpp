// The symmetric heap's bookkeeping (runtime/collective/src/symmetric_heap.h) without a GPU: alignment and first
// fit, coalescing, exhaustion, double and foreign frees, frees deferred behind calls still in flight (a fake
// completion the test controls), determinism across "ranks" that make the same calls, and the comparison of the
// ranks' records of one collective allocate.
#include <gtest/gtest.h>

#include <vector>

#include "symmetric_heap.h"

namespace kiln::runtime::detail {
namespace {

TEST(SymmetricHeap, AlignsAndFitsFirst) {
  SymmetricHeap h(4096, 256);
  auto a = h.allocate(100);
  auto b = h.allocate(256);
  auto c = h.allocate(0);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(*a, 0u);
  EXPECT_EQ(*b, 256u);
  EXPECT_EQ(*c, 512u);
  EXPECT_EQ(h.used(), 768u);
  EXPECT_EQ(h.size_of(0), 256u);
  // Freeing the first makes it the first fit again; a larger request goes after the live ones.
  ASSERT_TRUE(h.free(0, {}, "a").ok());
  EXPECT_EQ(*h.allocate(512), 768u);
  EXPECT_EQ(*h.allocate(200), 0u);
}

TEST(SymmetricHeap, CoalescesNeighboursSoTheWholeHeapComesBack) {
  SymmetricHeap h(1024, 256);
  std::vector<size_t> o;
  for (int i = 0; i < 4; ++i) o.push_back(*h.allocate(256));
  EXPECT_FALSE(h.allocate(1).ok());
  // Freed in a scattered order: the free list must merge into one range.
  for (size_t i : {2, 0, 3, 1}) ASSERT_TRUE(h.free(o[i], {}, "t").ok());
  EXPECT_EQ(h.used(), 0u);
  auto whole = h.allocate(1024);
  ASSERT_TRUE(whole.ok()) << whole.status().to_string();
  EXPECT_EQ(*whole, 0u);
}

TEST(SymmetricHeap, ExhaustionNamesHeapUsedAndAsked) {
  SymmetricHeap h(1024, 256);
  ASSERT_TRUE(h.allocate(768).ok());
  auto r = h.allocate(512);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kOutOfRange);
  const std::string m = r.status().to_string();
  EXPECT_NE(m.find("1024"), std::string::npos) << m;  // the heap
  EXPECT_NE(m.find("768"), std::string::npos) << m;   // in use
  EXPECT_NE(m.find("512"), std::string::npos) << m;   // asked
  auto huge = h.allocate(size_t{1} << 40);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), ErrorCode::kOutOfRange);
}

TEST(SymmetricHeap, DoubleFreeAndForeignOffsetsAreRefusedByName) {
  SymmetricHeap h(4096, 256);
  const size_t a = *h.allocate(300);
  ASSERT_TRUE(h.free(a, {}, "pointer 0x1000").ok());
  Status twice = h.free(a, {}, "pointer 0x1000");
  EXPECT_EQ(twice.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(twice.to_string().find("pointer 0x1000"), std::string::npos) << twice.to_string();
  const size_t b = *h.allocate(1024);
  Status inside = h.free(b + 256, {}, "pointer 0xabc");  // inside an allocation but not its start
  EXPECT_EQ(inside.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(inside.to_string().find("pointer 0xabc"), std::string::npos);
  EXPECT_EQ(h.live(), 1u);
  EXPECT_EQ(h.used(), 1024u);
}

TEST(SymmetricHeap, AFreedRangeInFlightIsReusedOnlyAfterItsCallsComplete) {
  SymmetricHeap h(2048, 256);
  const size_t a = *h.allocate(1024);
  const size_t b = *h.allocate(1024);
  // A call on `a` is in flight; the fake completion says when it is done, and counts the waits.
  bool done = false;
  int waits = 0;
  bool reused_before_done = false;
  ASSERT_TRUE(h.free(a, [&]() -> Status {
                   ++waits;
                   done = true;  // the wait returns once the call has completed
                   return Status();
                 }, "a").ok());
  EXPECT_EQ(waits, 0) << "free() itself must not wait (it is local and cheap)";
  // The next allocate reuses the same offset (determinism across ranks), but only after the wait ran.
  auto again = h.allocate(512);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, a);
  reused_before_done = !done;
  EXPECT_FALSE(reused_before_done);
  EXPECT_EQ(waits, 1);
  // Its remainder is free and no longer waited on.
  auto rest = h.allocate(512);
  ASSERT_TRUE(rest.ok());
  EXPECT_EQ(*rest, a + 512);
  EXPECT_EQ(waits, 1);
  (void)b;
}

TEST(SymmetricHeap, AFailedWaitFailsTheAllocateAndKeepsTheRange) {
  SymmetricHeap h(1024, 256);
  const size_t a = *h.allocate(1024);
  ASSERT_TRUE(h.free(a, [] { return make_error(ErrorCode::kCudaError, "the call failed"); }, "a").ok());
  auto r = h.allocate(256);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kCudaError);
  EXPECT_EQ(h.used(), 0u);
}

TEST(SymmetricHeap, AllocationsOutsideTheWaitedRangeDoNotWait) {
  SymmetricHeap h(2048, 256);
  const size_t x = *h.allocate(256);
  ASSERT_TRUE(h.allocate(256).ok());
  ASSERT_TRUE(h.allocate(256).ok());
  int waits = 0;
  ASSERT_TRUE(h.free(x, [&] { ++waits; return Status(); }, "x").ok());
  // [0, 256) is too small for 512: the first fit is after the live ones, and nothing waits.
  EXPECT_EQ(*h.allocate(512), 768u);
  EXPECT_EQ(waits, 0);
  // Reusing [0, 256) waits for the call that used it, once.
  EXPECT_EQ(*h.allocate(100), 0u);
  EXPECT_EQ(waits, 1);
  EXPECT_TRUE(h.drain().ok());
  EXPECT_EQ(waits, 1);
}

TEST(SymmetricHeap, RanksMakingTheSameCallsGetTheSameOffsetsWhateverTheirFreeOrder) {
  SymmetricHeap r0(1 << 20), r1(1 << 20);
  std::vector<size_t> o0, o1;
  for (size_t bytes : {1000, 5000, 256, 70000, 3}) {
    o0.push_back(*r0.allocate(bytes));
    o1.push_back(*r1.allocate(bytes));
  }
  EXPECT_EQ(o0, o1);
  // The same tensors freed in different orders: the heaps agree again.
  for (size_t i : {1, 3}) ASSERT_TRUE(r0.free(o0[i], {}, "t").ok());
  for (size_t i : {3, 1}) ASSERT_TRUE(r1.free(o1[i], {}, "t").ok());
  EXPECT_EQ(r0.digest(), r1.digest());
  EXPECT_EQ(*r0.allocate(4000), *r1.allocate(4000));
  // A divergence (one rank freed a tensor the other kept) shows in the digest.
  ASSERT_TRUE(r0.free(o0[0], {}, "t").ok());
  EXPECT_NE(r0.digest(), r1.digest());
}

TEST(SymmetricHeap, RollbackTakesAnAllocationBackWithoutWaiting) {
  SymmetricHeap h(1024, 256);
  const uint64_t before = h.digest();
  const size_t a = *h.allocate(512);
  h.rollback(a);
  EXPECT_EQ(h.used(), 0u);
  EXPECT_EQ(h.digest(), before);
}

TEST(AllocAgreement, RecordsRoundTripAtAFixedSize) {
  AllocRecord r{4096, 256, 1024, 0x1234567890abcdefull};
  const std::string s = r.encode();
  EXPECT_EQ(s.size(), 32u);
  auto back = AllocRecord::decode(s);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->asked, 4096u);
  EXPECT_EQ(back->offset, 256u);
  EXPECT_EQ(back->used, 1024u);
  EXPECT_EQ(back->digest, 0x1234567890abcdefull);
  EXPECT_FALSE(AllocRecord::decode("short").ok());
}

TEST(AllocAgreement, EqualRecordsAgree) {
  AllocRecord r{4096, 0, 0, 7};
  EXPECT_TRUE(check_agreement({r, r, r, r}).ok());
  // Every rank out of memory alike is agreement too (each then reports the exhaustion).
  AllocRecord none{4096, SymmetricHeap::npos, 0, 7};
  EXPECT_TRUE(check_agreement({none, none}).ok());
}

TEST(AllocAgreement, DifferentSizesNameBothSizesAndTheRank) {
  AllocRecord a{4096, 0, 0, 7}, b{8192, 0, 0, 7};
  Status s = check_agreement({a, a, b});
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  const std::string m = s.to_string();
  EXPECT_NE(m.find("4096"), std::string::npos) << m;
  EXPECT_NE(m.find("8192"), std::string::npos) << m;
  EXPECT_NE(m.find("rank 2"), std::string::npos) << m;
  // Every rank evaluates the same records, so every rank reaches the same verdict.
  EXPECT_EQ(check_agreement({b, a}).code(), ErrorCode::kInvalidArgument);
}

TEST(AllocAgreement, DivergedHeapsAreReportedEvenWhenTheOffsetsMatch) {
  AllocRecord a{4096, 8192, 1024, 7}, b{4096, 8192, 1024, 8};
  Status s = check_agreement({a, b});
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.to_string().find("diverged"), std::string::npos) << s.to_string();
  AllocRecord c{4096, SymmetricHeap::npos, 1024, 7};  // one rank out of room, the other not
  EXPECT_EQ(check_agreement({a, c}).code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace kiln::runtime::detail
