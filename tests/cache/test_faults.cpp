// Storage faults: a cache folder that is not usable (a file in the way, no permission), a disk that fills up,
// and database files that are damaged or missing (table files, the write-ahead log, CURRENT, MANIFEST). Each
// must end in an error that names the path and the cause, or in a database that was quarantined and rebuilt
// with a message; never a crash, a silently empty cache, or data deleted without a word.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "cache_test_util.h"
#include "fault_fs.h"
#include "kiln/cache/integrity.h"
#include "kiln/cache/store.h"
#include "kiln_test.h"

namespace kiln::cache {
namespace {

namespace fs = std::filesystem;
using testing::FullDiskFs;
using testing::store_options;
using testing::TempDir;

TimingRecord timing(int i) {
  TimingRecord t;
  t.problem = fmt::format("problem-{:04d}", i);
  t.choice = "tile_128x128";
  t.median_us = 10 + i;
  t.min_us = 9 + i;
  t.p90_us = 11 + i;
  t.samples = 50;
  return t;
}

// A cache of `n` timings, flushed into table files and closed.
void fill(const TempDir& d, int n, int from = 0) {
  auto store = Store::open(store_options(d));
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  for (int i = from; i < from + n; ++i) KILN_ASSERT_OK((*store)->put_timing(timing(i)));
  KILN_ASSERT_OK((*store)->flush());
}

size_t count_timings(Store& s) { return s.all_timings().size(); }

std::vector<fs::path> files(const std::string& db, std::string_view suffix) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(db)) {
    std::string name = e.path().filename().string();
    if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) out.push_back(e.path());
    if (suffix == "MANIFEST-" && name.rfind("MANIFEST-", 0) == 0) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The largest table file: the timings', which is what fill() writes most of.
fs::path largest_sst(const std::string& db) {
  auto all = files(db, ".sst");
  return *std::max_element(all.begin(), all.end(), [](const fs::path& a, const fs::path& b) { return fs::file_size(a) < fs::file_size(b); });
}

void flip_bytes(const fs::path& file, uint64_t offset, int n = 8) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  for (int i = 0; i < n; ++i) {
    f.seekg(std::streamoff(offset + i));
    char c = 0;
    f.get(c);
    f.seekp(std::streamoff(offset + i));
    f.put(char(c ^ 0x5a));
  }
}

StoreOptions failing_on_damage(const TempDir& d) {
  StoreOptions o = store_options(d);
  o.on_damage = OnDamage::kFail;
  return o;
}

// ---- Paths that cannot be used.

// On main at 60375ad this crashed with SIGSEGV: the writer's failed open fell back to waiting for a writer,
// which was itself, forever deeper.
TEST(StorageFaults, DbPathThatIsAFileIsAnErrorNamingIt) {
  TempDir d;
  std::ofstream(d.path() + "/db") << "not a database";
  for (Role role : {Role::kAuto, Role::kWriter, Role::kReader}) {
    auto s = Store::open(store_options(d, role));
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), ErrorCode::kIoError);
    EXPECT_NE(s.status().message().find(d.path() + "/db"), std::string::npos) << s.status().to_string();
    EXPECT_NE(s.status().message().find("is a file, not a folder"), std::string::npos) << s.status().to_string();
  }
  auto v = verify_cache(d.path());
  EXPECT_FALSE(v.ok());
}

TEST(StorageFaults, CacheFolderThatIsAFileIsAnErrorNamingIt) {
  TempDir d;
  std::string file = d.path() + "/cache";
  std::ofstream(file) << "x";
  StoreOptions o;
  o.dir = file;
  auto s = Store::open(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find(file), std::string::npos) << s.status().to_string();
}

