// Store: opening a cache folder and holding a role in it. The folder's layout, RocksDB's options, the
// writer/reader roles (the flock'ed writer.lock), taking the role over when the writer leaves, a reader
// catching up with the writer, and recovery: the format record, and cleaning what dead processes left.
// Everything that decides which database handle this process holds lives here, so the rest of the store
// (store_read.cpp, store_write.cpp, store_maintenance.cpp) only uses the handle under role_mu.
#include <sys/statvfs.h>
#include <unistd.h>

#include <fmt/format.h>
#include <rocksdb/convenience.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/table.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <random>

#include "format.h"
#include "rocks.h"
#include "store_env.h"
#include "store_impl.h"

namespace kiln::cache {

namespace fs = std::filesystem;

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

rocksdb::Options sst_options(int cf, rocksdb::Env* env) {
  rocksdb::Options o(rocksdb::DBOptions(), cf_options(cf));
  o.env = env;
  return o;
}

std::vector<rocksdb::ColumnFamilyDescriptor> cf_descriptors() {
  std::vector<rocksdb::ColumnFamilyDescriptor> cfds;
  cfds.emplace_back(rocksdb::kDefaultColumnFamilyName, cf_options(-1));
  for (int i = 0; i < kCfCount; ++i) cfds.emplace_back(kCfNames[i], cf_options(i));
  return cfds;
}

rocksdb::DBOptions db_options(bool secondary, rocksdb::Env* env) {
  rocksdb::DBOptions o;
  o.env = env;
  // Damage is found at open, not served as a silently shorter cache: every table file is opened and its size
  // checked (max_open_files -1), and a write-ahead log whose records fail their checksums fails the open.
  // Only an incomplete last record is tolerated: what a process killed in the middle of a write leaves.
  o.paranoid_checks = true;
  o.wal_recovery_mode = rocksdb::WALRecoveryMode::kTolerateCorruptedTailRecords;
  o.create_if_missing = true;
  o.create_missing_column_families = true;
  o.info_log_level = rocksdb::WARN_LEVEL;
  o.keep_log_file_num = 2;
  o.max_log_file_size = 1 << 20;
  o.max_background_jobs = 2;
  // Every table file open: a secondary must (the writer may delete files it still reads, RocksDB's rule), and
  // for the writer it is what checks each file's size at open (a truncated table file is damage found then).
  o.max_open_files = -1;
  // Opening those files: RocksDB starts this many threads per column family at every open, however few files
  // there are (the default 16 made an open of a small cache start ~80 threads: 12 ms of a 14 ms open). A
  // cache holds tens of table files, each opened in microseconds: one thread does it.
  o.max_file_opening_threads = 1;
  (void)secondary;
  return o;
}

Result<std::unique_ptr<Db>> open_db(const std::string& path, bool primary, const std::string& secondary_dir,
                                    rocksdb::Env* env) {
  KILN_RETURN_IF_ERROR(check_db_folder(path));
  auto cfds = cf_descriptors();
  auto out = std::make_unique<Db>();
  out->primary = primary;
  rocksdb::Status s = primary
      ? rocksdb::DB::Open(db_options(false, env), path, cfds, &out->handles, &out->db)
      : rocksdb::DB::OpenAsSecondary(db_options(true, env), path, secondary_dir, cfds, &out->handles, &out->db);
  if (!s.ok()) {
    Status st = to_status(s, primary ? "DB::Open" : "DB::OpenAsSecondary", __FILE__, __LINE__);
    if (is_damage(s)) st = make_error(ErrorCode::kCorrupt, st.message() + "; `kiln cache repair` rebuilds it");
    return st.with_context(fmt::format("opening the cache database '{}' as {}", path, primary ? "the writer" : "a reader"));
  }
  return out;
}

namespace {

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

}  // namespace

std::string default_cache_dir() {
  if (const char* d = std::getenv("KILN_CACHE_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/kiln";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/kiln";
  return ".kiln-cache";
}

std::string Store::Impl::note() const { return fmt::format("pid {} ({})\n", ::getpid(), token); }

rocksdb::Env* Store::Impl::env() const { return env_of(options); }

rocksdb::WriteOptions Store::Impl::write_options() const {
  rocksdb::WriteOptions wo;
  wo.sync = options.sync_writes;
  return wo;
}

Status Store::Impl::note_write(Status s, bool to_database) {
  if (!s.ok()) {
    std::lock_guard lock(write_error_mu);
    if (write_error.ok()) write_error = s;
    if (to_database && database_error.ok()) database_error = s;
  }
  return s;
}

Status Store::Impl::database_writable() const {
  std::lock_guard lock(write_error_mu);
  if (database_error.ok()) return Status();
  return make_error(database_error.code(), fmt::format("the cache stopped writing to '{}' after a failed write "
                                                       "(reopen it to retry): {}", db_path, database_error.to_string()));
}

Status Store::Impl::write_format_record() {
  std::string value;
  rocksdb::Status s = db->db->Get(rocksdb::ReadOptions(), db->cf(kMeta), std::string(kMetaFormatKey), &value);
  if (s.ok()) {
    auto m = decode_meta(value);
    if (m.ok()) return Status();
    spdlog::warn("kiln cache: the format record of {} fails its checks ({}); rewriting it", dir, m.status().to_string());
  } else if (!s.IsNotFound()) {
    KILN_CHECK(s);
  }
  KILN_RETURN_IF_ERROR(database_writable());
  MetaRecord m{kFormatVersion, toolchain.kiln, now_ns()};
  KILN_CHECK(db->db->Merge(write_options(), db->cf(kMeta), std::string(kMetaFormatKey), encode_meta(m)));
  return Status();
}

// Opens the database as the writer (holding `lock`) or as a reader. Caller holds role_mu exclusively or is
// Store::open.
Status Store::Impl::open_role(bool as_writer, FileLock lock) {
  auto open_lock = FileLock::acquire(dir + "/open.lock", true);
  if (!open_lock.ok()) return open_lock.status();
  db.reset();
  if (as_writer) {
    auto d = open_db(db_path, true, {}, env());
    if (!d.ok() && d.status().code() == ErrorCode::kCorrupt && options.on_damage == OnDamage::kQuarantine) {
      writer_lock = std::move(lock);
      writer = true;
      Status s = quarantine_and_rebuild(d.status());
      if (s.ok()) return Status();
      d = s;
      lock = std::move(writer_lock);
      writer = false;
    }
    if (d.ok()) {
      db = std::move(d).value();
      writer_lock = std::move(lock);
      writer = true;
      KILN_RETURN_IF_ERROR(note_write(write_format_record()));
      clean_dead();
      return Status();
    }
    // Without a database to read (the path is a file, the disk is full, ...) a reader would wait for a writer
    // that is this process, retrying forever: report why it failed. Damage is reported too. A database this
    // process may read but not write (its folder is read-only to us) can still be read.
    std::error_code ec;
    if (options.role == Role::kWriter || d.status().code() == ErrorCode::kCorrupt ||
        !fs::exists(fs::path(db_path) / "CURRENT", ec)) {
      return d.status();
    }
    spdlog::warn("kiln cache: could not open {} as the writer ({}); reading it", db_path, d.status().to_string());
    lock.release();
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
  KILN_ASSIGN_OR_RETURN(db, open_db(db_path, false, secondary_dir(), env()));
  return Status();
}

Status Store::Impl::maybe_promote(bool start_thread) {
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

Status Store::Impl::catch_up(bool force) {
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

// Writer only: removes what dead processes left (unpublished staging folders, reader folders, lock files).
void Store::Impl::clean_dead() {
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
  if (impl->dir.empty()) return make_error(ErrorCode::kInvalidArgument, "the cache folder is an empty path");
  // Damage is left to the writer's open (which may quarantine it); a reader reports it now.
  if (Status s = check_db_folder(impl->db_path); !s.ok() && (s.code() != ErrorCode::kCorrupt || impl->options.role == Role::kReader)) {
    return s;
  }
  if (impl->options.role == Role::kReader && !fs::exists(fs::path(impl->db_path) / "CURRENT", ec)) {
    return make_error(ErrorCode::kNotFound, fmt::format("no kiln cache in '{}'", impl->dir));
  }
  for (const auto& d : {impl->dir, impl->staging_dir, impl->readers_dir, impl->procs_dir}) {
    if (fs::exists(d, ec) && !fs::is_directory(d, ec)) {
      return make_error(ErrorCode::kIoError, fmt::format("cannot use '{}': it is a file, not a folder", d));
    }
    fs::create_directories(d, ec);
    if (ec) return make_error(ErrorCode::kIoError, fmt::format("cannot create '{}': {}", d, ec.message()));
  }
  if (struct statvfs v {}; impl->options.min_free_bytes > 0 && ::statvfs(impl->dir.c_str(), &v) == 0 &&
                            uint64_t(v.f_bavail) * v.f_frsize < impl->options.min_free_bytes) {
    return make_error(ErrorCode::kIoError,
                      fmt::format("not enough free space for the cache '{}': {} KiB free, kiln needs {} KiB to open it "
                                  "safely (free some space, or point --cache-dir elsewhere)",
                                  impl->dir, uint64_t(v.f_bavail) * v.f_frsize / 1024, impl->options.min_free_bytes / 1024));
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
    std::unique_lock role(impl->role_mu);
    Status loaded = impl->load_memory();
    // A damaged block of a table file shows up only when read: loading is the first full read.
    if (!loaded.ok() && loaded.code() == ErrorCode::kCorrupt && impl->writer &&
        impl->options.on_damage == OnDamage::kQuarantine && impl->quarantined.empty()) {
      auto open_lock = FileLock::acquire(impl->dir + "/open.lock", true);
      if (!open_lock.ok()) return open_lock.status();
      KILN_RETURN_IF_ERROR(impl->quarantine_and_rebuild(loaded.with_context("reading " + impl->db_path)));
      loaded = impl->load_memory();
    }
    KILN_RETURN_IF_ERROR(loaded);
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
const std::string& Store::quarantined() const { return impl_->quarantined; }
Status Store::first_write_error() const {
  std::lock_guard lock(impl_->write_error_mu);
  return impl_->write_error;
}
bool Store::is_writer() const { return impl_->writer; }
const Toolchain& Store::toolchain() const { return impl_->toolchain; }

}  // namespace kiln::cache
