// The value format: golden bytes pin it; every bit flip and truncation is caught; decoding never crashes;
// the merge rule is a total order.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "format.h"
#include "kiln_test.h"

namespace kiln::cache {
namespace {

// Fixed records: nothing here may depend on the machine (no NVRTC or driver queries).
const Toolchain kTc{13, 0, 13000, "0.1.0"};

Binary golden_binary() {
  Binary b;
  b.key = {0x0123456789abcdefull, 0xfedcba9876543210ull};
  b.name = "gemm_128x128";
  b.entry = "gemm<128, 128>";
  b.arch = "sm_90a";
  b.cubin = std::string("\x7f" "ELF", 4) + std::string("\x00\x01\x02\xff", 4);
  b.ptx = "";
  b.lowered_names = {{"gemm<128, 128>", "_Z4gemmILi128ELi128EEvv"}};
  b.log = "warning: none";
  b.compile_seconds = 0.5;
  b.nvrtc_major = 13;
  b.nvrtc_minor = 0;
  return b;
}

TimingRecord golden_timing() {
  TimingRecord t;
  t.problem = "p1;op=gemm";
  t.choice = "mma_128x128";
  t.ok = false;
  t.median_us = 12.5;
  t.min_us = 11.25;
  t.p90_us = 13.75;
  t.samples = 100;
  t.measured_at_ns = 1767225600000000000;  // 2026-01-01
  t.error = ErrorCode::kCompileError;
  t.reason = "compile error: too many registers";
  t.toolchain = kTc;
  return t;
}

Decision golden_decision() {
  Decision d;
  d.problem = "p1;op=gemm";
  d.choice = "mma_128x128";
  d.params = {{"stages", "3"}, {"tile_m", "128"}};
  d.kernel = KernelKey{1, 2};
  d.median_us = 12.5;
  d.decided_at_ns = 1767225600000000001;
  d.toolchain = kTc;
  return d;
}

MetaRecord golden_meta() { return MetaRecord{kFormatVersion, "0.1.0", 1767225600000000002}; }

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// KILN_UPDATE_GOLDEN=1 rewrites the files (only when the format version was bumped on purpose).
void check_golden(const std::string& name, const std::string& bytes) {
  std::string path = std::string(KILN_CACHE_GOLDEN_DIR) + "/" + name;
  if (const char* u = std::getenv("KILN_UPDATE_GOLDEN"); u && std::string(u) == "1") {
    std::ofstream(path, std::ios::binary) << bytes;
  }
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  EXPECT_EQ(read_file(path), bytes) << name << " drifted from its golden bytes: bump kFormatVersion if intended";
}

TEST(Format, GoldenBytes) {
  check_golden("binary.v1.bin", encode_binary(golden_binary(), 1767225600000000003));
  check_golden("timing.v1.bin", encode_timing(golden_timing()));
  check_golden("decision.v1.bin", encode_decision(golden_decision()));
  check_golden("meta.v1.bin", encode_meta(golden_meta()));
  check_golden("used.v1.bin", encode_used(1767225600000000004));
}

TEST(Format, GoldenFilesDecode) {
  std::string dir = KILN_CACHE_GOLDEN_DIR;
  KILN_ASSERT_OK_AND_ASSIGN(auto b, decode_binary(read_file(dir + "/binary.v1.bin")));
  EXPECT_EQ(b.binary.key, golden_binary().key);
  EXPECT_EQ(b.binary.cubin, golden_binary().cubin);
  EXPECT_EQ(b.binary.lowered_names, golden_binary().lowered_names);
  EXPECT_EQ(b.created_at_ns, 1767225600000000003);
  KILN_ASSERT_OK_AND_ASSIGN(auto t, decode_timing(read_file(dir + "/timing.v1.bin")));
  EXPECT_EQ(t, golden_timing());
  KILN_ASSERT_OK_AND_ASSIGN(auto d, decode_decision(read_file(dir + "/decision.v1.bin")));
  EXPECT_EQ(d, golden_decision());
  KILN_ASSERT_OK_AND_ASSIGN(auto m, decode_meta(read_file(dir + "/meta.v1.bin")));
  EXPECT_EQ(m, golden_meta());
  KILN_ASSERT_OK_AND_ASSIGN(auto u, decode_used(read_file(dir + "/used.v1.bin")));
  EXPECT_EQ(u, 1767225600000000004);
}

TEST(Format, EnvelopeLayout) {
  std::string v = encode_timing(golden_timing());
  EXPECT_EQ(v.substr(0, 4), "KLNC");
  EXPECT_EQ(uint8_t(v[4]) | uint8_t(v[5]) << 8, kFormatVersion);
  EXPECT_EQ(v[6], char(ValueKind::kTiming));
  KILN_ASSERT_OK_AND_ASSIGN(auto e, open_envelope(v));
  EXPECT_EQ(e.stamp, golden_timing().measured_at_ns);
  EXPECT_EQ(e.payload.size() + kEnvelopeBytes, v.size());
}

TEST(Format, EveryBitFlipIsCaught) {
  for (const std::string& v : {encode_timing(golden_timing()), encode_decision(golden_decision()),
                               encode_binary(golden_binary(), 7)}) {
    for (size_t i = 0; i < v.size() * 8; ++i) {
      std::string bad = v;
      bad[i / 8] ^= char(1 << (i % 8));
      EXPECT_FALSE(open_envelope(bad).ok()) << "bit " << i;
    }
  }
}

TEST(Format, EveryTruncationAndExtensionIsCaught) {
  std::string v = encode_decision(golden_decision());
  for (size_t n = 0; n < v.size(); ++n) EXPECT_FALSE(decode_decision(v.substr(0, n)).ok()) << n;
  EXPECT_FALSE(decode_decision(v + "x").ok());
}

TEST(Format, WrongKindFutureVersionAndGarbageAreRefused) {
  EXPECT_FALSE(decode_decision(encode_timing(golden_timing())).ok());
  EXPECT_FALSE(decode_binary(encode_used(1)).ok());
  std::string future = encode_meta(golden_meta());
  future[4] = 2;
  auto r = decode_meta(future);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kCorrupt);
  EXPECT_NE(r.status().message().find("format version 2"), std::string::npos);
  // Random bytes; and random payloads sealed in a valid envelope (right length and checksum, nonsense
  // fields), which reach the field decoders: they refuse or decode, never crash or over-read (ASan).
  std::mt19937_64 rng(42);
  for (int i = 0; i < 5000; ++i) {
    std::string junk(rng() % 200, '\0');
    for (auto& c : junk) c = char(rng() % 4 == 0 ? rng() % 4 : rng());  // small numbers make plausible counts
    EXPECT_FALSE(open_envelope(junk).ok());
    std::string sealed = encode_used(1).substr(0, kEnvelopeHeaderBytes);
    sealed[6] = char(1 + rng() % 3);
    uint32_t n = uint32_t(junk.size());
    std::memcpy(sealed.data() + 16, &n, 4);
    sealed += junk;
    uint64_t sum = XXH3_64bits(sealed.data(), sealed.size());
    sealed.append(reinterpret_cast<const char*>(&sum), 8);
    ASSERT_TRUE(open_envelope(sealed).ok());
    (void)decode_binary(sealed);
    (void)decode_binary_info(sealed);
    (void)decode_timing(sealed);
    (void)decode_decision(sealed);
  }
}

TEST(Format, MergeRuleIsATotalOrder) {
  TimingRecord a = golden_timing(), b = golden_timing();
  b.measured_at_ns += 1;
  std::string va = encode_timing(a), vb = encode_timing(b);
  EXPECT_TRUE(first_wins(vb, va));   // newer
  EXPECT_FALSE(first_wins(va, vb));
  std::string broken = vb;
  broken[25] ^= 1;
  EXPECT_TRUE(first_wins(va, broken));  // valid beats invalid, whatever the stamps
  EXPECT_FALSE(first_wins(broken, va));
  TimingRecord c = a;
  c.median_us = 99;  // same stamp, different bytes: decided by the bytes, the same way from both sides
  std::string vc = encode_timing(c);
  EXPECT_NE(first_wins(va, vc), first_wins(vc, va));
}

TEST(Format, Keys) {
  KernelKey k{0x0102030405060708ull, 0x1112131415161718ull};
  std::string bk = binary_key(k);
  ASSERT_EQ(bk.size(), 16u);
  EXPECT_EQ(uint8_t(bk[0]), 0x01);
  EXPECT_EQ(uint8_t(bk[15]), 0x18);
  EXPECT_EQ(*parse_binary_key(bk), k);
  EXPECT_FALSE(parse_binary_key("short").ok());
  EXPECT_LT(binary_key({1, 0}), binary_key({2, 0}));
  EXPECT_EQ(timing_key("p", "c"), std::string("p\0c", 3));
}

}  // namespace
}  // namespace kiln::cache