// Runs `fn` in a child process as an unprivileged user (root ignores permission bits: tests and CI run as
// root here) and returns what it printed, or the signal or exit status that ended it.
std::string as_nobody(const std::function<std::string()>& fn) {
  int p[2];
  if (::pipe(p) != 0) return "pipe failed";
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) _exit(3);
    std::string out = fn();
    (void)!::write(p[1], out.data(), out.size());
    _exit(0);
  }
  ::close(p[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(p[0], buf, sizeof buf)) > 0;) out.append(buf, size_t(n));
  ::close(p[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) return fmt::format("killed by signal {}", WTERMSIG(status));
  if (WEXITSTATUS(status) != 0) return fmt::format("exit {}", WEXITSTATUS(status));
  return out;
}

std::string open_status(const std::string& dir, Role role) {
  StoreOptions o;
  o.dir = dir;
  o.role = role;
  o.ingest_interval = std::chrono::milliseconds(0);
  auto s = Store::open(o);
  return s.ok() ? std::string("opened") : s.status().to_string();
}

TEST(StorageFaults, ReadOnlyFolderIsAnErrorNamingThePathAndCause) {
  TempDir d;
  fill(d, 3);
  fs::permissions(d.path(), fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                fs::perms::others_read | fs::perms::others_exec);
  for (Role role : {Role::kAuto, Role::kWriter, Role::kReader}) {
    std::string out = as_nobody([&] { return open_status(d.path(), role); });
    EXPECT_NE(out.find(d.path()), std::string::npos) << out;
    EXPECT_NE(out.find("Permission denied"), std::string::npos) << out;
  }
}

// On main at 60375ad an unreadable database folder read as "no kiln cache": the wrong cause.
TEST(StorageFaults, UnreadableDatabaseIsAnErrorNamingThePathAndCause) {
  TempDir d;
  fill(d, 3);
  // The folder is the unprivileged user's; only its database is not readable to it.
  for (const auto& e : fs::recursive_directory_iterator(d.path())) (void)::chown(e.path().c_str(), 65534, 65534);
  (void)::chown(d.path().c_str(), 65534, 65534);
  (void)::chown((d.path() + "/db").c_str(), 0, 0);
  fs::permissions(d.path() + "/db", fs::perms::owner_all);
  for (Role role : {Role::kAuto, Role::kReader}) {
    std::string out = as_nobody([&] { return open_status(d.path(), role); });
    EXPECT_NE(out.find(d.path() + "/db"), std::string::npos) << out;
    EXPECT_NE(out.find("Permission denied"), std::string::npos) << out;
  }
}

// ---- A full disk.

// A store in `d` whose files live on `disk`, which fills when a test says so.
StoreOptions on_disk(const TempDir& d, const std::shared_ptr<FullDiskFs>& disk) {
  StoreOptions o = store_options(d);
  o.env = FullDiskFs::env(disk);
  return o;
}

TEST(StorageFaults, FullDiskFailsTheWriteAndIsRemembered) {
  TempDir d;
  auto disk = std::make_shared<FullDiskFs>();
  {
    auto store = Store::open(on_disk(d, disk));
    ASSERT_TRUE(store.ok()) << store.status().to_string();
    KILN_ASSERT_OK((*store)->put_timing(timing(0)));
    KILN_EXPECT_OK((*store)->first_write_error());
    disk->fill_after(0);
    Status s = (*store)->put_timing(timing(1));
    ASSERT_FALSE(s.ok()) << "a write to a full disk reported success";
    EXPECT_EQ(s.code(), ErrorCode::kIoError);
    EXPECT_NE(s.message().find("No space left"), std::string::npos) << s.to_string();
    EXPECT_NE(s.to_string().find(d.path() + "/db"), std::string::npos) << s.to_string();
    EXPECT_FALSE((*store)->put_binary(testing::fake_binary(1)).ok());
    EXPECT_FALSE((*store)->first_write_error().ok());
    EXPECT_FALSE((*store)->sync().ok() && (*store)->flush().ok()) << "flushing to a full disk reported success";
  }
  disk->make_room();
  auto store = Store::open(store_options(d));
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  EXPECT_TRUE((*store)->timing("problem-0000", "tile_128x128").has_value());
  auto v = verify_cache(d.path());
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->ok()) << (v->damage.empty() ? "" : v->damage[0]);
}

