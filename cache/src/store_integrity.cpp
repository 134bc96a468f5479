// Store: damage. Checking a cache folder before RocksDB opens it, moving a damaged database aside and
// rebuilding it (the writer at open), and the whole-folder checks behind `kiln cache verify` and `kiln cache
// repair`. Nothing here deletes a file of the database: what is damaged is moved into quarantine/ or, by
// RocksDB's repair, into db/lost/, and the messages say where.
#include <unistd.h>

#include <fmt/format.h>
#include <rocksdb/convenience.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <set>

#include "format.h"
#include "kiln/cache/integrity.h"
#include "rocks.h"
#include "store_env.h"
#include "store_impl.h"

namespace kiln::cache {

namespace fs = std::filesystem;

namespace {

bool is_database_file(const std::string& name) {
  auto ends = [&](std::string_view s) { return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0; };
  return ends(".sst") || ends(".log") || name.rfind("MANIFEST-", 0) == 0;
}

// The files under `dir` (recursively), as paths.
std::set<std::string> files_under(const fs::path& dir) {
  std::set<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code ec2;
    if (it->is_regular_file(ec2)) out.insert(it->path().string());
  }
  return out;
}

// A name for a copy of the database in quarantine/ that no other copy has.
fs::path quarantine_path(const std::string& dir, std::string_view why) {
  return fs::path(dir) / "quarantine" / fmt::format("db-{}-{}-{}", now_ns(), ::getpid(), why);
}

// Checks every entry of one column family: decodes it and compares it with its key.
Status check_entry(int cf, std::string_view key, std::string_view value) {
  auto same = [](bool b) { return b ? Status() : make_error(ErrorCode::kCorrupt, "stored under another key"); };
  switch (cf) {
    case kBinaries: {
      KILN_ASSIGN_OR_RETURN(StoredBinary b, decode_binary(value));
      KILN_ASSIGN_OR_RETURN(KernelKey k, parse_binary_key(key));
      return same(k == b.binary.key);
    }
    case kTimings: {
      KILN_ASSIGN_OR_RETURN(TimingRecord t, decode_timing(value));
      return same(timing_key(t.problem, t.choice) == key);
    }
    case kDecisions: {
      KILN_ASSIGN_OR_RETURN(Decision d, decode_decision(value));
      return same(d.problem == key);
    }
    default:
      if (key == kMetaFormatKey) return decode_meta(value).status();
      if (key.substr(0, kUsedPrefix.size()) == kUsedPrefix) {
        KILN_RETURN_IF_ERROR(parse_binary_key(key.substr(kUsedPrefix.size())).status());
        return decode_used(value).status();
      }
      return make_error(ErrorCode::kCorrupt, "an unknown key in meta");
  }
}

}  // namespace

bool is_damage(const rocksdb::Status& s) {
  if (s.IsCorruption() || s.IsPathNotFound()) return true;
  // Some RocksDB paths report a missing file as a plain IO error.
  return s.IsIOError() && s.ToString().find("No such file or directory") != std::string::npos;
}

Status check_db_folder(const std::string& db_path) {
  std::error_code ec;
  fs::file_status st = fs::status(db_path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return make_error(ErrorCode::kIoError, fmt::format("cannot use the cache database '{}': {}", db_path, ec.message()));
  }
  if (!fs::exists(st)) return Status();
  if (!fs::is_directory(st)) {
    return make_error(ErrorCode::kIoError,
                      fmt::format("cannot use the cache database '{}': it is a file, not a folder", db_path));
  }
  if (fs::exists(fs::path(db_path) / "CURRENT", ec)) return Status();
  std::vector<std::string> found;
  auto it = fs::directory_iterator(db_path, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (is_database_file(name)) found.push_back(name);
  }
  if (ec) return make_error(ErrorCode::kIoError, fmt::format("cannot read the cache database '{}': {}", db_path, ec.message()));
  if (found.empty()) return Status();
  std::sort(found.begin(), found.end());
  return make_error(ErrorCode::kCorrupt,
                    fmt::format("the cache database '{}' has {} database files ({}{}) but no CURRENT file: it was lost; "
                                "`kiln cache repair` rebuilds it",
                                db_path, found.size(), found.front(), found.size() > 1 ? ", ..." : ""));
}

