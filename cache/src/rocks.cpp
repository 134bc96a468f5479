#include "rocks.h"

#include <fmt/format.h>

#include <string_view>

#include "format.h"

namespace kiln {

Status to_status(const rocksdb::Status& s, const char* expr, const char* file, int line) {
  if (s.ok()) return Status();
  ErrorCode code = ErrorCode::kLibraryError;
  if (s.IsNotFound()) {
    code = ErrorCode::kNotFound;
  } else if (s.IsCorruption()) {
    code = ErrorCode::kCorrupt;
  } else if (s.IsBusy() || s.IsTryAgain() || s.IsTimedOut()) {
    code = ErrorCode::kUnavailable;
  } else if (s.IsIOError()) {
    code = ErrorCode::kIoError;
  } else if (s.IsInvalidArgument()) {
    code = ErrorCode::kInvalidArgument;
  }
  std::string_view f(file);
  if (auto p = f.rfind('/'); p != std::string_view::npos) f.remove_prefix(p + 1);
  return make_error(code, fmt::format("RocksDB: {} ({} at {}:{})", s.ToString(), expr, f, line));
}

namespace cache {
namespace {

class NewestWins : public rocksdb::MergeOperator {
 public:
  const char* Name() const override { return "kiln.newest_wins.v1"; }

  bool FullMergeV2(const MergeOperationInput& in, MergeOperationOutput* out) const override {
    const rocksdb::Slice* best = in.existing_value;
    for (const rocksdb::Slice& op : in.operand_list) {
      if (best == nullptr || !first_wins(best->ToStringView(), op.ToStringView())) best = &op;
    }
    // Points at the winner instead of copying it: binaries are tens of kilobytes.
    if (best != nullptr) out->existing_operand = *best;
    return true;
  }

  bool PartialMerge(const rocksdb::Slice&, const rocksdb::Slice& left, const rocksdb::Slice& right,
                    std::string* new_value, rocksdb::Logger*) const override {
    const rocksdb::Slice& best = first_wins(left.ToStringView(), right.ToStringView()) ? left : right;
    new_value->assign(best.data(), best.size());
    return true;
  }

};

}  // namespace

std::shared_ptr<rocksdb::MergeOperator> make_newest_wins_merge() { return std::make_shared<NewestWins>(); }

}  // namespace cache
}  // namespace kiln
