// A file system that runs out of space on demand: every write through it succeeds until `budget` bytes were
// written, then fails as a full disk does (ENOSPC), until the budget is raised again. Deterministic, unlike a
// real small disk, and it needs no mount.
#pragma once

#include <rocksdb/env.h>
#include <rocksdb/file_system.h>

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>

#include "store_env.h"

namespace kiln::cache::testing {

class FullDiskFs : public rocksdb::FileSystemWrapper {
 public:
  FullDiskFs() : rocksdb::FileSystemWrapper(rocksdb::FileSystem::Default()) {}
  static const char* kClassName() { return "KilnFullDiskFs"; }
  const char* Name() const override { return kClassName(); }

  /// Writes of more than `bytes` in all (from now on) fail.
  void fill_after(uint64_t bytes) { left_ = int64_t(bytes); }
  void make_room() { left_ = std::numeric_limits<int64_t>::max(); }
  uint64_t failed_writes() const { return failed_; }

  rocksdb::IOStatus NewWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                    std::unique_ptr<rocksdb::FSWritableFile>* r, rocksdb::IODebugContext* dbg) override {
    auto s = target()->NewWritableFile(f, o, r, dbg);
    if (s.ok()) *r = std::make_unique<File>(std::move(*r), this);
    return s;
  }
  rocksdb::IOStatus ReopenWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                       std::unique_ptr<rocksdb::FSWritableFile>* r, rocksdb::IODebugContext* dbg) override {
    auto s = target()->ReopenWritableFile(f, o, r, dbg);
    if (s.ok()) *r = std::make_unique<File>(std::move(*r), this);
    return s;
  }
  rocksdb::IOStatus ReuseWritableFile(const std::string& f, const std::string& old, const rocksdb::FileOptions& o,
                                      std::unique_ptr<rocksdb::FSWritableFile>* r, rocksdb::IODebugContext* dbg) override {
    auto s = target()->ReuseWritableFile(f, old, o, r, dbg);
    if (s.ok()) *r = std::make_unique<File>(std::move(*r), this);
    return s;
  }

  /// A StoreOptions::env that writes through this file system.
  static std::shared_ptr<StoreEnv> env(const std::shared_ptr<FullDiskFs>& fs) {
    auto e = std::make_shared<StoreEnv>();
    e->env = rocksdb::NewCompositeEnv(fs);
    return e;
  }

 private:
  rocksdb::IOStatus take(size_t n) {
    if (left_.fetch_sub(int64_t(n)) < int64_t(n)) {
      left_ = 0;
      ++failed_;
      return rocksdb::IOStatus::NoSpace("injected by the test's full disk");
    }
    return rocksdb::IOStatus::OK();
  }

  class File : public rocksdb::FSWritableFileOwnerWrapper {
   public:
    File(std::unique_ptr<rocksdb::FSWritableFile>&& f, FullDiskFs* fs)
        : rocksdb::FSWritableFileOwnerWrapper(std::move(f)), fs_(fs) {}
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg) override {
      auto s = fs_->take(data.size());
      return s.ok() ? target()->Append(data, o, dbg) : s;
    }
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o,
                             const rocksdb::DataVerificationInfo& v, rocksdb::IODebugContext* dbg) override {
      auto s = fs_->take(data.size());
      return s.ok() ? target()->Append(data, o, v, dbg) : s;
    }
    rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t off, const rocksdb::IOOptions& o,
                                       rocksdb::IODebugContext* dbg) override {
      auto s = fs_->take(data.size());
      return s.ok() ? target()->PositionedAppend(data, off, o, dbg) : s;
    }
    rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t off, const rocksdb::IOOptions& o,
                                       const rocksdb::DataVerificationInfo& v, rocksdb::IODebugContext* dbg) override {
      auto s = fs_->take(data.size());
      return s.ok() ? target()->PositionedAppend(data, off, o, v, dbg) : s;
    }

   private:
    FullDiskFs* fs_;
  };

  std::atomic<int64_t> left_{std::numeric_limits<int64_t>::max()};
  std::atomic<uint64_t> failed_{0};
};

}  // namespace kiln::cache::testing
