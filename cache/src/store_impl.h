// Internal: the state behind kiln::cache::Store, shared by the files that implement it. Each file owns one
// concern, so a reader looking for how a lookup works does not wade through recovery or pruning:
//
//   store_open.cpp         the folder, RocksDB's options, opening, the writer/reader roles, taking the role
//                          over, catching up with the writer, and cleaning what dead processes left
//   store_read.cpp         the in-memory layer (loading, merging by stamp, reporting misses) and every lookup
//   store_write.cpp        puts and batches: the writer's direct write, a reader's staged batch, and the
//                          writer's ingest of staged batches (also in the background)
//   store_maintenance.cpp  whole-cache operations: iterating binaries, stats, flush, prune, clear
//   store_integrity.cpp    damage: checking the folder before opening, quarantine and rebuild, verify, repair
//
// Design and trade-offs: docs/cache.md.
#pragma once

#include <rocksdb/db.h>
#include <rocksdb/options.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "file_lock.h"
#include "kiln/cache/store.h"
#include "sharded_map.h"

namespace kiln::cache {

enum Cf : int { kBinaries = 0, kTimings = 1, kDecisions = 2, kMeta = 3, kCfCount = 4 };
inline constexpr std::array<const char*, kCfCount> kCfNames = {"binaries", "timings", "decisions", "meta"};

// One write: a whole value for one key of one column family, applied as a Merge (see rocks.h).
struct Entry {
  Cf cf;
  std::string key;
  std::string value;
};

using ProblemTimings = std::map<std::string, TimingRecord, std::less<>>;

/// The options of column family `cf` (-1: the default one), shared by the database and the SST files that
/// readers stage, so that staged files ingest as they are.
rocksdb::ColumnFamilyOptions cf_options(int cf);
rocksdb::Options sst_options(int cf, rocksdb::Env* env = rocksdb::Env::Default());
/// The database's options. `secondary`: a reader's (keeps every table file open).
rocksdb::DBOptions db_options(bool secondary, rocksdb::Env* env);
/// The default column family, then kCfNames, each with cf_options().
std::vector<rocksdb::ColumnFamilyDescriptor> cf_descriptors();

struct Db;

/// Opens the database at `path` as the writer (`primary`) or as a reader whose own files live in
/// `secondary_dir`. Errors: kCorrupt for damage (is_damage), else what to_status() says; each names the path.
Result<std::unique_ptr<Db>> open_db(const std::string& path, bool primary, const std::string& secondary_dir,
                                    rocksdb::Env* env);

/// Whether RocksDB's status means the database's files are damaged or missing (rather than, say, a busy
/// lock or a full disk): the cases quarantine and repair are for.
bool is_damage(const rocksdb::Status& s);
/// Refuses, before RocksDB sees it, a database path that is not a folder, and one that holds table files or
/// logs but no CURRENT (RocksDB would create a new empty database over them and later delete them).
/// Errors: kIoError (not a folder), kCorrupt (CURRENT missing).
Status check_db_folder(const std::string& db_path);
/// RocksDB's repair on the database at `path`, with kiln's column families.
rocksdb::Status repair_db(const std::string& path, rocksdb::Env* env);

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

  std::string quarantined;  // where open moved a damaged database (empty: none)
  mutable std::mutex write_error_mu;
  Status write_error;     // the first failed write
  Status database_error;  // the first failed write to the database: no more writes go to it (see note_write)

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
  rocksdb::Env* env() const;
  rocksdb::WriteOptions write_options() const;
  // Remembers the first failed write (first_write_error()) and passes `s` on. `to_database`: the write went to
  // RocksDB, whose log writer is left in an error state that a later write or sync trips over (an assertion
  // in the distribution's build), so the store writes nothing more to this database until it is reopened.
  Status note_write(Status s, bool to_database = true);
  // The error that stopped writes to the database (OK when none did).
  Status database_writable() const;
  // What the writer lock file says about its holder.
  std::string note() const;

  // ---- roles and recovery (store_open.cpp)

  Status open_role(bool as_writer, FileLock lock);
  // Writer, at open: moves the damaged database aside into quarantine/, rebuilds one from a copy with
  // RocksDB's repair (or starts an empty one when that fails too) and opens it. `why` names the damage.
  Status quarantine_and_rebuild(const Status& why);
  Status write_format_record();
  // Takes the writer role if it is free (and this store may write), then ingests what readers staged.
  Status maybe_promote(bool start_thread = true);
  // A reader: makes what the writer wrote since visible (at most every 50 ms unless forced).
  Status catch_up(bool force);
  void clean_dead();

  // ---- the memory layer (store_read.cpp)

  void report_invalid(int cf, std::string_view key, const Status& why);
  // Decodes and checks a stored binary value read under `k` (= binary_key(key)); a bad one is a reported miss.
  Result<std::shared_ptr<const Binary>> decode_stored_binary(const KernelKey& key, const std::string& k,
                                                             std::string_view value, bool remember);
  void report_stale(int cf, const Toolchain& made_with);
  void merge_decision(Decision d);
  void merge_timing(TimingRecord t);
  void absorb(int cf, std::string_view key, std::string_view value);
  Status load_memory();

  // ---- writing (store_write.cpp)

  Status write(std::vector<Entry> entries);
  Status stage(std::vector<Entry> entries);
  std::vector<std::filesystem::path> staged_batches() const;
  Status ingest_staged();
  void start_ingest_thread();
};

}  // namespace kiln::cache
