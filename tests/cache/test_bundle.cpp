// Bundles: export then import reproduces the entries exactly; import verifies every entry and stores only
// those that pass; a reader's import is staged for the writer; the CLI drives the same paths.
#include <gtest/gtest.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "cache_test_util.h"
#include "kiln/cache/bundle.h"
#include "kiln/cache/integrity.h"
#include "kiln/cache/signing.h"
#include "kiln/cache/problem_key.h"
#include "kiln_test.h"

namespace kiln::cache {
namespace {

using namespace testing;  // cache_test_util.h: TempDir, store_options, sample_problem, fake_binary

void fill(Store& s) {
  for (int i = 0; i < 5; ++i) {
    std::string p = sample_problem(16 << i).canonical();
    TimingRecord t;
    t.problem = p;
    t.choice = "fast";
    t.median_us = 1 + i;
    t.samples = 20;
    KILN_ASSERT_OK(s.put_timing(t));
    t.choice = "broken";
    t.ok = false;
    t.error = ErrorCode::kCompileError;
    t.reason = "ptxas \"error\" with \xc3\xa9 and \\ quotes";
    KILN_ASSERT_OK(s.put_timing(t));
    Binary b = fake_binary(40 + i, 3000);
    KILN_ASSERT_OK(s.put_binary(b));
    Decision d;
    d.problem = p;
    d.choice = "fast";
    d.params = {{"z", "1"}, {"a", "2"}};  // order is kept as given
    d.kernel = b.key;
    d.median_us = 1 + i;
    KILN_ASSERT_OK(s.put_decision(d));
  }
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}
void write_json(const std::string& path, const nlohmann::json& j) { std::ofstream(path) << j.dump(); }

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

SigningKey test_key(char c) { return SigningKey::from_bytes(std::string(40, c), "a test key").value(); }

// Folders for a source store (a), a destination store (b) and bundle files, and the bundle's path.
class Bundle : public ::testing::Test {
 protected:
  // Opens `src` in a, fills it, and exports it with its binaries to `path`, signed with `key` unless told not.
  void export_filled(bool sign = true) {
    KILN_ASSERT_OK_AND_ASSIGN(src, Store::open(store_options(a)));
    fill(*src);
    ExportOptions o{.binaries = true};
    if (sign) o.sign_with = key;
    KILN_ASSERT_OK_AND_ASSIGN(exported, export_bundle(*src, path, o));
  }

  SigningKey key = test_key('k');