// The disk fills while the memtable is flushed to a table file: the flush fails, later writes fail (no abort),
// and what the log holds is there after reopening.
TEST(StorageFaults, FullDiskDuringAFlushFailsItAndLosesNothingAcknowledged) {
  TempDir d;
  auto disk = std::make_shared<FullDiskFs>();
  {
    auto store = Store::open(on_disk(d, disk));
    ASSERT_TRUE(store.ok()) << store.status().to_string();
    for (int i = 0; i < 50; ++i) KILN_ASSERT_OK((*store)->put_timing(timing(i)));
    disk->fill_after(0);
    Status f = (*store)->flush();
    ASSERT_FALSE(f.ok()) << "a flush to a full disk reported success";
    EXPECT_NE(f.to_string().find("No space left"), std::string::npos) << f.to_string();
    EXPECT_FALSE((*store)->put_timing(timing(99)).ok());
    EXPECT_FALSE((*store)->first_write_error().ok());
  }
  disk->make_room();
  auto store = Store::open(store_options(d));
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  EXPECT_EQ((*store)->all_timings().size(), 50u);
}

// A disk too full to open a database on is refused before RocksDB starts writing (the distribution's RocksDB
// aborts when a disk fills during its open: on main at 60375ad `kiln cache stats` died so).
TEST(StorageFaults, NearlyFullDiskIsRefusedAtOpen) {
  TempDir d;
  StoreOptions o = store_options(d);
  o.min_free_bytes = uint64_t(1) << 62;  // more than any disk has free
  auto s = Store::open(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), ErrorCode::kIoError);
  EXPECT_NE(s.status().message().find("not enough free space for the cache '" + d.path() + "'"), std::string::npos)
      << s.status().to_string();
  EXPECT_FALSE(fs::exists(d.path() + "/db")) << "RocksDB was started on a full disk";
}

// A reader stages its writes as table files: a full disk there fails the write and leaves no half batch.
TEST(StorageFaults, FullDiskFailsAStagedWriteAndLeavesNothingBehind) {
  TempDir d;
  auto writer = Store::open(store_options(d));
  ASSERT_TRUE(writer.ok());
  auto disk = std::make_shared<FullDiskFs>();
  const StoreOptions o = on_disk(d, disk);
  auto reader = Store::open(o);
  ASSERT_TRUE(reader.ok()) << reader.status().to_string();
  ASSERT_FALSE((*reader)->is_writer());
  disk->fill_after(100);
  Status s = (*reader)->put_binary(testing::fake_binary(7, 64 * 1024));
  ASSERT_FALSE(s.ok()) << "a staged write to a full disk reported success";
  EXPECT_NE(s.message().find("No space left"), std::string::npos) << s.to_string();
  EXPECT_NE(s.to_string().find(d.path() + "/staging"), std::string::npos) << s.to_string();
  EXPECT_FALSE((*reader)->first_write_error().ok());
  EXPECT_TRUE(fs::is_empty(d.path() + "/staging")) << "a half-written batch was left in staging/";
}

// ---- Damaged and missing database files.

