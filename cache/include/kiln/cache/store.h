// Store: kiln's persistent cache of binaries, per-choice timings and decisions, shared by every process on
// the host that uses the same folder.
//
// One embedded RocksDB database (column families binaries, timings, decisions, meta) with an in-memory
// layer in front. Any number of processes may open one folder at once: the first to open holds the writer
// role (an flock'ed lock file) and writes directly; the others read as RocksDB secondaries and stage what
// they write as SST files that the writer applies (small batches) or ingests (large ones). When the writer
// closes or dies, the next process that writes takes the role over. Every value is checksummed and stamped; when two processes write the same
// entry the newer stamp wins, in every order, so all processes converge on the same content. Design and
// trade-offs: docs/cache.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/cache/records.h"
#include "kiln/jit/compiler.h"
#include "kiln/jit/key.h"
#include "kiln/status.h"

namespace kiln::cache {

/// Test hook: the file system RocksDB reads and writes through, to inject faults (a full disk, failing
/// writes). Defined in cache/src/store_env.h; only the cache's own tests construct one.
struct StoreEnv;

/// What the writer does when it finds the database damaged at open (a corrupted, truncated or missing table
/// file, write-ahead log, CURRENT or MANIFEST).
enum class OnDamage {
  /// Move the damaged database aside into <dir>/quarantine/, rebuild one from what is intact (RocksDB's
  /// repair, on a copy), and say so in the log and in Store::quarantined(). The default: a cache that stays
  /// usable, and nothing deleted.
  kQuarantine,
  /// Fail with kCorrupt naming the damaged file; `kiln cache repair` fixes it in place.
  kFail,
};

enum class Role {
  kAuto,    // the writer if the role is free, else a reader that stages its writes (the default)
  kWriter,  // the writer or an error (kUnavailable naming the holder): for prune, clear
  kReader,  // never the writer; never creates the database (kNotFound where there is none): for ls, stats
};

struct StoreOptions {
  /// The cache folder. Default (empty): default_cache_dir().
  std::string dir;
  /// Default kAuto.
  Role role = Role::kAuto;
  /// What stored results are judged against: a timing, decision or failure made with another toolchain, or a
  /// binary made by another NVRTC, is a miss. Default: Toolchain::current(). Tests fake upgrades with it.
  std::optional<Toolchain> toolchain;
  /// How often the writer looks for entries staged by other processes (a background thread). Zero turns the
  /// thread off: staged entries are then ingested by sync() and by the writer's own writes. Default 100 ms.
  std::chrono::milliseconds ingest_interval{100};
  /// fsync the write-ahead log on every write, so that entries survive a power loss and not only a killed
  /// process. Default false.
  bool sync_writes = false;
  /// Test hook, called on the working thread at named points: "write:before", "write:after",
  /// "stage:before_publish", "stage:after_publish", "ingest:before", "ingest:after", "promote",
  /// "open:wait_for_writer" (another process holds the writer role and has not created the database yet).
  /// Default none.
  std::function<void(std::string_view point)> sync_point;
  /// Open fails (kIoError naming the folder) when its file system has less free space than this: RocksDB
  /// (the distribution's build) aborts the process when a disk fills while it creates or opens a database, so
  /// a nearly full disk is refused before it gets there. Default 16 MiB; 0 turns the check off.
  uint64_t min_free_bytes = 16u << 20;
  /// Default kQuarantine. Readers never quarantine: they fail with kCorrupt.
  OnDamage on_damage = OnDamage::kQuarantine;
  /// Default none (the real file system).
  std::shared_ptr<StoreEnv> env;
};

/// $KILN_CACHE_DIR if set, else $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln (else ./.kiln-cache).
std::string default_cache_dir();

struct StoreStats {
  std::string dir;
  bool writer = false;
  uint64_t binaries = 0;
  uint64_t binary_bytes = 0;     // stored value bytes (before RocksDB's compression)
  uint64_t timings = 0;          // successful measurements
  uint64_t failures = 0;         // cached failures
  uint64_t decisions = 0;
  uint64_t stale = 0;            // entries made with another toolchain (misses until re-measured)
  uint64_t invalid = 0;          // entries that fail their checks (misses; replaced when re-written)
  uint64_t staged_batches = 0;   // staged by readers, not yet ingested
  uint64_t disk_bytes = 0;       // the folder's size on disk
  std::vector<std::pair<std::string, uint64_t>> binaries_by_arch;
};

struct PruneOptions {
  /// Keep the stored binaries under this many bytes, dropping the least recently used first. 0: no bound.
  uint64_t max_binary_bytes = 0;
  /// Drop binaries not used (or stored) within this long, and timings and decisions older than it.
  /// Zero: no age limit.
  std::chrono::seconds older_than{0};
  /// Drop binaries built for this arch ("sm_80"). Empty: none.
  std::string arch;
  /// Drop everything made with another toolchain than the store's (stale binaries, timings, failures,
  /// decisions). Default false.
  bool other_toolchains = false;
  /// Report what would be dropped without dropping it. Default false.
  bool dry_run = false;
};

struct PruneReport {
  uint64_t binaries = 0;
  uint64_t binary_bytes = 0;
  uint64_t timings = 0;
  uint64_t decisions = 0;
  uint64_t invalid = 0;  // entries that failed their checks, always dropped
};

class Store {
 public:
  /// Opens (creating if needed, unless role is kReader) the cache in `options.dir`, takes the writer role if
  /// it is free and wanted, and loads every timing and decision into memory (binaries are read on demand).
  /// Errors: kUnavailable (kWriter and another process holds the role), kNotFound (kReader and no cache),
  /// kIoError / kLibraryError from the file system or RocksDB.
  static Result<std::unique_ptr<Store>> open(StoreOptions options = {});