  TempDir a, b, files;
  std::string path = files.path() + "/bundle.json";
  std::unique_ptr<Store> src;
  BundleCounts exported;
};

TEST_F(Bundle, ExportImportRoundTrip) {
  ASSERT_NO_FATAL_FAILURE(export_filled());
  EXPECT_EQ(exported.decisions, 5u);
  EXPECT_EQ(exported.timings, 10u);
  EXPECT_EQ(exported.binaries, 5u);
  KILN_ASSERT_OK_AND_ASSIGN(auto dst, Store::open(store_options(b)));
  KILN_ASSERT_OK_AND_ASSIGN(auto report, import_bundle(*dst, path, {.trusted_keys = {key}}));
  EXPECT_TRUE(report.binaries_trusted) << report.signature;
  EXPECT_NE(report.signature.find("trusted key " + key.id()), std::string::npos) << report.signature;
  EXPECT_EQ(report.rejected, 0u) << (report.errors.empty() ? "" : report.errors[0]);
  EXPECT_EQ(report.imported.decisions, 5u);
  EXPECT_EQ(report.imported.timings, 10u);
  EXPECT_EQ(report.imported.binaries, 5u);
  EXPECT_EQ(report.other_toolchain, 0u);
  for (const auto& d : src->decisions()) {
    auto got = dst->decision(d->problem);
    ASSERT_NE(got, nullptr);
    EXPECT_EQ(*got, *d);  // stamps, params order, kernel, toolchain: all of it
    KILN_ASSERT_OK_AND_ASSIGN(auto bin, dst->get_binary(*d->kernel));
    KILN_ASSERT_OK_AND_ASSIGN(auto orig, src->get_binary(*d->kernel));
    EXPECT_EQ(bin->cubin, orig->cubin);
    EXPECT_EQ(bin->lowered_names, orig->lowered_names);
  }
  EXPECT_EQ(dst->all_timings(), src->all_timings());
}

TEST_F(Bundle, ImportVerifiesEveryEntry) {
  ASSERT_NO_FATAL_FAILURE(export_filled());
  auto j = read_json(path);
  j["decisions"][0]["choice"] = "slow";                // edited: checksum no longer matches
  j["timings"][1]["median_us"] = 0.001;                // edited
  std::string cubin = j["binaries"][0]["cubin_base64"];
  cubin[10] = cubin[10] == 'A' ? 'B' : 'A';            // damaged cubin
  j["binaries"][0]["cubin_base64"] = cubin;
  j["binaries"][1]["cubin_base64"] = "not base64!";
  j["decisions"][1]["problem"] = "p1;not a problem";  // not a canonical problem key
  j["timings"][2].erase("toolchain");                 // missing field
  j["timings"].push_back(42);                          // not an object
  write_json(path, j);
  KILN_ASSERT_OK_AND_ASSIGN(auto dst, Store::open(store_options(b)));
  KILN_ASSERT_OK_AND_ASSIGN(auto report, import_bundle(*dst, path, {.trust_unsigned = true}));
  EXPECT_EQ(report.rejected, 7u);
  EXPECT_EQ(report.errors.size(), 7u);
  EXPECT_EQ(report.imported.decisions, 3u);
  EXPECT_EQ(report.imported.timings, 8u);  // 10 + the non-object, less 3 rejected
  EXPECT_EQ(report.imported.binaries, 3u);
  std::string first = j["decisions"][0]["problem"];
  EXPECT_EQ(dst->decision(first), nullptr);  // the edited decision was not stored
  KILN_ASSERT_OK_AND_ASSIGN(auto st, dst->stats());
  EXPECT_EQ(st.invalid, 0u);
}

// ---- trust: binaries only from a bundle signed with a trusted key, or when told to trust unsigned ones

TEST_F(Bundle, UnsignedBundleImportsDecisionsAndTimingsOnly) {
  ASSERT_NO_FATAL_FAILURE(export_filled(/*sign=*/false));
  KILN_ASSERT_OK_AND_ASSIGN(auto dst, Store::open(store_options(b)));
  KILN_ASSERT_OK_AND_ASSIGN(auto report, import_bundle(*dst, path, {.trusted_keys = {key}}));
  EXPECT_EQ(report.signature, "unsigned");
  EXPECT_FALSE(report.binaries_trusted);
  EXPECT_EQ(report.imported.binaries, 0u);
  EXPECT_EQ(report.binaries_skipped, 5u);
  EXPECT_EQ(report.imported.decisions, 5u);
  EXPECT_EQ(report.imported.timings, 10u);
  EXPECT_FALSE(dst->has_binary(*src->decisions()[0]->kernel));
}

// An attacker replaces the cubins and recomputes every hash: on main at 60375ad they were imported.
TEST_F(Bundle, SwappedCubinsAreRefused) {
  ASSERT_NO_FATAL_FAILURE(export_filled());
  const std::string signed_text = read_text(path);
  // The attacker's bundle: the same kernel keys, other code, hashes that match it.
  TempDir c;
  std::string evil = files.path() + "/evil.json";
  {
    KILN_ASSERT_OK_AND_ASSIGN(auto attacker, Store::open(store_options(c)));
    fill(*attacker);
    for (int i = 0; i < 5; ++i) {
      Binary bin = fake_binary(40 + i, 3000);
      bin.cubin.replace(100, 8, "EVILCODE");
      KILN_ASSERT_OK(attacker->put_binary(bin));
    }
    KILN_ASSERT_OK(export_bundle(*attacker, evil, {.binaries = true}).status());
  }
  KernelKey k = *src->decisions()[0]->kernel;
  // Unsigned: refused without --trust-unsigned.
  {
    TempDir d;
    KILN_ASSERT_OK_AND_ASSIGN(auto dst, Store::open(store_options(d)));
    KILN_ASSERT_OK_AND_ASSIGN(auto report, import_bundle(*dst, evil, {.trusted_keys = {key}}));
    EXPECT_EQ(report.imported.binaries, 0u);
    EXPECT_EQ(report.rejected, 0u);  // every hash matches: only the missing signature tells
    EXPECT_FALSE(dst->has_binary(k));
  }
  // Under the signature of the real bundle: the signature does not match.
  std::string evil_text = read_text(evil);
  std::string forged = signed_text.substr(0, signed_text.find('\n', 3) + 1) + evil_text.substr(2);
  std::ofstream(evil, std::ios::binary | std::ios::trunc) << forged;
  {
    TempDir d;
    KILN_ASSERT_OK_AND_ASSIGN(auto dst, Store::open(store_options(d)));
    KILN_ASSERT_OK_AND_ASSIGN(auto report, import_bundle(*dst, evil, {.trusted_keys = {key}, .trust_unsigned = true}));
    EXPECT_FALSE(report.signature_valid);
    EXPECT_NE(report.signature.find("does not match"), std::string::npos) << report.signature;
    EXPECT_EQ(report.imported.binaries, 0u);
    EXPECT_EQ(report.binaries_skipped, 5u);
    EXPECT_FALSE(dst->has_binary(k));
  }
}

TEST_F(Bundle, WrongKeyImportsNoBinaries) {
  ASSERT_NO_FATAL_FAILURE(export_filled());
  KILN_ASSERT_OK_AND_ASSIGN(auto dst, Store::open(store_options(b)));
  SigningKey other = test_key('o');
  KILN_ASSERT_OK_AND_ASSIGN(auto report, import_bundle(*dst, path, {.trusted_keys = {other}, .trust_unsigned = true}));
  EXPECT_FALSE(report.binaries_trusted);
  EXPECT_TRUE(report.signature_valid);  // nothing says it was edited: only that its signer is not trusted
  EXPECT_NE(report.signature.find("signed with key " + key.id() + ", which is not a trusted key"), std::string::npos)
      << report.signature;
  EXPECT_EQ(report.imported.binaries, 0u);
  EXPECT_EQ(report.imported.decisions, 5u);
}

TEST_F(Bundle, ExportRefusesADestinationInsideTheCache) {
  KILN_ASSERT_OK_AND_ASSIGN(src, Store::open(store_options(a)));
  fill(*src);
  KILN_ASSERT_OK(src->flush());
  std::filesystem::create_symlink(a.path() + "/db", files.path() + "/link");
  for (const std::string& dest : {a.path() + "/db/CURRENT", a.path() + "/bundle.json",
                                  files.path() + "/../" + std::filesystem::path(a.path()).filename().string() + "/db/x.json",
                                  files.path() + "/link/CURRENT"}) {
    auto r = export_bundle(*src, dest);
    ASSERT_FALSE(r.ok()) << dest;
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("inside the cache folder"), std::string::npos) << r.status().to_string();
  }
  src.reset();
  auto v = verify_cache(a.path());
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->ok());
}

