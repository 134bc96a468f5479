#include "kiln/input.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

namespace kiln {

Result<uint64_t> limit_value(const InputLimit& limit) {
  const std::string env(limit.env);
  const char* text = std::getenv(env.c_str());
  if (!text || !*text) return limit.fallback;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(text, &end, 10);
  uint64_t mult = 1;
  std::string_view unit(end);
  if (unit == "K") mult = 1ull << 10;
  else if (unit == "M") mult = 1ull << 20;
  else if (unit == "G") mult = 1ull << 30;
  else if (!unit.empty()) mult = 0;
  // strtoull accepts "-5" (as a huge value): only plain digits pass.
  const bool digits = text[0] >= '0' && text[0] <= '9';
  if (!digits || end == text || mult == 0 || errno == ERANGE || v == 0 || v > UINT64_MAX / mult) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("${}='{}' is not a positive count (e.g. 1000, 64K, 16M, 2G)", env, text));
  }
  return static_cast<uint64_t>(v) * mult;
}

Result<std::string> read_file_limited(const std::string& path, const InputLimit& limit) {
  KILN_ASSIGN_OR_RETURN(uint64_t max_bytes, limit_value(limit));
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    const int e = errno;
    return make_error(e == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIoError,
                      fmt::format("cannot read {} '{}': {}", limit.what, path, std::strerror(e)));
  }
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    ::close(fd);
    return make_error(ErrorCode::kInvalidArgument, fmt::format("{} '{}' is a directory", limit.what, path));
  }
  auto too_big = [&] {
    return make_error(ErrorCode::kOutOfRange,
                      fmt::format("{} '{}' is larger than {} bytes, the limit (raise it with ${})", limit.what, path,
                                  max_bytes, limit.env));
  };
  if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    return too_big();
  }
  std::string out;
  if (S_ISREG(st.st_mode)) out.reserve(static_cast<size_t>(st.st_size));
  char buf[65536];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      return make_error(ErrorCode::kIoError, fmt::format("cannot read {} '{}': {}", limit.what, path, std::strerror(e)));
    }
    if (n == 0) break;
    if (out.size() + static_cast<uint64_t>(n) > max_bytes) {
      ::close(fd);
      return too_big();
    }
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

}  // namespace kiln
