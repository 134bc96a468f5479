#include "kiln/cache/store.h"

#include <unistd.h>

#include <fmt/format.h>
#include <rocksdb/convenience.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/options.h>
#include <rocksdb/sst_file_reader.h>
#include <rocksdb/sst_file_writer.h>
#include <rocksdb/table.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "file_lock.h"
#include "format.h"
#include "rocks.h"
#include "sharded_map.h"

namespace kiln::cache {

namespace fs = std::filesystem;

namespace {

enum Cf : int { kBinaries = 0, kTimings = 1, kDecisions = 2, kMeta = 3, kCfCount = 4 };
constexpr std::array<const char*, kCfCount> kCfNames = {"binaries", "timings", "decisions", "meta"};

// One write: a whole value for one key of one column family, applied as a Merge (see rocks.h).
struct Entry {
  Cf cf;
  std::string key;
  std::string value;
};

using ProblemTimings = std::map<std::string, TimingRecord, std::less<>>;

// A record wins over another by the same rule first_wins() applies to stored values: newer stamp, then the
// larger encoding. Memory and database therefore agree on every key once they have seen the same writes.
bool timing_wins(const TimingRecord& a, const TimingRecord& b) {
  if (a.measured_at_ns != b.measured_at_ns) return a.measured_at_ns > b.measured_at_ns;
  return encode_timing(a) >= encode_timing(b);
}
bool decision_wins(const Decision& a, const Decision& b) {
  if (a.decided_at_ns != b.decided_at_ns) return a.decided_at_ns > b.decided_at_ns;
  return encode_decision(a) >= encode_decision(b);
}

rocksdb::ColumnFamilyOptions cf_options(int cf) {
  rocksdb::ColumnFamilyOptions o;
  o.merge_operator = make_newest_wins_merge();
  // LZ4 decompresses at several GB/s: preloading thousands of cubins must not wait on the codec.
  static const bool lz4 = [] {
    auto all = rocksdb::GetSupportedCompressions();
    return std::find(all.begin(), all.end(), rocksdb::kLZ4Compression) != all.end();
  }();
  o.compression = lz4 ? rocksdb::kLZ4Compression : rocksdb::kNoCompression;
  rocksdb::BlockBasedTableOptions t;
  // Bloom filters: a lookup skips the table files that do not hold its key instead of reading (and
  // decompressing) a data block of each overlapping one.
  t.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  if (cf == kBinaries) {
    t.block_size = 64 * 1024;
    o.write_buffer_size = 32 << 20;
  } else {
    o.write_buffer_size = 8 << 20;
  }
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
  return o;
}

rocksdb::Options sst_options(int cf) {
  return rocksdb::Options(rocksdb::DBOptions(), cf_options(cf));
}

rocksdb::DBOptions db_options(bool secondary) {
  rocksdb::DBOptions o;
  o.create_if_missing = true;
  o.create_missing_column_families = true;
  o.info_log_level = rocksdb::WARN_LEVEL;
  o.keep_log_file_num = 2;
  o.max_log_file_size = 1 << 20;
  o.max_background_jobs = 2;
  // A secondary keeps every table file open: the writer may delete files it still reads (RocksDB's rule).
  if (secondary) o.max_open_files = -1;
  return o;
}

// The RocksDB handle and its column families, closed in the right order.
struct Db {
  rocksdb::DB* db = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;  // default first, then kCfNames order
  bool primary = false;

  rocksdb::ColumnFamilyHandle* cf(int i) const { return handles[i + 1]; }