  /// Ingests or publishes everything this process wrote, then hands the writer role on (releases the lock).
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  const std::string& dir() const;
  /// Whether this process holds the writer role now (a reader may become the writer when the writer leaves).
  bool is_writer() const;
  /// The toolchain stored results are judged against.
  const Toolchain& toolchain() const;
  /// Where open moved a damaged database (OnDamage::kQuarantine); empty when it found none.
  const std::string& quarantined() const;
  /// The first write of this Store that failed (OK when none did). Callers that log a failed write and carry
  /// on check it before reporting success, so that a full disk never ends in "done".
  Status first_write_error() const;

  // ---- Binaries (read from RocksDB on demand, remembered in memory once read or written).

  /// Stores `binary` under binary.key. Thread-safe. Written (or staged) before it returns.
  Status put_binary(const Binary& binary);
  /// The binary stored under `key`. When `arch` is given it must match. Errors: kNotFound on a miss, which
  /// includes a value that fails its checks, one for another arch, or one built by another NVRTC (each logged
  /// once). Thread-safe. With `remember` false the binary is not kept in memory (preloading uses this).
  Result<std::shared_ptr<const Binary>> get_binary(const KernelKey& key, std::string_view arch = {},
                                                   bool remember = true);
  /// Where get_binaries() spent its time: RocksDB's batched read, and decoding + checking the values.
  struct BinaryReadTimes {
    double read_seconds = 0;
    double decode_seconds = 0;
  };
  /// get_binary() for many keys in one batched RocksDB read (MultiGet), in the order of `keys`; each entry
  /// is what get_binary(key, arch, remember) returns. Times are added to `times` when given. Thread-safe;
  /// preloading calls it from several threads, each with its own share of the keys.
  std::vector<Result<std::shared_ptr<const Binary>>> get_binaries(const std::vector<KernelKey>& keys,
                                                                  std::string_view arch = {}, bool remember = true,
                                                                  BinaryReadTimes* times = nullptr);
  /// Whether a valid binary is stored under `key` (reads it).
  bool has_binary(const KernelKey& key);
  /// Records that these binaries were used now (for least-recently-used pruning); at most one write per
  /// binary per hour. Thread-safe.
  Status touch(const std::vector<KernelKey>& keys);

  // ---- Timings and failures (served from memory).

  /// Stores one choice's measurement or failure. Fills measured_at_ns (when 0) and toolchain (when its kiln
  /// field is empty). Errors: kInvalidArgument for an empty problem or choice. Thread-safe.
  Status put_timing(TimingRecord timing);
  /// The current (same-toolchain) record for (problem, choice), successful or failed; nullopt on a miss.
  /// Thread-safe; does not read the database.
  std::optional<TimingRecord> timing(std::string_view problem, std::string_view choice) const;
  /// Every current record for `problem`, in choice-name order. Thread-safe.
  std::vector<TimingRecord> timings(std::string_view problem) const;

  // ---- Decisions (served from memory).

  /// Stores the decision for decision.problem. Fills decided_at_ns and toolchain like put_timing. Thread-safe.
  Status put_decision(Decision decision);
  /// The current decision for `problem`, or null. A hit costs a hash and a shared lock (well under a
  /// microsecond). Thread-safe; does not read the database.
  std::shared_ptr<const Decision> decision(std::string_view problem) const;
  /// Every current decision whose problem starts with `prefix` (e.g. environment_prefix() of a device), in
  /// problem order. Thread-safe.
  std::vector<std::shared_ptr<const Decision>> decisions(std::string_view prefix = {}) const;
  /// Every current timing record, in (problem, choice) order. Thread-safe.
  std::vector<TimingRecord> all_timings() const;

  /// Stores many records in one write (one staged batch for a reader), filling stamps and toolchains like
  /// the single puts. For imports and other bulk writers. Thread-safe.
  Status put_all(std::vector<TimingRecord> timings, std::vector<Decision> decisions,
                 const std::vector<Binary>& binaries = {});

  // ---- Whole-cache operations.

  /// Calls `fn` with the metadata of every stored binary (reading each value), until it returns false.
  /// Invalid values are skipped and counted in the result. Thread-safe.
  Result<uint64_t> for_each_binary(const std::function<bool(const BinaryInfo&)>& fn);
  /// Makes what other processes wrote since open visible here: a reader catches up with the writer, then
  /// timings and decisions are reloaded into memory (merged by stamp with what this process wrote).
  Status refresh();
  /// Makes what this process wrote durable and visible to others: the writer ingests every staged batch and
  /// flushes its log; a reader takes the writer role if it is free and does the same. Thread-safe.
  Status sync();
  /// Writes the in-memory table to disk (a flush); used before copying the folder, and by tests.
  Status flush();
  Result<StoreStats> stats();
  /// Drops what `options` selects, and every entry that fails its checks. Needs the writer role
  /// (kFailedPrecondition otherwise).
  Result<PruneReport> prune(const PruneOptions& options);
  /// Drops every entry. Needs the writer role (kFailedPrecondition otherwise).
  Status clear();

  struct Impl;

 private:
  explicit Store(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::cache
