#include "kiln/cache/signing.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>

namespace kiln::cache {
namespace {

std::string hex(const unsigned char* p, size_t n) {
  std::string out;
  out.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) out += fmt::format("{:02x}", p[i]);
  return out;
}

std::string hmac_hex(std::string_view key, std::string_view data) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), int(key.size()), reinterpret_cast<const unsigned char*>(data.data()), data.size(),
       mac, &len);
  return hex(mac, len);
}

}  // namespace

Result<SigningKey> SigningKey::from_bytes(std::string secret, std::string origin) {
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r' || secret.back() == ' ' || secret.back() == '\t')) {
    secret.pop_back();
  }
  if (secret.size() < kMinKeyBytes || secret.size() > kMaxKeyBytes) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("the signing key {} is {} bytes; a key is {} to {} bytes (e.g. `openssl rand -hex 32`)",
                                  origin, secret.size(), kMinKeyBytes, kMaxKeyBytes));
  }
  SigningKey k;
  k.id_ = hmac_hex(secret, "kiln signing key id").substr(0, 16);
  k.secret_ = std::move(secret);
  k.origin_ = std::move(origin);
  return k;
}

Result<SigningKey> SigningKey::load(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0 && errno == ELOOP) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a link: check its target
  if (fd < 0) {
    int err = errno;
    return make_error(err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIoError,
                      fmt::format("cannot read the signing key '{}': {}", path, std::strerror(err)));
  }
  struct stat st{};
  std::string secret;
  Status bad;
  if (::fstat(fd, &st) != 0) {
    bad = make_error(ErrorCode::kIoError, fmt::format("cannot read the signing key '{}': {}", path, std::strerror(errno)));
  } else if (!S_ISREG(st.st_mode)) {
    bad = make_error(ErrorCode::kFailedPrecondition, fmt::format("the signing key '{}' is not a regular file", path));
  } else if (st.st_mode & (S_IRWXG | S_IRWXO)) {
    bad = make_error(ErrorCode::kFailedPrecondition,
                     fmt::format("the signing key '{}' may be read or written by others (mode {:o}); `chmod 600 {}`",
                                 path, st.st_mode & 0777, path));
  } else if (uint64_t(st.st_size) > kMaxKeyBytes + 16) {
    bad = make_error(ErrorCode::kInvalidArgument,
                     fmt::format("the signing key '{}' is {} bytes; a key is at most {} bytes", path, st.st_size, kMaxKeyBytes));
  } else {
    char buf[kMaxKeyBytes + 17];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0 && secret.size() <= kMaxKeyBytes + 16) secret.append(buf, size_t(n));
    if (n < 0) bad = make_error(ErrorCode::kIoError, fmt::format("cannot read the signing key '{}': {}", path, std::strerror(errno)));
    OPENSSL_cleanse(buf, sizeof buf);
  }
  ::close(fd);
  if (!bad.ok()) return bad;
  return from_bytes(std::move(secret), "'" + path + "'");
}

std::string SigningKey::sign(std::string_view data) const { return hmac_hex(secret_, data); }

bool SigningKey::verify(std::string_view data, std::string_view signature) const {
  std::string want = sign(data);
  if (signature.size() != want.size()) return false;
  return CRYPTO_memcmp(want.data(), signature.data(), want.size()) == 0;
}

}  // namespace kiln::cache
