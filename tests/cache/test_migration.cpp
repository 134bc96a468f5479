// A cache written by an older kiln: golden/db-60375ad is a RocksDB folder that kiln at commit 60375ad wrote
// (golden/db-60375ad.md says how). This build must load its entries exactly, or report them as another
// format and rebuild them; it must never read them as something else. A value of a format this build does
// not know (a newer kiln's) is a miss that says so, and is replaced when written again.
#include <gtest/gtest.h>

#include <xxhash.h>

#include <cstring>
#include <filesystem>

#include "cache_test_util.h"
#include "format.h"
#include "kiln/cache/store.h"
#include "kiln_test.h"
#include "raw_db.h"

namespace kiln::cache {
namespace {

using testing::raw_put;
using testing::TempDir;

const Toolchain kOldToolchain{12, 8, 0, "0.1.0"};
const std::string kGemm = "gemm|m=128|n=256|k=64";
const std::string kNorm = "rmsnorm|rows=4|cols=4096";
const KernelKey kGemmKernel{0x0123456789abcdefull, 0xfedcba9876543210ull};
const KernelKey kNormKernel{0x1111, 0x2222};

// A copy of the old cache (the store writes into its folder), opened as this build with the old toolchain.
class OldCache : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::copy(KILN_CACHE_GOLDEN_DIR "/db-60375ad", dir_.path() + "/db");
  }
  Result<std::unique_ptr<Store>> open() {
    StoreOptions o;
    o.dir = dir_.path();
    o.role = Role::kWriter;
    o.toolchain = kOldToolchain;
    o.ingest_interval = std::chrono::milliseconds(0);
    return Store::open(o);
  }
  TempDir dir_;
};

TEST_F(OldCache, EveryEntryLoadsAsWritten) {
  KILN_ASSERT_OK_AND_ASSIGN(auto store, open());

  KILN_ASSERT_OK_AND_ASSIGN(auto gemm, store->get_binary(kGemmKernel, "sm_90a"));
  EXPECT_EQ(gemm->name, "gemm_mma_128x128x32_w8_s3");
  EXPECT_EQ(gemm->entry, "gemm<128, 128, 32>");
  EXPECT_EQ(gemm->cubin, std::string("\x7f" "ELF\x02\x01\x01\0fake cubin of 60375ad", 30));
  EXPECT_EQ(gemm->ptx, "// ptx of 60375ad");
  EXPECT_EQ(gemm->log, "warning: old");
  ASSERT_EQ(gemm->lowered_names.size(), 1u);
  EXPECT_EQ(gemm->lowered_names[0].second, "_Z4gemmILi128ELi128ELi32EEvv");
  EXPECT_EQ(gemm->compile_seconds, 0.5);
  EXPECT_EQ(gemm->nvrtc_major, 12);
  EXPECT_EQ(gemm->nvrtc_minor, 8);
  KILN_ASSERT_OK_AND_ASSIGN(auto norm, store->get_binary(kNormKernel, "sm_80"));
  EXPECT_EQ(norm->cubin, "cubin-b");
  EXPECT_EQ(norm->compile_seconds, 0.125);

  std::vector<TimingRecord> timings = store->timings(kGemm);
  ASSERT_EQ(timings.size(), 2u);
  const TimingRecord& failed = timings[0];  // choice-name order: "cublaslt/algo17" first
  EXPECT_EQ(failed.choice, "cublaslt/algo17");
  EXPECT_FALSE(failed.ok);
  EXPECT_EQ(failed.error, ErrorCode::kWrongResult);
  EXPECT_EQ(failed.reason, "max relative error 0.5");
  EXPECT_EQ(failed.measured_at_ns, 1700000000000000002);
  const TimingRecord& ok = timings[1];
  EXPECT_EQ(ok.choice, "gemm_mma_128x128x32_w8_s3");
  EXPECT_TRUE(ok.ok);
  EXPECT_EQ(ok.median_us, 12.5);
  EXPECT_EQ(ok.min_us, 12.0);
  EXPECT_EQ(ok.p90_us, 13.25);
  EXPECT_EQ(ok.samples, 40u);
  EXPECT_EQ(ok.toolchain, kOldToolchain);

  auto d = store->decision(kGemm);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->choice, "gemm_mma_128x128x32_w8_s3");
  EXPECT_EQ(d->params, (std::vector<std::pair<std::string, std::string>>{{"tile_m", "128"}, {"stages", "3"}}));
  EXPECT_EQ(d->kernel, kGemmKernel);
  EXPECT_EQ(d->median_us, 12.5);
  EXPECT_EQ(d->decided_at_ns, 1700000000000000003);
  auto extern_decision = store->decision(kNorm);
  ASSERT_NE(extern_decision, nullptr);
  EXPECT_EQ(extern_decision->kernel, std::nullopt);
  EXPECT_EQ(extern_decision->median_us, 3.75);

  KILN_ASSERT_OK_AND_ASSIGN(auto st, store->stats());
  EXPECT_EQ(st.invalid, 0u);
}

// A newer kiln's value in the same folder: reported as another format version, a miss, and rebuilt by the
// next write; the entries beside it still load.
TEST_F(OldCache, ValueOfAFutureFormatIsReportedAndRebuilt) {
  Binary b;
  {
    KILN_ASSERT_OK_AND_ASSIGN(auto store, open());
    KILN_ASSERT_OK_AND_ASSIGN(auto stored, store->get_binary(kNormKernel));
    b = *stored;
  }
  std::string future = encode_binary(b, 7);
  future[4] = 2;  // format version 2, with a checksum that matches: only the version tells it apart
  const uint64_t sum = XXH3_64bits(future.data(), future.size() - 8);
  std::memcpy(future.data() + future.size() - 8, &sum, 8);
  EXPECT_EQ(decode_binary(future).status().code(), ErrorCode::kCorrupt);
  EXPECT_NE(decode_binary(future).status().message().find("format version 2"), std::string::npos)
      << decode_binary(future).status().to_string();
  raw_put(dir_.path(), "binaries", binary_key(kNormKernel), future);

  {
    KILN_ASSERT_OK_AND_ASSIGN(auto store, open());
    EXPECT_EQ(store->get_binary(kNormKernel).status().code(), ErrorCode::kNotFound);
    KILN_EXPECT_OK(store->get_binary(kGemmKernel));
    KILN_ASSERT_OK_AND_ASSIGN(auto st, store->stats());
    EXPECT_EQ(st.invalid, 1u);
    KILN_ASSERT_OK(store->put_binary(b));
  }
  KILN_ASSERT_OK_AND_ASSIGN(auto store, open());
  KILN_ASSERT_OK_AND_ASSIGN(auto rebuilt, store->get_binary(kNormKernel));
  EXPECT_EQ(rebuilt->cubin, "cubin-b");
}

}  // namespace
}  // namespace kiln::cache