TEST(SigningKey, LoadsAKeyFileItsOwnerAloneMayRead) {
  TempDir d;
  std::string file = d.path() + "/kiln.key";
  std::ofstream(file) << std::string(64, 'a') << "\n";
  ::chmod(file.c_str(), 0644);
  auto open_key = SigningKey::load(file);
  ASSERT_FALSE(open_key.ok());
  EXPECT_EQ(open_key.status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(open_key.status().message().find(file), std::string::npos);
  ::chmod(file.c_str(), 0600);
  KILN_ASSERT_OK_AND_ASSIGN(SigningKey k, SigningKey::load(file));
  EXPECT_EQ(k.id(), SigningKey::from_bytes(std::string(64, 'a')).value().id());  // the newline is not the key
  std::string sig = k.sign("data");
  EXPECT_EQ(sig.size(), 64u);
  EXPECT_TRUE(k.verify("data", sig));
  EXPECT_FALSE(k.verify("date", sig));
  EXPECT_FALSE(k.verify("data", sig.substr(1)));
  // The known answer, from `printf data | openssl dgst -sha256 -hmac aaaa...` (64 a's).
  EXPECT_EQ(sig, "d18cebfa78b60c299f8365c9661dd2f93ef713e32749eba4c31a49cbf1396e16");
  std::string short_file = d.path() + "/short.key";
  std::ofstream(short_file) << "tooshort";
  ::chmod(short_file.c_str(), 0600);
  EXPECT_EQ(SigningKey::load(short_file).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(SigningKey::load(d.path() + "/missing.key").status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(SigningKey::load(d.path()).status().code(), ErrorCode::kFailedPrecondition);  // a folder
}

TEST_F(Bundle, NotABundle) {
  KILN_ASSERT_OK_AND_ASSIGN(auto s, Store::open(store_options(a)));
  std::ofstream(path) << "{\"hello\": 1}";
  EXPECT_EQ(import_bundle(*s, path).status().code(), ErrorCode::kCorrupt);
  std::ofstream(path) << "garbage {";
  EXPECT_EQ(import_bundle(*s, path).status().code(), ErrorCode::kCorrupt);
  EXPECT_EQ(import_bundle(*s, files.path() + "/missing.json").status().code(), ErrorCode::kNotFound);
}

TEST_F(Bundle, PrefixAndOtherToolchains) {
  {
    StoreOptions o = store_options(a);
    o.toolchain = Toolchain{12, 8, 12080, "0.0.1"};
    KILN_ASSERT_OK_AND_ASSIGN(src, Store::open(o));
    fill(*src);
    ProblemKey other = sample_problem(16);
    other.device.name = "NVIDIA A100";
    Decision d;
    d.problem = other.canonical();
    d.choice = "x";
    KILN_ASSERT_OK(src->put_decision(d));
    ProblemKey h200 = sample_problem(16);
    KILN_ASSERT_OK_AND_ASSIGN(auto counts, export_bundle(*src, path, {.prefix = environment_prefix(h200.device, h200.versions)}));
    EXPECT_EQ(counts.decisions, 5u);  // not the A100's
    EXPECT_EQ(counts.binaries, 0u);
    src.reset();
  }
  KILN_ASSERT_OK_AND_ASSIGN(auto dst, Store::open(store_options(b)));
  KILN_ASSERT_OK_AND_ASSIGN(auto report, import_bundle(*dst, path));
  EXPECT_EQ(report.rejected, 0u);
  EXPECT_EQ(report.other_toolchain, 15u);  // stored, but misses for this toolchain
  EXPECT_TRUE(dst->decisions().empty());
}

TEST_F(Bundle, ImportThroughAReaderIsStaged) {
  ASSERT_NO_FATAL_FAILURE(export_filled());
  KILN_ASSERT_OK_AND_ASSIGN(auto writer, Store::open(store_options(b)));
  KILN_ASSERT_OK_AND_ASSIGN(auto reader, Store::open(store_options(b)));
  ASSERT_FALSE(reader->is_writer());
  KILN_ASSERT_OK_AND_ASSIGN(auto report, import_bundle(*reader, path));
  EXPECT_EQ(report.imported.decisions, 5u);
  KILN_ASSERT_OK_AND_ASSIGN(auto st, writer->stats());
  EXPECT_EQ(st.staged_batches, 1u);  // one batch for the whole import
  KILN_ASSERT_OK(writer->sync());
  EXPECT_EQ(writer->decisions().size(), 5u);
}

// ---- the CLI, end to end

int run(const std::string& cmd, std::string* out = nullptr) {
  // One file per process: ctest runs these tests as separate processes at the same time.
  std::string file = ::testing::TempDir() + "/kiln_cli_out." + std::to_string(::getpid()) + ".txt";
  int rc = std::system((cmd + " > " + file + " 2>&1").c_str());
  std::ifstream in(file);
  std::stringstream ss;
  ss << in.rdbuf();
  if (out) *out = ss.str();
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TEST(CacheCli, StatsLsExportImportPruneClear) {
  TempDir a, b, files;
  {
    KILN_ASSERT_OK_AND_ASSIGN(auto s, Store::open(store_options(a)));
    fill(*s);
  }
  const std::string kiln = KILN_CLI;
  std::string out;
  ASSERT_EQ(run(kiln + " cache stats --cache-dir " + a.path(), &out), 0) << out;
  EXPECT_NE(out.find("decisions  5"), std::string::npos) << out;
  EXPECT_NE(out.find("timings    5 (5 cached failures)"), std::string::npos) << out;
  ASSERT_EQ(run(kiln + " cache ls --kind all --cache-dir " + a.path(), &out), 0) << out;
  EXPECT_NE(out.find("-> fast"), std::string::npos) << out;
  EXPECT_NE(out.find("failure"), std::string::npos) << out;
  EXPECT_NE(out.find("binary"), std::string::npos) << out;
  std::string bundle = files.path() + "/b.json";
  ASSERT_EQ(run(kiln + " cache export " + bundle + " --binaries --cache-dir " + a.path(), &out), 0) << out;
  EXPECT_NE(out.find("exported 5 decisions, 10 timings, 5 binaries"), std::string::npos) << out;
  ASSERT_EQ(run(kiln + " cache import " + bundle + " --trust-unsigned --cache-dir " + b.path(), &out), 0) << out;
  EXPECT_NE(out.find("imported 5 decisions, 10 timings, 5 binaries"), std::string::npos) << out;
  ASSERT_EQ(run(kiln + " cache prune --max-size 0 --older-than 1d --dry-run --cache-dir " + b.path(), &out), 0) << out;
  EXPECT_NE(out.find("would drop 0 binaries"), std::string::npos) << out;
  ASSERT_EQ(run(kiln + " cache prune --arch sm_90 --cache-dir " + b.path(), &out), 0) << out;
  EXPECT_NE(out.find("dropped 5 binaries"), std::string::npos) << out;
  EXPECT_EQ(run(kiln + " cache prune --older-than soon --cache-dir " + b.path(), &out), 2) << out;
  EXPECT_EQ(run(kiln + " cache clear --cache-dir " + b.path(), &out), 2) << out;  // needs --yes
  ASSERT_EQ(run(kiln + " cache clear --yes --cache-dir " + b.path(), &out), 0) << out;
  ASSERT_EQ(run(kiln + " cache stats --cache-dir " + b.path(), &out), 0) << out;
  EXPECT_NE(out.find("decisions  0"), std::string::npos) << out;
  // While another process holds the writer role, prune says who.
  KILN_ASSERT_OK_AND_ASSIGN(auto holder, Store::open(store_options(b)));
  EXPECT_EQ(run(kiln + " cache prune --cache-dir " + b.path(), &out), 1) << out;
  EXPECT_NE(out.find("pid"), std::string::npos) << out;
  EXPECT_EQ(run(kiln + " cache stats --cache-dir " + files.path() + "/none", &out), 1) << out;
}

// Storage faults and trust through the CLI: exit status and a message naming the path at fault.
TEST(CacheCli, FaultsNameThePathAndExitNonZero) {
  TempDir a, files;
  const std::string kiln = KILN_CLI;
  std::string out;
  std::ofstream(a.path() + "/db") << "not a database";
  EXPECT_EQ(run(kiln + " cache stats --cache-dir " + a.path(), &out), 1) << out;
  EXPECT_NE(out.find("'" + a.path() + "/db': it is a file, not a folder"), std::string::npos) << out;
  EXPECT_EQ(run(kiln + " cache import " + files.path() + "/none.json --cache-dir " + a.path(), &out), 1) << out;
  EXPECT_NE(out.find(a.path() + "/db"), std::string::npos) << out;
  EXPECT_EQ(run(kiln + " cache verify --cache-dir " + a.path(), &out), 1) << out;
  std::filesystem::remove(a.path() + "/db");

  {
    KILN_ASSERT_OK_AND_ASSIGN(auto s, Store::open(store_options(a)));
    fill(*s);
    KILN_ASSERT_OK(s->flush());  // into table files, which the test damages below
  }
  ASSERT_EQ(run(kiln + " cache verify --cache-dir " + a.path(), &out), 0) << out;
  EXPECT_NE(out.find(": 0 bad, no damage"), std::string::npos) << out;
  // Export into the cache's own folder is refused and the cache still verifies.
  EXPECT_EQ(run(kiln + " cache export " + a.path() + "/db/CURRENT --cache-dir " + a.path(), &out), 1) << out;
  EXPECT_NE(out.find("inside the cache folder"), std::string::npos) << out;
  ASSERT_EQ(run(kiln + " cache verify --cache-dir " + a.path(), &out), 0) << out;

  // A damaged table file: verify names it and fails, repair fixes it, verify passes again.
  std::string sst;
  for (const auto& e : std::filesystem::directory_iterator(a.path() + "/db")) {
    if (e.path().extension() == ".sst" && (sst.empty() || e.file_size() > std::filesystem::file_size(sst))) sst = e.path().string();
  }
  ASSERT_FALSE(sst.empty());
  {
    std::fstream f(sst, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.write("\x01\x02\x03\x04\x05\x06\x07\x08", 8);
  }
  EXPECT_EQ(run(kiln + " cache verify --cache-dir " + a.path(), &out), 1) << out;
  EXPECT_NE(out.find(std::filesystem::path(sst).filename().string()), std::string::npos) << out;
  ASSERT_EQ(run(kiln + " cache repair --cache-dir " + a.path(), &out), 0) << out;
  EXPECT_NE(out.find(a.path() + "/quarantine/"), std::string::npos) << out;
  EXPECT_EQ(run(kiln + " cache verify --cache-dir " + a.path(), &out), 0) << out;
}

TEST(CacheCli, SignedBundlesAndTrust) {
  TempDir a, b, files;
  {
    KILN_ASSERT_OK_AND_ASSIGN(auto s, Store::open(store_options(a)));
    fill(*s);
  }
  const std::string kiln = KILN_CLI;
  std::string key = files.path() + "/kiln.key", other = files.path() + "/other.key";
  std::ofstream(key) << std::string(64, '7') << "\n";
  std::ofstream(other) << std::string(64, '8') << "\n";
  std::string out;
  std::string bundle = files.path() + "/b.json";
  // A key others may read is refused, naming it.
  ::chmod(key.c_str(), 0644);
  EXPECT_EQ(run(kiln + " cache export " + bundle + " --binaries --sign-key " + key + " --cache-dir " + a.path(), &out), 2) << out;
  EXPECT_NE(out.find(key), std::string::npos) << out;
  ::chmod(key.c_str(), 0600);
  ::chmod(other.c_str(), 0600);
  ASSERT_EQ(run(kiln + " cache export " + bundle + " --binaries --sign-key " + key + " --cache-dir " + a.path(), &out), 0) << out;
  EXPECT_NE(out.find("signed with key"), std::string::npos) << out;
  // Without a key: decisions and timings only, and it says so.
  ASSERT_EQ(run(kiln + " cache import " + bundle + " --cache-dir " + b.path(), &out), 0) << out;
  EXPECT_NE(out.find("imported 5 decisions, 10 timings, 0 binaries"), std::string::npos) << out;
  EXPECT_NE(out.find("5 binaries not imported"), std::string::npos) << out;
  // With the wrong key: the same.
  ASSERT_EQ(run(kiln + " cache import " + bundle + " --trust-key " + other + " --cache-dir " + b.path(), &out), 0) << out;
  EXPECT_NE(out.find("which is not a trusted key"), std::string::npos) << out;
  // With the right key: the binaries too.
  ASSERT_EQ(run(kiln + " cache import " + bundle + " --trust-key " + key + " --cache-dir " + b.path(), &out), 0) << out;
  EXPECT_NE(out.find("imported 5 decisions, 10 timings, 5 binaries"), std::string::npos) << out;
  // Edited after signing: a failed check.
  std::string text = read_text(bundle);
  text[text.size() / 2] = text[text.size() / 2] == '1' ? '2' : '1';
  std::ofstream(bundle, std::ios::trunc | std::ios::binary) << text;
  EXPECT_EQ(run(kiln + " cache import " + bundle + " --trust-key " + key + " --cache-dir " + b.path(), &out), 1) << out;
  EXPECT_NE(out.find("does not match its content"), std::string::npos) << out;
}

}  // namespace
}  // namespace kiln::cache
