// Internal: an flock(2)'ed lock file as a move-only owner. The kernel drops the lock when the process
// dies, however it dies, which is what lets the writer role pass on after a SIGKILL.
#pragma once

#include <string>

#include "kiln/status.h"

namespace kiln::cache {

class FileLock {
 public:
  /// Locks `path` (created if missing) exclusively. Blocking waits for the holder; non-blocking returns
  /// kUnavailable at once when another open file description holds it (another process, or another Store in
  /// this process). On success, `note` (e.g. "pid 1234") is written into the file for diagnostics.
  static Result<FileLock> acquire(const std::string& path, bool blocking, const std::string& note = {});
  /// The note in the lock file at `path` (who holds it, as far as the file says); empty if none.
  static std::string read_note(const std::string& path);

  FileLock() = default;
  FileLock(FileLock&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }
  FileLock& operator=(FileLock&& o) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock() { release(); }

  bool held() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }
  void release();

 private:
  FileLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

}  // namespace kiln::cache
