#include "file_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace kiln::cache {

Result<FileLock> FileLock::acquire(const std::string& path, bool blocking, const std::string& note) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return make_error(ErrorCode::kIoError, fmt::format("cannot open lock file '{}': {}", path, std::strerror(errno)));
  int rc;
  do {
    rc = ::flock(fd, LOCK_EX | (blocking ? 0 : LOCK_NB));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) return make_error(ErrorCode::kUnavailable, fmt::format("'{}' is locked", path));
    return make_error(ErrorCode::kIoError, fmt::format("cannot lock '{}': {}", path, std::strerror(err)));
  }
  if (!note.empty() && ::ftruncate(fd, 0) == 0) {
    // Best effort: the note only helps a person read who holds the lock.
    (void)!::pwrite(fd, note.data(), note.size(), 0);
  }
  return FileLock(fd, path);
}

std::string FileLock::read_note(const std::string& path) {
  // A note is a line; a lock file someone replaced (a huge file, a link to /dev/zero) is read no further than this.
  constexpr std::streamsize kMaxNote = 4096;
  std::ifstream in(path);
  std::string note(kMaxNote, '\0');
  in.read(note.data(), kMaxNote);
  note.resize(static_cast<size_t>(in.gcount()));
  return note;
}

FileLock& FileLock::operator=(FileLock&& o) noexcept {
  if (this != &o) {
    release();
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    o.fd_ = -1;
  }
  return *this;
}

void FileLock::release() {
  if (fd_ >= 0) {
    ::close(fd_);  // closing the only descriptor of the open file description drops the flock
    fd_ = -1;
  }
}

}  // namespace kiln::cache
