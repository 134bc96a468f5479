// Signing: HMAC-SHA256 with a shared secret key read from a file. Cache bundles carry a signature over their
// whole content; an importer brings in their binaries only when the signature verifies with a key it trusts.
// The fleet (several hosts sharing results) signs what it publishes with the same keys.
//
// A key file holds the secret as written (trailing whitespace ignored), 32 bytes to 4 KiB, readable by its
// owner only (like an ssh private key): `openssl rand -hex 32 > kiln.key && chmod 600 kiln.key`.
#pragma once

#include <string>
#include <string_view>

#include "kiln/status.h"

namespace kiln::cache {

inline constexpr size_t kMinKeyBytes = 32;
inline constexpr size_t kMaxKeyBytes = 4096;

class SigningKey {
 public:
  /// Reads the key in `path`. Errors: kNotFound / kIoError reading it; kFailedPrecondition when group or
  /// others may read or write it, or it is not a regular file; kInvalidArgument for a key shorter than
  /// kMinKeyBytes or longer than kMaxKeyBytes. Each names the file.
  static Result<SigningKey> load(const std::string& path);
  /// A key from bytes (tests, keys kept elsewhere). Errors: kInvalidArgument for the same sizes as load().
  static Result<SigningKey> from_bytes(std::string secret, std::string origin = "a key given in memory");

  /// HMAC-SHA256 of `data`, 64 lowercase hex digits.
  std::string sign(std::string_view data) const;
  /// Whether `signature` (hex, as sign() writes it) is this key's signature of `data`. The comparison takes
  /// the same time wherever the first difference is.
  bool verify(std::string_view data, std::string_view signature) const;
  /// A public name for the key (16 hex digits derived from it; it reveals nothing of the secret), which a
  /// signed bundle records so that a failed check can say which key signed it.
  const std::string& id() const { return id_; }
  /// Where the key came from (its file), for messages.
  const std::string& origin() const { return origin_; }

 private:
  SigningKey() = default;
  std::string secret_, id_, origin_;
};

}  // namespace kiln::cache