  ~Db() {
    if (db == nullptr) return;
    for (auto* h : handles) (void)db->DestroyColumnFamilyHandle(h);
    (void)db->Close();
    delete db;
  }
};

Result<std::unique_ptr<Db>> open_db(const std::string& path, bool primary, const std::string& secondary_dir) {
  std::vector<rocksdb::ColumnFamilyDescriptor> cfds;
  cfds.emplace_back(rocksdb::kDefaultColumnFamilyName, cf_options(-1));
  for (int i = 0; i < kCfCount; ++i) cfds.emplace_back(kCfNames[i], cf_options(i));
  auto out = std::make_unique<Db>();
  out->primary = primary;
  rocksdb::Status s = primary
      ? rocksdb::DB::Open(db_options(false), path, cfds, &out->handles, &out->db)
      : rocksdb::DB::OpenAsSecondary(db_options(true), path, secondary_dir, cfds, &out->handles, &out->db);
  if (!s.ok()) {
    return to_status(s, primary ? "DB::Open" : "DB::OpenAsSecondary", __FILE__, __LINE__)
        .with_context(fmt::format("opening the cache database '{}' as {}", path, primary ? "the writer" : "a reader"));
  }
  return out;
}

std::string random_token() {
  std::random_device rd;
  uint64_t r = (uint64_t(rd()) << 32) ^ rd();
  return fmt::format("{}-{:016x}", ::getpid(), r);
}

// The token in a staging or reader name: ".tmp-<token>-<seq>", "<stamp>-<token>-<seq>", "<token>".
bool token_alive(const std::string& procs_dir, const std::string& token) {
  std::string path = procs_dir + "/" + token + ".lock";
  std::error_code ec;
  if (!fs::exists(path, ec)) return false;
  auto lock = FileLock::acquire(path, false);
  return !lock.ok();
}

uint64_t dir_bytes(const fs::path& p) {
  uint64_t n = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(p, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code ec2;
    if (it->is_regular_file(ec2)) n += it->file_size(ec2);
  }
  return n;
}

}  // namespace

std::string default_cache_dir() {
  if (const char* d = std::getenv("KILN_CACHE_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/kiln";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/kiln";
  return ".kiln-cache";
}

struct Store::Impl {
  StoreOptions options;
  Toolchain toolchain;
  std::string dir, db_path, staging_dir, readers_dir, procs_dir, token;
  FileLock proc_lock;

  // Guards which database handle is open (the role): shared for every use of `db`, exclusive to swap it.
  mutable std::shared_mutex role_mu;
  std::unique_ptr<Db> db;
  FileLock writer_lock;
  std::atomic<bool> writer{false};
  bool staged_anything = false;
  std::mutex stage_mu;
  uint64_t stage_seq = 0;
  std::mutex ingest_mu;
  std::mutex catch_up_mu;
  std::chrono::steady_clock::time_point last_catch_up{};

  ShardedMap<Decision> decisions;
  ShardedMap<ProblemTimings> timings;
  ShardedMap<Binary> binaries;
  std::mutex used_mu;
  std::unordered_map<KernelKey, int64_t> used_written;

  std::mutex report_mu;
  std::atomic<uint64_t> invalid_loaded{0};
  bool reported_stale[kCfCount] = {};

  std::mutex ingest_thread_mu;
  std::condition_variable_any ingest_cv;
  std::jthread ingest_thread;

  void hook(std::string_view point) const {
    if (options.sync_point) options.sync_point(point);
  }
  std::string secondary_dir() const { return readers_dir + "/" + token; }
  std::string note() const { return fmt::format("pid {} ({})\n", ::getpid(), token); }

  // Once per entry per process (not per Store), and at most 20 lines: a damaged cache must not flood logs.
  void report_invalid(int cf, std::string_view key, const Status& why) {
    static std::mutex mu;
    static std::unordered_set<std::string> reported;
    std::lock_guard lock(mu);
    std::string id = dir + "|" + kCfNames[cf] + "|" + std::string(key);
    if (!reported.insert(id).second) return;
    if (reported.size() > 20) {
      if (reported.size() == 21) spdlog::warn("kiln cache: further invalid entries are not logged");
      return;
    }
    std::string printable;
    for (unsigned char c : key.substr(0, 120)) printable += (c >= 0x20 && c < 0x7f) ? char(c) : '.';
    spdlog::warn("kiln cache: {} entry '{}' is a miss: {} (it is replaced when written again)", kCfNames[cf],
                 printable, why.to_string());
  }

  void report_stale(int cf, const Toolchain& made_with) {
    std::lock_guard lock(report_mu);
    if (reported_stale[cf]) return;
    reported_stale[cf] = true;
    spdlog::info("kiln cache: {} made with {} are misses for {} (re-measured when needed)", kCfNames[cf],
                 made_with.str(), toolchain.str());
  }

  // ---- memory layer

  void merge_decision(Decision d) {
    auto incoming = std::make_shared<const Decision>(std::move(d));
    decisions.update(incoming->problem, [&](const std::shared_ptr<const Decision>& cur) {
      return (!cur || decision_wins(*incoming, *cur)) ? incoming : nullptr;
    });
  }

  void merge_timing(TimingRecord t) {
    std::string problem = t.problem;
    timings.update(problem, [&](const std::shared_ptr<const ProblemTimings>& cur) -> std::shared_ptr<const ProblemTimings> {
      if (cur) {
        auto it = cur->find(t.choice);
        if (it != cur->end() && !timing_wins(t, it->second)) return nullptr;
      }
      // Copy on write: readers keep the map they found.
      auto next = cur ? std::make_shared<ProblemTimings>(*cur) : std::make_shared<ProblemTimings>();
      (*next)[t.choice] = t;
      return next;
    });
  }

  // Decodes one stored timing/decision and merges it into memory; invalid ones are reported and counted.
  void absorb(int cf, std::string_view key, std::string_view value) {
    if (cf == kTimings) {
      auto t = decode_timing(value);
      if (t.ok() && timing_key(t->problem, t->choice) != key) t = make_error(ErrorCode::kCorrupt, "stored under another key");
      if (!t.ok()) {
        invalid_loaded++;
        return report_invalid(cf, key, t.status());
      }
      merge_timing(std::move(t).value());
    } else if (cf == kDecisions) {
      auto d = decode_decision(value);
      if (d.ok() && d->problem != key) d = make_error(ErrorCode::kCorrupt, "stored under another key");
      if (!d.ok()) {
        invalid_loaded++;
        return report_invalid(cf, key, d.status());
      }
      merge_decision(std::move(d).value());
    }
  }

  // Reads every timing and decision into memory. Caller holds role_mu (shared).
  Status load_memory() {
    invalid_loaded = 0;
    for (int cf : {kTimings, kDecisions}) {
      std::unique_ptr<rocksdb::Iterator> it(db->db->NewIterator(rocksdb::ReadOptions(), db->cf(cf)));
      for (it->SeekToFirst(); it->Valid(); it->Next()) absorb(cf, it->key().ToStringView(), it->value().ToStringView());
      KILN_CHECK(it->status());
    }
    return Status();
  }

  // ---- writing

  Status write(std::vector<Entry> entries) {
    hook("write:before");
    {
      std::shared_lock lock(role_mu);
      if (writer) {
        rocksdb::WriteBatch batch;
        for (const auto& e : entries) KILN_CHECK(batch.Merge(db->cf(e.cf), e.key, e.value));
        rocksdb::WriteOptions wo;
        wo.sync = options.sync_writes;
        KILN_CHECK(db->db->Write(wo, &batch));
      } else {
        KILN_RETURN_IF_ERROR(stage(std::move(entries)));
      }
    }
    hook("write:after");
    if (!writer) {
      // The role may be free (the writer closed or died): take it so staged entries land in the database.
      Status s = maybe_promote();
      if (!s.ok()) spdlog::warn("kiln cache: could not take over the writer role: {}", s.to_string());
    }
    return Status();
  }

  // Publishes entries as one staging batch: an SST file per column family in a folder renamed into place
  // whole, so the writer sees a batch completely or not at all.
  Status stage(std::vector<Entry> entries) {
    std::lock_guard lock(stage_mu);
    uint64_t seq = ++stage_seq;
    fs::path tmp = fs::path(staging_dir) / fmt::format(".tmp-{}-{:08d}", token, seq);
    std::error_code ec;
    fs::create_directories(tmp, ec);
    if (ec) return make_error(ErrorCode::kIoError, fmt::format("cannot create '{}': {}", tmp.string(), ec.message()));
    std::array<std::vector<Entry*>, kCfCount> by_cf;
    for (auto& e : entries) by_cf[e.cf].push_back(&e);
    for (int cf = 0; cf < kCfCount; ++cf) {
      auto& list = by_cf[cf];
      if (list.empty()) continue;
      // An SST holds each key once, in order: keep the winner of duplicates.
      std::stable_sort(list.begin(), list.end(), [](Entry* a, Entry* b) { return a->key < b->key; });
      rocksdb::SstFileWriter w(rocksdb::EnvOptions(), sst_options(cf));
      KILN_CHECK(w.Open((tmp / (std::string(kCfNames[cf]) + ".sst")).string()));
      for (size_t i = 0; i < list.size(); ++i) {
        Entry* best = list[i];
        while (i + 1 < list.size() && list[i + 1]->key == best->key) {
          ++i;
          if (!first_wins(best->value, list[i]->value)) best = list[i];
        }
        KILN_CHECK(w.Merge(best->key, best->value));
      }
      KILN_CHECK(w.Finish());
    }
    hook("stage:before_publish");
    fs::path final_name = fs::path(staging_dir) / fmt::format("{:020d}-{}-{:08d}", now_ns(), token, seq);
    fs::rename(tmp, final_name, ec);
    if (ec) return make_error(ErrorCode::kIoError, fmt::format("cannot publish '{}': {}", tmp.string(), ec.message()));
    staged_anything = true;
    hook("stage:after_publish");
    return Status();
  }

  std::vector<fs::path> staged_batches() const {
    std::vector<fs::path> out;
    std::error_code ec;
    for (auto it = fs::directory_iterator(staging_dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
      std::string name = it->path().filename().string();
      if (!name.empty() && name[0] != '.') out.push_back(it->path());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  // Writer only: applies every published staging batch. A batch is read and verified first (one whose values
  // fail their checks is dropped whole). Small batches, the common case of one measurement each, are written
  // together through one WriteBatch: microseconds each. Ingesting them as files instead flushes the memtable
  // for every batch whose keys overlap it (bench/cache measured about 20 ms per batch). A large batch (a bulk
  // import) is ingested as files (IngestExternalFiles), which skips the WAL and the memtable. The merge rule
  // makes the outcome independent of the order, and applying a batch twice (a writer killed between writing
  // it and deleting it) harmless.
  Status ingest_staged() {
    std::lock_guard lock(ingest_mu);
    std::shared_lock role(role_mu);
    if (!writer) return Status();
    auto batches = staged_batches();
    if (batches.empty()) return Status();
    hook("ingest:before");
    constexpr uintmax_t kIngestAsFilesBytes = 4u << 20;
    rocksdb::WriteBatch wb;
    std::vector<fs::path> written;
    std::vector<Entry> seen;  // timings and decisions, for this process's memory
    auto commit = [&]() -> Status {
      if (wb.Count() > 0) {
        KILN_CHECK(db->db->Write(rocksdb::WriteOptions(), &wb));
        wb.Clear();
      }
      for (const auto& b : written) {
        std::error_code ec;
        fs::remove_all(b, ec);
      }
      written.clear();
      for (auto& e : seen) absorb(e.cf, e.key, e.value);
      seen.clear();
      return Status();
    };
    for (const fs::path& batch : batches) {
      std::vector<std::pair<int, fs::path>> files;
      uintmax_t bytes = 0;
      for (int cf = 0; cf < kCfCount; ++cf) {
        fs::path file = batch / (std::string(kCfNames[cf]) + ".sst");
        std::error_code ec;
        if (!fs::exists(file, ec)) continue;
        bytes += fs::file_size(file, ec);
        files.emplace_back(cf, file);
      }
      const bool as_files = bytes > kIngestAsFilesBytes;
      std::vector<Entry> mine;  // the batch's entries, when it is written rather than ingested
      std::vector<Entry> mine_seen;
      Status bad;
      for (const auto& [cf, file] : files) {
        rocksdb::SstFileReader reader(sst_options(cf));
        rocksdb::Status s = reader.Open(file.string());
        if (s.ok()) s = reader.VerifyChecksum();
        if (!s.ok()) {
          bad = to_status(s, "SstFileReader", __FILE__, __LINE__);
          break;
        }
        std::unique_ptr<rocksdb::Iterator> it(reader.NewIterator(rocksdb::ReadOptions()));
        for (it->SeekToFirst(); it->Valid() && bad.ok(); it->Next()) {
          auto env = open_envelope(it->value().ToStringView());
          if (!env.ok()) {
            bad = env.status();
            break;
          }
          if (!as_files) mine.push_back({Cf(cf), it->key().ToString(), it->value().ToString()});
          if (cf == kTimings || cf == kDecisions) mine_seen.push_back({Cf(cf), it->key().ToString(), it->value().ToString()});
        }
        if (bad.ok() && !it->status().ok()) bad = to_status(it->status(), "SstFileReader iterator", __FILE__, __LINE__);
        if (!bad.ok()) break;
      }
      if (!bad.ok()) {
        spdlog::warn("kiln cache: dropping staged batch {}: {}", batch.filename().string(), bad.to_string());
        std::error_code ec;
        fs::remove_all(batch, ec);
        continue;
      }
      if (as_files) {
        KILN_RETURN_IF_ERROR(commit());
        std::vector<rocksdb::IngestExternalFileArg> args;
        for (const auto& [cf, file] : files) {
          rocksdb::IngestExternalFileArg arg;
          arg.column_family = db->cf(cf);
          arg.external_files = {file.string()};
          arg.options.move_files = true;
          arg.options.write_global_seqno = false;
          args.push_back(std::move(arg));
        }
        rocksdb::Status s = db->db->IngestExternalFiles(args);
        if (!s.ok()) return to_status(s, "IngestExternalFiles", __FILE__, __LINE__).with_context("ingesting " + batch.string());
      } else {
        for (const auto& e : mine) KILN_CHECK(wb.Merge(db->cf(e.cf), e.key, e.value));
      }
      written.push_back(batch);
      for (auto& e : mine_seen) seen.push_back(std::move(e));
      if (wb.GetDataSize() > (16u << 20)) KILN_RETURN_IF_ERROR(commit());
    }
    KILN_RETURN_IF_ERROR(commit());
    hook("ingest:after");
    return Status();
  }

  // Writer only: removes what dead processes left (unpublished staging folders, reader folders, lock files).
  void clean_dead() {
    std::error_code ec;
    std::unordered_map<std::string, bool> alive;
    auto is_alive = [&](const std::string& token) {
      auto it = alive.find(token);
      if (it != alive.end()) return it->second;
      return alive[token] = (token == this->token) || token_alive(procs_dir, token);
    };
    for (auto it = fs::directory_iterator(staging_dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
      std::string name = it->path().filename().string();
      if (name.rfind(".tmp-", 0) != 0) continue;
      std::string rest = name.substr(5);
      std::string token = rest.substr(0, rest.rfind('-'));
      std::error_code ec2;
      if (!is_alive(token)) fs::remove_all(it->path(), ec2);
    }
    for (auto it = fs::directory_iterator(readers_dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
      std::error_code ec2;
      if (!is_alive(it->path().filename().string())) fs::remove_all(it->path(), ec2);
    }
    for (auto it = fs::directory_iterator(procs_dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
      std::string name = it->path().filename().string();
      if (name.size() < 5 || name.substr(name.size() - 5) != ".lock") continue;
      std::string token = name.substr(0, name.size() - 5);
      if (token == this->token) continue;
      // Hold the lock while deleting, so a file is never removed under a live owner.
      auto lock = FileLock::acquire(it->path().string(), false);
      std::error_code ec2;
      if (lock.ok()) fs::remove(it->path(), ec2);
    }
  }

  Status write_format_record() {
    std::string value;
    rocksdb::Status s = db->db->Get(rocksdb::ReadOptions(), db->cf(kMeta), std::string(kMetaFormatKey), &value);
    if (s.ok()) {
      auto m = decode_meta(value);
      if (m.ok()) return Status();
      spdlog::warn("kiln cache: the format record of {} fails its checks ({}); rewriting it", dir, m.status().to_string());
    } else if (!s.IsNotFound()) {
      KILN_CHECK(s);
    }
    MetaRecord m{kFormatVersion, toolchain.kiln, now_ns()};
    KILN_CHECK(db->db->Merge(rocksdb::WriteOptions(), db->cf(kMeta), std::string(kMetaFormatKey), encode_meta(m)));
    return Status();
  }

  // Opens the database as the writer (holding `lock`) or as a reader. Caller holds role_mu exclusively or is
  // the constructor.
  Status open_role(bool as_writer, FileLock lock) {
    auto open_lock = FileLock::acquire(dir + "/open.lock", true);
    if (!open_lock.ok()) return open_lock.status();
    db.reset();
    if (as_writer) {
      auto d = open_db(db_path, true, {});
      if (d.ok()) {
        db = std::move(d).value();
        writer_lock = std::move(lock);
        writer = true;
        KILN_RETURN_IF_ERROR(write_format_record());
        clean_dead();
        return Status();
      }
      spdlog::warn("kiln cache: could not open {} as the writer: {}", db_path, d.status().to_string());
      lock.release();
      if (options.role == Role::kWriter) return d.status();
    }
    writer = false;
    std::error_code ec;
    if (!fs::exists(fs::path(db_path) / "CURRENT", ec)) {
      if (options.role == Role::kReader) return make_error(ErrorCode::kNotFound, fmt::format("no kiln cache in '{}'", dir));
      // Processes started together on an empty folder: the one holding the writer role may be creating the
      // database right now. Wait for it (bounded), or take the role if its holder goes. Polling is deliberate:
      // there is nothing to wait on across processes but the file itself.
      open_lock.value().release();
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (!fs::exists(fs::path(db_path) / "CURRENT", ec)) {
        auto lock = FileLock::acquire(dir + "/writer.lock", false, note());
        if (lock.ok()) return open_role(true, std::move(lock).value());
        if (std::chrono::steady_clock::now() > deadline) {
          return make_error(ErrorCode::kNotFound,
                            fmt::format("no kiln cache in '{}' and its writer did not create one within 30 s", dir));
        }
        hook("open:wait_for_writer");
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      open_lock = FileLock::acquire(dir + "/open.lock", true);
      if (!open_lock.ok()) return open_lock.status();
    }
    fs::create_directories(secondary_dir(), ec);
    KILN_ASSIGN_OR_RETURN(db, open_db(db_path, false, secondary_dir()));
    return Status();
  }

  Status maybe_promote(bool start_thread = true) {
    if (writer || options.role == Role::kReader) return Status();
    auto lock = FileLock::acquire(dir + "/writer.lock", false, note());
    if (!lock.ok()) return Status();  // someone else writes
    {
      std::unique_lock role(role_mu);
      hook("promote");
      KILN_RETURN_IF_ERROR(open_role(true, std::move(lock).value()));
    }
    KILN_RETURN_IF_ERROR(ingest_staged());
    if (start_thread) start_ingest_thread();
    return Status();
  }

  Status catch_up(bool force) {
    if (writer) return Status();
    std::lock_guard lock(catch_up_mu);
    auto now = std::chrono::steady_clock::now();
    if (!force && now - last_catch_up < std::chrono::milliseconds(50)) return Status();
    last_catch_up = now;
    std::shared_lock role(role_mu);
    if (writer) return Status();
    KILN_CHECK(db->db->TryCatchUpWithPrimary());
    return Status();
  }

  void start_ingest_thread() {
    if (options.ingest_interval.count() <= 0 || ingest_thread.joinable()) return;
    ingest_thread = std::jthread([this](std::stop_token stop) {
      std::unique_lock lock(ingest_thread_mu);
      while (!stop.stop_requested()) {
        ingest_cv.wait_for(lock, stop, options.ingest_interval, [] { return false; });
        if (stop.stop_requested()) break;
        lock.unlock();
        if (!staged_batches().empty()) {
          Status s = ingest_staged();
          if (!s.ok()) spdlog::warn("kiln cache: ingesting staged entries: {}", s.to_string());
        }
        lock.lock();
      }
    });
  }

  Status put(Decision& d) {
    if (d.problem.empty() || d.choice.empty()) {
      return make_error(ErrorCode::kInvalidArgument, "a decision needs a problem and a choice name");
    }
    if (d.decided_at_ns == 0) d.decided_at_ns = now_ns();
    if (d.toolchain.kiln.empty()) d.toolchain = toolchain;
    return Status();
  }

  Status put(TimingRecord& t) {
    if (t.problem.empty() || t.choice.empty()) {
      return make_error(ErrorCode::kInvalidArgument, "a timing needs a problem and a choice name");
    }
    if (t.measured_at_ns == 0) t.measured_at_ns = now_ns();
    if (t.toolchain.kiln.empty()) t.toolchain = toolchain;
    return Status();
  }
};

Store::Store(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<Store>> Store::open(StoreOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  impl->toolchain = impl->options.toolchain.value_or(Toolchain::current());
  impl->dir = impl->options.dir.empty() ? default_cache_dir() : impl->options.dir;
  impl->db_path = impl->dir + "/db";
  impl->staging_dir = impl->dir + "/staging";
  impl->readers_dir = impl->dir + "/readers";
  impl->procs_dir = impl->dir + "/procs";
  impl->token = random_token();
  std::error_code ec;
  if (impl->options.role == Role::kReader && !fs::exists(fs::path(impl->db_path) / "CURRENT", ec)) {
    return make_error(ErrorCode::kNotFound, fmt::format("no kiln cache in '{}'", impl->dir));
  }
  for (const auto& d : {impl->dir, impl->staging_dir, impl->readers_dir, impl->procs_dir}) {
    fs::create_directories(d, ec);
    if (ec) return make_error(ErrorCode::kIoError, fmt::format("cannot create '{}': {}", d, ec.message()));
  }
  KILN_ASSIGN_OR_RETURN(impl->proc_lock, FileLock::acquire(impl->procs_dir + "/" + impl->token + ".lock", false));

  FileLock writer_lock;
  if (impl->options.role != Role::kReader) {
    auto lock = FileLock::acquire(impl->dir + "/writer.lock", false, impl->note());
    if (lock.ok()) {
      writer_lock = std::move(lock).value();
    } else if (impl->options.role == Role::kWriter) {
      std::string holder = FileLock::read_note(impl->dir + "/writer.lock");
      return make_error(ErrorCode::kUnavailable,
                        fmt::format("another process holds the writer role of the cache '{}' ({})", impl->dir,
                                    holder.empty() ? "unknown" : holder.substr(0, holder.find('\n'))));
    }
  }
  bool as_writer = writer_lock.held();
  KILN_RETURN_IF_ERROR(impl->open_role(as_writer, std::move(writer_lock)));
  {
    std::shared_lock role(impl->role_mu);
    KILN_RETURN_IF_ERROR(impl->load_memory());
  }
  if (impl->writer) {
    KILN_RETURN_IF_ERROR(impl->ingest_staged());
    impl->start_ingest_thread();
  }
  return std::unique_ptr<Store>(new Store(std::move(impl)));
}

Store::~Store() {
  Impl& m = *impl_;
  // A reader whose staged entries nobody would ingest (the writer left) ingests them itself.
  if (!m.writer && m.staged_anything) (void)m.maybe_promote(false);
  if (m.ingest_thread.joinable()) {
    m.ingest_thread.request_stop();
    m.ingest_thread.join();
  }
  if (m.writer) {
    Status s = m.ingest_staged();
    if (!s.ok()) spdlog::warn("kiln cache: ingesting staged entries at close: {}", s.to_string());
  }
  {
    std::unique_lock role(m.role_mu);
    m.db.reset();
    m.writer_lock.release();
    m.writer = false;
  }
  std::error_code ec;
  fs::remove_all(m.secondary_dir(), ec);
  fs::remove(m.procs_dir + "/" + m.token + ".lock", ec);
  m.proc_lock.release();
}

const std::string& Store::dir() const { return impl_->dir; }
bool Store::is_writer() const { return impl_->writer; }
const Toolchain& Store::toolchain() const { return impl_->toolchain; }

Status Store::put_binary(const Binary& binary) {
  if (binary.cubin.empty()) return make_error(ErrorCode::kInvalidArgument, "a binary without a cubin");
  std::string key = binary_key(binary.key);
  KILN_RETURN_IF_ERROR(impl_->write({{kBinaries, key, encode_binary(binary, now_ns())}}));
  impl_->binaries.update(key, [&](const auto&) { return std::make_shared<const Binary>(binary); });
  return Status();
}

Result<std::shared_ptr<const Binary>> Store::get_binary(const KernelKey& key, std::string_view arch, bool remember) {
  Impl& m = *impl_;
  std::string k = binary_key(key);
  auto check_arch = [&](std::shared_ptr<const Binary> b) -> Result<std::shared_ptr<const Binary>> {
    if (!arch.empty() && b->arch != arch) {
      return make_error(ErrorCode::kNotFound, fmt::format("binary {} was built for {}, not {}", key.hex(), b->arch, arch));
    }
    return b;
  };
  if (auto hit = m.binaries.find(k)) return check_arch(std::move(hit));
  rocksdb::PinnableSlice value;
  rocksdb::Status s;
  for (int attempt = 0; attempt < 2; ++attempt) {
    {
      std::shared_lock role(m.role_mu);
      value.Reset();
      s = m.db->db->Get(rocksdb::ReadOptions(), m.db->cf(kBinaries), k, &value);
    }
    if (!s.IsNotFound() || m.writer || attempt == 1) break;
    // A reader's view may be behind the writer's: catch up once before calling it a miss.
    KILN_RETURN_IF_ERROR(m.catch_up(false));
  }
  if (s.IsNotFound()) return make_error(ErrorCode::kNotFound, fmt::format("no binary {} in the cache", key.hex()));
  KILN_CHECK(s);
  auto stored = decode_binary(value.ToStringView());
  Status bad;
  if (!stored.ok()) {
    bad = stored.status();
  } else if (stored->binary.key != key) {
    bad = make_error(ErrorCode::kCorrupt, fmt::format("holds binary {}", stored->binary.key.hex()));
  } else if (m.toolchain.nvrtc_major != 0 && (stored->binary.nvrtc_major != m.toolchain.nvrtc_major ||
                                              stored->binary.nvrtc_minor != m.toolchain.nvrtc_minor)) {
    bad = make_error(ErrorCode::kFailedPrecondition,
                     fmt::format("built by NVRTC {}.{}, this is {}.{}", stored->binary.nvrtc_major,
                                 stored->binary.nvrtc_minor, m.toolchain.nvrtc_major, m.toolchain.nvrtc_minor));
  }
  if (!bad.ok()) {
    m.report_invalid(kBinaries, key.hex(), bad);
    return make_error(ErrorCode::kNotFound, fmt::format("binary {} is a miss: {}", key.hex(), bad.to_string()));
  }
  auto b = std::make_shared<const Binary>(std::move(stored->binary));
  if (remember) m.binaries.update(k, [&](const auto&) { return b; });
  return check_arch(std::move(b));
}

bool Store::has_binary(const KernelKey& key) { return get_binary(key, {}, false).ok(); }

Status Store::touch(const std::vector<KernelKey>& keys) {
  Impl& m = *impl_;
  int64_t now = now_ns();
  constexpr int64_t kHour = 3600LL * 1000 * 1000 * 1000;
  std::vector<Entry> entries;
  {
    std::lock_guard lock(m.used_mu);
    for (const auto& k : keys) {
      int64_t& last = m.used_written[k];
      if (now - last < kHour) continue;
      last = now;
      entries.push_back({kMeta, used_key(k), encode_used(now)});
    }
  }
  if (entries.empty()) return Status();
  return m.write(std::move(entries));
}

Status Store::put_all(std::vector<TimingRecord> timings, std::vector<Decision> decisions,
                      const std::vector<Binary>& binaries) {
  Impl& m = *impl_;
  std::vector<Entry> entries;
  for (auto& t : timings) {
    KILN_RETURN_IF_ERROR(m.put(t));
    entries.push_back({kTimings, timing_key(t.problem, t.choice), encode_timing(t)});
  }
  for (auto& d : decisions) {
    KILN_RETURN_IF_ERROR(m.put(d));
    entries.push_back({kDecisions, d.problem, encode_decision(d)});
  }
  int64_t now = now_ns();
  for (const auto& b : binaries) {
    if (b.cubin.empty()) return make_error(ErrorCode::kInvalidArgument, "a binary without a cubin");
    entries.push_back({kBinaries, binary_key(b.key), encode_binary(b, now)});
  }
  if (entries.empty()) return Status();
  KILN_RETURN_IF_ERROR(m.write(std::move(entries)));
  for (auto& t : timings) m.merge_timing(std::move(t));
  for (auto& d : decisions) m.merge_decision(std::move(d));
  return Status();
}

Status Store::put_timing(TimingRecord t) {
  KILN_RETURN_IF_ERROR(impl_->put(t));
  KILN_RETURN_IF_ERROR(impl_->write({{kTimings, timing_key(t.problem, t.choice), encode_timing(t)}}));
  impl_->merge_timing(std::move(t));
  return Status();
}

std::optional<TimingRecord> Store::timing(std::string_view problem, std::string_view choice) const {
  auto all = impl_->timings.find(problem);
  if (!all) return std::nullopt;
  auto it = all->find(choice);
  if (it == all->end()) return std::nullopt;
  if (it->second.toolchain != impl_->toolchain) {
    impl_->report_stale(kTimings, it->second.toolchain);
    return std::nullopt;
  }
  return it->second;
}

std::vector<TimingRecord> Store::timings(std::string_view problem) const {
  std::vector<TimingRecord> out;
  if (auto all = impl_->timings.find(problem)) {
    for (const auto& [choice, t] : *all) {
      if (t.toolchain == impl_->toolchain) out.push_back(t);
    }
  }
  return out;
}

Status Store::put_decision(Decision d) {
  KILN_RETURN_IF_ERROR(impl_->put(d));
  KILN_RETURN_IF_ERROR(impl_->write({{kDecisions, d.problem, encode_decision(d)}}));
  impl_->merge_decision(std::move(d));
  return Status();
}

std::shared_ptr<const Decision> Store::decision(std::string_view problem) const {
  auto d = impl_->decisions.find(problem);
  if (d && d->toolchain != impl_->toolchain) {
    impl_->report_stale(kDecisions, d->toolchain);
    return nullptr;
  }
  return d;
}

std::vector<std::shared_ptr<const Decision>> Store::decisions(std::string_view prefix) const {
  std::vector<std::shared_ptr<const Decision>> out;
  for (auto& [problem, d] : impl_->decisions.entries()) {
    if (problem.compare(0, prefix.size(), prefix) == 0 && d->toolchain == impl_->toolchain) out.push_back(d);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a->problem < b->problem; });
  return out;
}

std::vector<TimingRecord> Store::all_timings() const {
  std::vector<TimingRecord> out;
  for (auto& [problem, all] : impl_->timings.entries()) {
    for (const auto& [choice, t] : *all) {
      if (t.toolchain == impl_->toolchain) out.push_back(t);
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return std::tie(a.problem, a.choice) < std::tie(b.problem, b.choice);
  });
  return out;
}

Result<uint64_t> Store::for_each_binary(const std::function<bool(const BinaryInfo&)>& fn) {
  Impl& m = *impl_;
  std::shared_lock role(m.role_mu);
  std::unordered_map<KernelKey, int64_t> used;
  {
    std::unique_ptr<rocksdb::Iterator> it(m.db->db->NewIterator(rocksdb::ReadOptions(), m.db->cf(kMeta)));
    for (it->Seek(std::string(kUsedPrefix)); it->Valid() && it->key().starts_with(std::string(kUsedPrefix)); it->Next()) {
      auto key = parse_binary_key(it->key().ToStringView().substr(kUsedPrefix.size()));
      auto when = decode_used(it->value().ToStringView());
      if (key.ok() && when.ok()) used[*key] = *when;
    }
    KILN_CHECK(it->status());
  }
  uint64_t invalid = 0;
  std::unique_ptr<rocksdb::Iterator> it(m.db->db->NewIterator(rocksdb::ReadOptions(), m.db->cf(kBinaries)));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    auto info = decode_binary_info(it->value().ToStringView());
    auto key = parse_binary_key(it->key().ToStringView());
    if (info.ok() && (!key.ok() || *key != info->key)) info = make_error(ErrorCode::kCorrupt, "stored under another key");
    if (!info.ok()) {
      ++invalid;
      continue;
    }
    if (auto u = used.find(info->key); u != used.end()) info->used_at_ns = u->second;
    if (!fn(*info)) break;
  }
  KILN_CHECK(it->status());
  return invalid;
}

Status Store::refresh() {
  KILN_RETURN_IF_ERROR(impl_->catch_up(true));
  std::shared_lock role(impl_->role_mu);
  return impl_->load_memory();
}

Status Store::sync() {
  Impl& m = *impl_;
  if (!m.writer) KILN_RETURN_IF_ERROR(m.maybe_promote());
  if (!m.writer) return Status();
  KILN_RETURN_IF_ERROR(m.ingest_staged());
  m.clean_dead();
  std::shared_lock role(m.role_mu);
  if (m.writer) KILN_CHECK(m.db->db->SyncWAL());
  return Status();
}

Status Store::flush() {
  Impl& m = *impl_;
  std::shared_lock role(m.role_mu);
  if (!m.writer) return Status();
  rocksdb::FlushOptions fo;
  std::vector<rocksdb::ColumnFamilyHandle*> cfs(m.db->handles.begin() + 1, m.db->handles.end());
  KILN_CHECK(m.db->db->Flush(fo, cfs));
  return Status();
}

Result<StoreStats> Store::stats() {
  Impl& m = *impl_;
  StoreStats st;
  st.dir = m.dir;
  st.writer = m.writer;
  std::map<std::string, uint64_t> by_arch;
  KILN_ASSIGN_OR_RETURN(uint64_t invalid_binaries, for_each_binary([&](const BinaryInfo& b) {
                          st.binaries++;
                          st.binary_bytes += b.value_bytes;
                          by_arch[b.arch]++;
                          if (b.nvrtc_major != m.toolchain.nvrtc_major || b.nvrtc_minor != m.toolchain.nvrtc_minor) st.stale++;
                          return true;
                        }));
  st.binaries_by_arch.assign(by_arch.begin(), by_arch.end());
  for (auto& [problem, all] : m.timings.entries()) {
    for (const auto& [choice, t] : *all) {
      if (t.toolchain != m.toolchain) {
        st.stale++;
      } else {
        (t.ok ? st.timings : st.failures)++;
      }
    }
  }
  for (auto& [problem, d] : m.decisions.entries()) (d->toolchain == m.toolchain ? st.decisions : st.stale)++;
  st.invalid = invalid_binaries + m.invalid_loaded;
  st.staged_batches = m.staged_batches().size();
  st.disk_bytes = dir_bytes(m.dir);
  return st;
}

Result<PruneReport> Store::prune(const PruneOptions& o) {
  Impl& m = *impl_;
  if (!m.writer) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "pruning needs the writer role; another process using the cache holds it");
  }
  KILN_RETURN_IF_ERROR(m.ingest_staged());
  PruneReport report;
  const int64_t now = now_ns();
  const int64_t cutoff = o.older_than.count() > 0 ? now - int64_t(o.older_than.count()) * 1000000000LL : INT64_MIN;
  rocksdb::WriteBatch batch;
  std::vector<std::string> dropped_binaries;

  // Binaries: by arch, toolchain and age first, then the least recently used until under the size bound.
  struct Candidate {
    BinaryInfo info;
    int64_t last_use;
  };
  std::vector<Candidate> kept;
  {
    std::shared_lock role(m.role_mu);
    std::unordered_map<KernelKey, int64_t> used;
    std::unique_ptr<rocksdb::Iterator> ui(m.db->db->NewIterator(rocksdb::ReadOptions(), m.db->cf(kMeta)));
    for (ui->Seek(std::string(kUsedPrefix)); ui->Valid() && ui->key().starts_with(std::string(kUsedPrefix)); ui->Next()) {
      auto key = parse_binary_key(ui->key().ToStringView().substr(kUsedPrefix.size()));
      auto when = decode_used(ui->value().ToStringView());
      if (!key.ok() || !when.ok()) {
        report.invalid++;
        KILN_CHECK(batch.Delete(m.db->cf(kMeta), ui->key()));
      } else {
        used[*key] = *when;
      }
    }
    std::unique_ptr<rocksdb::Iterator> it(m.db->db->NewIterator(rocksdb::ReadOptions(), m.db->cf(kBinaries)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      auto info = decode_binary_info(it->value().ToStringView());
      auto key = parse_binary_key(it->key().ToStringView());
      bool drop = false;
      if (!info.ok() || !key.ok() || *key != info->key) {
        report.invalid++;
        drop = true;
      } else {
        int64_t last_use = std::max(info->created_at_ns, used.count(*key) ? used[*key] : 0);
        bool other_nvrtc = info->nvrtc_major != m.toolchain.nvrtc_major || info->nvrtc_minor != m.toolchain.nvrtc_minor;
        drop = (!o.arch.empty() && info->arch == o.arch) || (o.other_toolchains && other_nvrtc) || last_use < cutoff;
        if (drop) {
          report.binaries++;
          report.binary_bytes += it->value().size();
        } else {
          kept.push_back({std::move(info).value(), last_use});
        }
      }
      if (drop) {
        KILN_CHECK(batch.Delete(m.db->cf(kBinaries), it->key()));
        dropped_binaries.push_back(it->key().ToString());
      }
    }
    KILN_CHECK(it->status());
    if (o.max_binary_bytes > 0) {
      uint64_t total = 0;
      for (const auto& c : kept) total += c.info.value_bytes;
      std::sort(kept.begin(), kept.end(), [](const Candidate& a, const Candidate& b) { return a.last_use < b.last_use; });
      for (const auto& c : kept) {
        if (total <= o.max_binary_bytes) break;
        total -= c.info.value_bytes;
        report.binaries++;
        report.binary_bytes += c.info.value_bytes;
        std::string k = binary_key(c.info.key);
        KILN_CHECK(batch.Delete(m.db->cf(kBinaries), k));
        dropped_binaries.push_back(k);
      }
    }
    for (const auto& k : dropped_binaries) KILN_CHECK(batch.Delete(m.db->cf(kMeta), std::string(kUsedPrefix) + k));

    // Timings and decisions: invalid, made with another toolchain, or older than the cutoff.
    for (int cf : {kTimings, kDecisions}) {
      std::unique_ptr<rocksdb::Iterator> ti(m.db->db->NewIterator(rocksdb::ReadOptions(), m.db->cf(cf)));
      for (ti->SeekToFirst(); ti->Valid(); ti->Next()) {
        std::optional<Toolchain> made_with;
        int64_t stamp = 0;
        std::string_view key = ti->key().ToStringView();
        if (cf == kTimings) {
          auto t = decode_timing(ti->value().ToStringView());
          if (t.ok() && timing_key(t->problem, t->choice) == key) made_with = t->toolchain, stamp = t->measured_at_ns;
        } else {
          auto d = decode_decision(ti->value().ToStringView());
          if (d.ok() && d->problem == key) made_with = d->toolchain, stamp = d->decided_at_ns;
        }
        bool drop = !made_with || (o.other_toolchains && *made_with != m.toolchain) || stamp < cutoff;
        if (!drop) continue;
        (!made_with ? report.invalid : cf == kTimings ? report.timings : report.decisions)++;
        KILN_CHECK(batch.Delete(m.db->cf(cf), ti->key()));
        if (!o.dry_run) {
          std::string key = ti->key().ToString();
          if (cf == kDecisions) {
            m.decisions.erase(key);
          } else {
            std::string problem = key.substr(0, key.find('\0'));
            std::string choice = key.substr(key.find('\0') + 1);
            m.timings.update(problem, [&](const std::shared_ptr<const ProblemTimings>& cur) -> std::shared_ptr<const ProblemTimings> {
              if (!cur) return nullptr;
              auto next = std::make_shared<ProblemTimings>(*cur);
              next->erase(choice);
              return next;
            });
          }
        }
      }
      KILN_CHECK(ti->status());
    }
    if (o.dry_run) return report;
    KILN_CHECK(m.db->db->Write(rocksdb::WriteOptions(), &batch));
    m.invalid_loaded = 0;  // every invalid timing and decision was just dropped
    for (const auto& k : dropped_binaries) m.binaries.erase(k);
    // Reclaim the space now rather than at the next compaction.
    for (int cf = 0; cf < kCfCount; ++cf) {
      KILN_CHECK(m.db->db->CompactRange(rocksdb::CompactRangeOptions(), m.db->cf(cf), nullptr, nullptr));
    }
  }
  return report;
}

Status Store::clear() {
  Impl& m = *impl_;
  if (!m.writer) {
    return make_error(ErrorCode::kFailedPrecondition, "clearing needs the writer role; another process using the cache holds it");
  }
  std::shared_lock role(m.role_mu);
  rocksdb::WriteBatch batch;
  for (int cf = 0; cf < kCfCount; ++cf) {
    std::unique_ptr<rocksdb::Iterator> it(m.db->db->NewIterator(rocksdb::ReadOptions(), m.db->cf(cf)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      if (cf == kMeta && it->key() == rocksdb::Slice(kMetaFormatKey.data(), kMetaFormatKey.size())) continue;
      KILN_CHECK(batch.Delete(m.db->cf(cf), it->key()));
    }
    KILN_CHECK(it->status());
  }
  KILN_CHECK(m.db->db->Write(rocksdb::WriteOptions(), &batch));
  m.decisions.clear();
  m.timings.clear();
  m.binaries.clear();
  for (int cf = 0; cf < kCfCount; ++cf) {
    KILN_CHECK(m.db->db->CompactRange(rocksdb::CompactRangeOptions(), m.db->cf(cf), nullptr, nullptr));
  }
  return Status();
}

}  // namespace kiln::cache
