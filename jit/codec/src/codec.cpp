#include "kiln/codec/codec.h"

#include <fmt/format.h>

namespace kiln::codec {

Status Writer::status() const {
  if (oversized_.empty()) return Status();
  return make_error(ErrorCode::kInvalidArgument,
                    fmt::format("{} is longer than the {} bytes or items a record can carry", oversized_, kMaxLength));
}

bool Reader::take(size_t n, std::string_view field) {
  if (!ok()) return false;
  if (n > remaining()) {
    error_ = fmt::format("{} needs {} bytes, {} left", field, n, remaining());
    return false;
  }
  pos_ += n;
  return true;
}

bool Reader::boolean(std::string_view field) {
  uint8_t v = u8(field);
  if (v > 1) reject(field, fmt::format("is {} (0 or 1 expected)", v));
  return v == 1;
}

std::string_view Reader::bytes_view(std::string_view field) {
  uint32_t n = u32(field);
  if (!ok()) return {};
  if (n > remaining()) {
    error_ = fmt::format("{} has a length of {} bytes, {} left", field, n, remaining());
    return {};
  }
  pos_ += n;
  return in_.substr(pos_ - n, n);
}

uint32_t Reader::count(std::string_view field, size_t min_item, uint64_t max_items) {
  uint32_t n = u32(field);
  if (!ok()) return 0;
  if (n > max_items) {
    error_ = fmt::format("{} has {} items (at most {})", field, n, max_items);
    return 0;
  }
  if (static_cast<uint64_t>(n) * min_item > remaining()) {
    error_ = fmt::format("{} has {} items, more than the {} bytes left can hold", field, n, remaining());
    return 0;
  }
  return n;
}

std::vector<std::string> Reader::strings(std::string_view field) {
  std::vector<std::string> v;
  uint32_t n = count(field, 4);
  v.reserve(n);
  for (uint32_t i = 0; i < n && ok(); ++i) v.push_back(bytes(field));
  return v;
}

std::vector<double> Reader::f64s(std::string_view field) {
  std::vector<double> v;
  uint32_t n = count(field, 8);
  v.reserve(n);
  for (uint32_t i = 0; i < n && ok(); ++i) v.push_back(f64(field));
  return v;
}

std::vector<std::pair<std::string, std::string>> Reader::string_pairs(std::string_view field) {
  std::vector<std::pair<std::string, std::string>> v;
  uint32_t n = count(field, 8);
  v.reserve(n);
  for (uint32_t i = 0; i < n && ok(); ++i) {
    std::string a = bytes(field);
    v.emplace_back(std::move(a), bytes(field));
  }
  return v;
}

void Reader::reject(std::string_view field, std::string_view why) {
  if (ok()) error_ = fmt::format("{} {}", field, why);
}

Status Reader::finish(std::string_view what) const {
  if (!ok()) return make_error(ErrorCode::kCorrupt, fmt::format("malformed {}: {}", what, error_));
  if (pos_ != in_.size()) {
    return make_error(ErrorCode::kCorrupt, fmt::format("malformed {}: {} unexpected trailing bytes", what, remaining()));
  }
  return unusable_;
}

}  // namespace kiln::codec