namespace {

// Opens the database at `path` as the writer with options `o` (creating missing column families), checks
// every table block, and closes it (flushing what it replayed from the log).
rocksdb::Status open_check_close(const std::string& path, rocksdb::DBOptions o) {
  o.create_missing_column_families = true;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(o, path, cf_descriptors(), &handles, &raw);
  if (!s.ok()) return s;
  Db db;
  db.db = raw;
  db.handles = std::move(handles);
  return db.db->VerifyChecksum();
}

}  // namespace

rocksdb::Status repair_db(const std::string& path, rocksdb::Env* env) {
  rocksdb::DBOptions o = db_options(false, env);
  o.create_if_missing = false;
  // A damaged write-ahead log: replaying it while skipping the records that fail their checksums keeps every
  // other record, of every column family. (RocksDB's repair drops the rest of a damaged log block, and the
  // records of column families that have no table file yet.)
  rocksdb::DBOptions skip = o;
  skip.wal_recovery_mode = rocksdb::WALRecoveryMode::kSkipAnyCorruptedRecords;
  if (open_check_close(path, skip).ok()) return rocksdb::Status::OK();
  // Everything else (a lost CURRENT or MANIFEST, damaged table files): rebuild the MANIFEST from the table
  // files and logs; a table file that cannot be read whole is set aside in lost/.
  rocksdb::Status s = rocksdb::RepairDB(path, o, cf_descriptors(), cf_options(-1));
  if (!s.ok()) return s;
  return open_check_close(path, o);
}

Status Store::Impl::quarantine_and_rebuild(const Status& why) {
  db.reset();
  std::error_code ec;
  fs::path q = quarantine_path(dir, "damaged");
  fs::create_directories(q.parent_path(), ec);
  if (!ec) fs::rename(db_path, q, ec);
  if (ec) {
    return Status(why).with_context(fmt::format("the cache database is damaged and could not be moved into '{}' ({})",
                                        q.parent_path().string(), ec.message()));
  }
  // Repair works on a copy: the quarantined original stays exactly as it was found.
  fs::copy(q, db_path, fs::copy_options::recursive, ec);
  rocksdb::Status repaired = ec ? rocksdb::Status::IOError("copying it back", ec.message()) : repair_db(db_path, env());
  Result<std::unique_ptr<Db>> d = make_error(ErrorCode::kCorrupt, repaired.ToString());
  if (repaired.ok()) d = open_db(db_path, true, {}, env());
  std::string how = "rebuilt it from what was intact";
  if (!d.ok()) {
    how = fmt::format("started an empty one (rebuilding failed: {})", d.status().to_string());
    fs::remove_all(db_path, ec);  // only the copy: the original is in quarantine
    d = open_db(db_path, true, {}, env());
  }
  if (!d.ok()) return d.status().with_context(fmt::format("the damaged cache database was moved to '{}'", q.string()));
  db = std::move(d).value();
  quarantined = q.string();
  std::set<std::string> lost = files_under(fs::path(db_path) / "lost");
  spdlog::error("kiln cache: the database '{}' is damaged: {}. Moved it to '{}' and {}{}; `kiln cache verify` checks "
                "the result", db_path, why.to_string(), quarantined, how,
                lost.empty() ? "" : fmt::format(" (RocksDB's repair set {} files aside in '{}/lost')", lost.size(), db_path));
  KILN_RETURN_IF_ERROR(note_write(write_format_record()));
  clean_dead();
  return Status();
}