TEST(StorageFaults, TruncatedTableFileIsFoundAtOpenAndQuarantined) {
  TempDir d;
  fill(d, 200);
  fs::path sst = largest_sst(d.path() + "/db");
  fs::resize_file(sst, fs::file_size(sst) / 2);
  {
    auto s = Store::open(failing_on_damage(d));
    ASSERT_FALSE(s.ok()) << "a truncated table file went unnoticed";
    EXPECT_EQ(s.status().code(), ErrorCode::kCorrupt);
    EXPECT_NE(s.status().message().find(sst.filename().string()), std::string::npos) << s.status().to_string();
  }
  auto v = verify_cache(d.path());
  ASSERT_TRUE(v.ok());
  EXPECT_FALSE(v->ok());
  ASSERT_FALSE(v->damage.empty());
  EXPECT_NE(v->damage[0].find(sst.filename().string()), std::string::npos) << v->damage[0];

  auto store = Store::open(store_options(d));
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  const std::string& q = (*store)->quarantined();
  ASSERT_FALSE(q.empty()) << "the damaged database was not quarantined";
  EXPECT_EQ(q.rfind(d.path() + "/quarantine/", 0), 0u) << q;
  EXPECT_TRUE(fs::exists(fs::path(q) / sst.filename())) << "the damaged file is not kept in " << q;
  KILN_EXPECT_OK((*store)->put_timing(timing(500)));
}

// On main at 60375ad a flipped byte in a table file made every later open fail.
TEST(StorageFaults, CorruptedTableFileIsQuarantinedAndTheRestRebuilt) {
  TempDir d;
  fill(d, 200);
  fill(d, 5, 1000);  // a second table file, intact
  fs::path sst = largest_sst(d.path() + "/db");
  flip_bytes(sst, 64);
  {
    auto s = Store::open(failing_on_damage(d));
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), ErrorCode::kCorrupt);
    EXPECT_NE(s.status().message().find(sst.filename().string()), std::string::npos) << s.status().to_string();
  }
  auto v = verify_cache(d.path());
  ASSERT_TRUE(v.ok());
  ASSERT_FALSE(v->damage.empty());
  EXPECT_NE(v->damage[0].find(sst.filename().string()), std::string::npos) << v->damage[0];

  auto store = Store::open(store_options(d));
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  EXPECT_FALSE((*store)->quarantined().empty());
  EXPECT_TRUE((*store)->timing("problem-1002", "tile_128x128").has_value()) << "the intact table was not kept";
  store->reset();
  auto after = verify_cache(d.path());
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(after->ok()) << (after->damage.empty() ? "" : after->damage[0]);
}

// A damaged block of the binaries' table file is found only when a binary is read (an open reads the decisions
// and timings, not every binary). The read is a miss its caller compiles again, and it says so in the log:
// `kiln precompile` on a tampered cache recompiled every kernel without a word before.
TEST(StorageFaults, AnUnreadableBinaryIsAMissThatIsLogged) {
  TempDir d;
  std::vector<Binary> bins;
  {
    auto store = Store::open(store_options(d));
    ASSERT_TRUE(store.ok()) << store.status().to_string();
    for (int i = 0; i < 40; ++i) {
      bins.push_back(testing::fake_binary(uint64_t(i) + 1, 16384));
      KILN_ASSERT_OK((*store)->put_binary(bins.back()));
    }
    KILN_ASSERT_OK((*store)->flush());
  }
  flip_bytes(largest_sst(d.path() + "/db"), 4096, 64);  // the binaries' table, inside its first data block
  auto store = Store::open(store_options(d));
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  std::ostringstream log;
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(log)));
  int unreadable = 0;
  for (const auto& b : bins) {
    auto got = (*store)->get_binary(b.key, {}, false);
    if (got.ok()) continue;
    ++unreadable;
    EXPECT_EQ(got.status().code(), ErrorCode::kCorrupt) << got.status().to_string();
  }
  spdlog::set_default_logger(previous);
  EXPECT_GT(unreadable, 0) << "the flipped bytes damaged no binary";
  EXPECT_NE(log.str().find("is a miss"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("kiln cache verify"), std::string::npos) << log.str();
}

// A copy of a database taken while its writer runs: what a machine that lost power leaves (the write-ahead
// log holds the last writes, nothing flushed).
void crash_copy(const TempDir& from, const TempDir& to, int n) {
  auto store = Store::open(store_options(from));
  ASSERT_TRUE(store.ok());
  for (int i = 0; i < n; ++i) KILN_ASSERT_OK((*store)->put_timing(timing(i)));
  fs::copy(from.path() + "/db", to.path() + "/db", fs::copy_options::recursive);
}

