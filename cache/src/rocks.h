// Internal: RocksDB's statuses as kiln Statuses (for KILN_CHECK), and the merge rule every column family uses.
#pragma once

#include <rocksdb/merge_operator.h>
#include <rocksdb/status.h>

#include <memory>

#include "kiln/status.h"

namespace kiln {

/// Converts a RocksDB status: IO errors and busy locks to kIoError / kUnavailable, corruption to kCorrupt,
/// NotFound to kNotFound, anything else to kLibraryError; names the call and where it was made.
Status to_status(const rocksdb::Status& status, const char* expr, const char* file, int line);

/// A RocksDB call's status as a Status, for the writes whose failures Impl::note_write() records.
#define KILN_ROCKS_STATUS(call) ::kiln::to_status((call), #call, __FILE__, __LINE__)

namespace cache {

/// Every write is a Merge whose operand is a whole value; the merge keeps the value that first_wins() picks.
/// Because that pick is a pure function of the values, the stored value does not depend on the order in
/// which processes' writes (direct writes, ingested staging files, WAL replay) reach the database.
std::shared_ptr<rocksdb::MergeOperator> make_newest_wins_merge();

}  // namespace cache
}  // namespace kiln