Result<VerifyReport> verify_cache(const std::string& dir_in) {
  VerifyReport report;
  report.dir = dir_in.empty() ? default_cache_dir() : dir_in;
  const std::string db_path = report.dir + "/db";
  if (Status s = check_db_folder(db_path); !s.ok()) {
    if (s.code() != ErrorCode::kCorrupt) return s;
    report.damage.push_back(s.message());
    return report;
  }
  std::error_code ec;
  if (!fs::exists(fs::path(db_path) / "CURRENT", ec)) {
    return make_error(ErrorCode::kNotFound, fmt::format("no kiln cache in '{}'", report.dir));
  }
  // Without the writer role the database may change under the check: read it as a secondary, which RocksDB
  // supports beside a live writer. Holding the role, a read-only open changes nothing at all.
  auto lock = FileLock::acquire(report.dir + "/writer.lock", false);
  auto cfds = cf_descriptors();
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  rocksdb::DBOptions o = db_options(!lock.ok(), rocksdb::Env::Default());
  o.create_if_missing = false;
  o.create_missing_column_families = false;
  std::string secondary = fmt::format("{}/readers/verify-{}", report.dir, ::getpid());
  rocksdb::Status s;
  if (lock.ok()) {
    s = rocksdb::DB::OpenForReadOnly(o, db_path, cfds, &handles, &raw);
  } else {
    fs::create_directories(secondary, ec);
    s = rocksdb::DB::OpenAsSecondary(o, db_path, secondary, cfds, &handles, &raw);
  }
  if (!s.ok()) {
    fs::remove_all(secondary, ec);
    // A database whose creation was interrupted (a full disk) has a CURRENT but not all its column families.
    bool incomplete = s.IsInvalidArgument() && s.ToString().find("Column family not found") != std::string::npos;
    if (!is_damage(s) && !incomplete) return to_status(s, "DB::Open", __FILE__, __LINE__).with_context("verifying " + db_path);
    report.damage.push_back(s.ToString());
    return report;
  }
  Db db;
  db.db = raw;
  db.handles = std::move(handles);
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  ro.fill_cache = false;
  if (rocksdb::Status v = db.db->VerifyChecksum(ro); !v.ok()) report.damage.push_back(v.ToString());
  for (int cf = 0; cf < kCfCount; ++cf) {
    std::unique_ptr<rocksdb::Iterator> it(db.db->NewIterator(ro, db.cf(cf)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      report.checked++;
      Status e = check_entry(cf, it->key().ToStringView(), it->value().ToStringView());
      if (e.ok()) continue;
      report.bad++;
      if (report.errors.size() < 20) {
        std::string key;
        for (unsigned char c : it->key().ToStringView().substr(0, 80)) key += (c >= 0x20 && c < 0x7f) ? char(c) : '.';
        report.errors.push_back(fmt::format("{} '{}': {}", kCfNames[cf], key, e.message()));
      }
    }
    // A damaged block stops the iteration; VerifyChecksum named the file already when it found the same.
    if (!it->status().ok() && (report.damage.empty() || report.damage.back() != it->status().ToString())) {
      report.damage.push_back(fmt::format("reading {}: {}", kCfNames[cf], it->status().ToString()));
    }
  }
  fs::remove_all(secondary, ec);
  return report;
}

Result<RepairReport> repair_cache(const std::string& dir_in) {
  const std::string dir = dir_in.empty() ? default_cache_dir() : dir_in;
  const std::string db_path = dir + "/db";
  std::error_code ec;
  if (!fs::is_directory(db_path, ec)) return make_error(ErrorCode::kNotFound, fmt::format("no kiln cache database in '{}'", dir));
  RepairReport report;
  {
    auto lock = FileLock::acquire(dir + "/writer.lock", false);
    if (!lock.ok()) {
      if (lock.status().code() != ErrorCode::kUnavailable) return lock.status();
      std::string holder = FileLock::read_note(dir + "/writer.lock");
      return make_error(ErrorCode::kUnavailable,
                        fmt::format("another process holds the writer role of the cache '{}' ({}); repair needs it: "
                                    "stop the processes using the cache first", dir,
                                    holder.empty() ? "unknown" : holder.substr(0, holder.find('\n'))));
    }
    KILN_ASSIGN_OR_RETURN(FileLock open_lock, FileLock::acquire(dir + "/open.lock", true));
    fs::path backup = quarantine_path(dir, "before-repair");
    fs::create_directories(backup.parent_path(), ec);
    if (!ec) fs::copy(db_path, backup, fs::copy_options::recursive, ec);
    if (ec) {
      return make_error(ErrorCode::kIoError, fmt::format("cannot copy the cache database '{}' to '{}' before repairing "
                                                         "it: {}", db_path, backup.string(), ec.message()));
    }
    report.backup = backup.string();
    std::set<std::string> lost_before = files_under(fs::path(db_path) / "lost");
    rocksdb::Status s = repair_db(db_path, rocksdb::Env::Default());
    if (!s.ok()) {
      return to_status(s, "RepairDB", __FILE__, __LINE__)
          .with_context(fmt::format("repairing '{}' (a copy of it as it was is in '{}')", db_path, report.backup));
    }
    for (const auto& f : files_under(fs::path(db_path) / "lost")) {
      if (!lost_before.count(f)) report.set_aside.push_back(f);
    }
  }
  KILN_ASSIGN_OR_RETURN(report.after, verify_cache(dir));
  return report;
}

}  // namespace kiln::cache