// On main at 60375ad a damaged log record silently dropped it and every record after it.
TEST(StorageFaults, DamagedWriteAheadLogIsFoundAndRepaired) {
  TempDir live, d;
  crash_copy(live, d, 100);
  auto logs = files(d.path() + "/db", ".log");
  ASSERT_FALSE(logs.empty());
  fs::path log = logs.back();
  ASSERT_GT(fs::file_size(log), 4000u);
  flip_bytes(log, fs::file_size(log) / 3, 4);
  {
    auto s = Store::open(failing_on_damage(d));
    ASSERT_FALSE(s.ok()) << "a damaged write-ahead log went unnoticed";
    EXPECT_EQ(s.status().code(), ErrorCode::kCorrupt);
  }
  auto v = verify_cache(d.path());
  ASSERT_TRUE(v.ok());
  EXPECT_FALSE(v->ok());

  auto r = repair_cache(d.path());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(fs::exists(fs::path(r->backup) / log.filename())) << "no copy of the damaged log in " << r->backup;
  EXPECT_TRUE(r->after.ok()) << (r->after.damage.empty() ? "" : r->after.damage[0]);
  auto store = Store::open(failing_on_damage(d));
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  EXPECT_GT(count_timings(**store), 0u) << "repair kept nothing";
  EXPECT_TRUE((*store)->timing("problem-0000", "tile_128x128").has_value());
}

// On main at 60375ad RocksDB created a new empty database over the old one and deleted its table files.
TEST(StorageFaults, MissingCurrentIsRebuiltNotEmptied) {
  TempDir d;
  fill(d, 50);
  fs::remove(d.path() + "/db/CURRENT");
  {
    auto s = Store::open(failing_on_damage(d));
    ASSERT_FALSE(s.ok()) << "a lost CURRENT went unnoticed";
    EXPECT_EQ(s.status().code(), ErrorCode::kCorrupt);
    EXPECT_NE(s.status().message().find("CURRENT"), std::string::npos) << s.status().to_string();
    ASSERT_FALSE(files(d.path() + "/db", ".sst").empty()) << "table files were deleted";
  }
  auto store = Store::open(store_options(d));
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  EXPECT_FALSE((*store)->quarantined().empty());
  EXPECT_EQ(count_timings(**store), 50u) << "the rebuilt cache lost entries";
}

TEST(StorageFaults, MissingManifestIsRepaired) {
  TempDir d;
  fill(d, 50);
  for (const auto& m : files(d.path() + "/db", "MANIFEST-")) fs::remove(m);
  {
    auto s = Store::open(failing_on_damage(d));
    ASSERT_FALSE(s.ok()) << "a lost MANIFEST went unnoticed";
    EXPECT_EQ(s.status().code(), ErrorCode::kCorrupt);
    EXPECT_NE(s.status().message().find("MANIFEST"), std::string::npos) << s.status().to_string();
  }
  auto r = repair_cache(d.path());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->after.ok());
  auto store = Store::open(failing_on_damage(d));
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  EXPECT_EQ(count_timings(**store), 50u);
}

TEST(StorageFaults, VerifyCountsEntriesOfAHealthyCache) {
  TempDir d;
  fill(d, 20);
  auto v = verify_cache(d.path());
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_TRUE(v->ok());
  EXPECT_GE(v->checked, 21u);  // 20 timings and the format record
  EXPECT_EQ(v->bad, 0u);
  TempDir empty;
  EXPECT_EQ(verify_cache(empty.path()).status().code(), ErrorCode::kNotFound);
}

TEST(StorageFaults, RepairNeedsTheWriterRole) {
  TempDir d;
  fill(d, 5);
  auto store = Store::open(store_options(d));
  ASSERT_TRUE(store.ok());
  auto r = repair_cache(d.path());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kUnavailable);
}

}  // namespace
}  // namespace kiln::cache
