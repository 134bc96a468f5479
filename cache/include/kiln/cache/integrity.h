// Checking and repairing a cache folder: what `kiln cache verify` and `kiln cache repair` run.
//
// Store::open already refuses damage it can see (a missing CURRENT beside table files, a truncated table file,
// a write-ahead log that fails its checksums) and, as the writer, quarantines and rebuilds the database. A
// damaged block inside a table file is only found when read; verify reads everything.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/status.h"

namespace kiln::cache {

struct VerifyReport {
  std::string dir;
  uint64_t checked = 0;  // entries read and decoded
  uint64_t bad = 0;      // entries that fail their checks (misses in use; prune drops them)
  /// Damage to the database itself, each naming the file and what is wrong (what RocksDB found). Empty: none.
  std::vector<std::string> damage;
  /// The first 20 bad entries, each with its column family and why.
  std::vector<std::string> errors;
  /// False when another process held the writer role during the check: the write-ahead log's last record may
  /// be being written, so an incomplete one is not counted as damage.
  bool quiescent = true;

  bool ok() const { return bad == 0 && damage.empty(); }
};

/// Opens the database in `dir` read-only (never creating, moving or changing anything), verifies the checksum
/// of every block of every table file and of every write-ahead log record, and decodes every entry.
/// Errors: kNotFound when `dir` holds no cache, kIoError when it cannot be read. Damage is in the report.
Result<VerifyReport> verify_cache(const std::string& dir);

struct RepairReport {
  std::string backup;                   // a copy of the database as it was, taken before repairing
  std::vector<std::string> set_aside;   // files RocksDB's repair could not use, moved into <db>/lost/
  VerifyReport after;                   // verify_cache() of the repaired database
};

/// Copies the database into <dir>/quarantine/ (the copy is never deleted by kiln), then rebuilds it in place
/// with RocksDB's repair: the MANIFEST is recreated from the table files and logs, records that pass their
/// checksums are kept. Needs the writer role. Errors: kUnavailable when another process holds it, kNotFound
/// when `dir` holds no database, kIoError / kCorrupt when the repair fails (the copy is still there).
Result<RepairReport> repair_cache(const std::string& dir);

}  // namespace kiln::cache
