// Bundles: export then import reproduces the entries exactly; import verifies every entry and stores only
// those that pass; a reader's import is staged for the writer; the CLI drives the same paths.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "cache_test_util.h"
#include "kiln/cache/bundle.h"
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

// Folders for a source store (a), a destination store (b) and bundle files, and the bundle's path.
class Bundle : public ::testing::Test {
 protected:
  // Opens `src` in a, fills it, and exports it with its binaries to `path`.
  void export_filled() {
    KILN_ASSERT_OK_AND_ASSIGN(src, Store::open(store_options(a)));
    fill(*src);
    KILN_ASSERT_OK_AND_ASSIGN(exported, export_bundle(*src, path, {.binaries = true}));
  }

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
  KILN_ASSERT_OK_AND_ASSIGN(auto report, import_bundle(*dst, path));
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
  KILN_ASSERT_OK_AND_ASSIGN(auto report, import_bundle(*dst, path));
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
  std::string file = ::testing::TempDir() + "/kiln_cli_out.txt";
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
  ASSERT_EQ(run(kiln + " cache import " + bundle + " --cache-dir " + b.path(), &out), 0) << out;
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

}  // namespace
}  // namespace kiln::cache
