// SymmetricHeap (symmetric_heap.h): first fit over a coalesced free list, frees deferred behind an injected wait,
// and the comparison of the ranks' records of one collective allocate.
#include "symmetric_heap.h"

#include <cstring>
#include <iterator>

#include <fmt/format.h>

namespace kiln::runtime::detail {

SymmetricHeap::SymmetricHeap(size_t bytes, size_t alignment)
    : capacity_(alignment ? bytes / alignment * alignment : bytes), alignment_(alignment ? alignment : 1) {
  if (capacity_ > 0) free_.emplace(0, capacity_);
}

size_t SymmetricHeap::round_up(size_t bytes) const {
  if (bytes == 0) return alignment_;
  return (bytes + alignment_ - 1) / alignment_ * alignment_;
}

Result<size_t> SymmetricHeap::allocate(size_t bytes) {
  if (bytes > capacity_) {
    return make_error(ErrorCode::kOutOfRange,
                      fmt::format("symmetric heap: {} bytes asked, the heap holds {} ({} in use); raise "
                                  "AllReduceOptions::heap_bytes",
                                  bytes, capacity_, used_));
  }
  const size_t need = round_up(bytes);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const size_t offset = it->first, have = it->second;
    // Wait for every retiring range that overlaps what is handed out (in offset order: deterministic).
    for (auto r = retiring_.lower_bound(0); r != retiring_.end();) {
      const size_t lo = r->first, hi = lo + r->second.bytes;
      if (hi <= offset || lo >= offset + need) {
        ++r;
        continue;
      }
      if (r->second.wait) KILN_RETURN_IF_ERROR(r->second.wait());
      r = retiring_.erase(r);
    }
    free_.erase(it);
    if (have > need) free_.emplace(offset + need, have - need);
    live_.emplace(offset, need);
    used_ += need;
    return offset;
  }
  return make_error(ErrorCode::kOutOfRange,
                    fmt::format("symmetric heap: no free range of {} bytes (asked {}); the heap holds {}, {} in use "
                                "in {} allocations; raise AllReduceOptions::heap_bytes or free tensors",
                                need, bytes, capacity_, used_, live_.size()));
}

void SymmetricHeap::insert_free(size_t offset, size_t bytes) {
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + bytes == next->first) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += bytes;
      return;
    }
  }
  free_.emplace(offset, bytes);
}

Status SymmetricHeap::free(size_t offset, Wait wait, const std::string& what) {
  auto it = live_.find(offset);
  if (it == live_.end()) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("symmetric heap: {} is not a live allocation of this heap (freed twice, or not "
                                  "from allocate())",
                                  what));
  }
  const size_t bytes = it->second;
  live_.erase(it);
  used_ -= bytes;
  if (wait) retiring_[offset] = Retiring{bytes, std::move(wait)};
  insert_free(offset, bytes);
  return Status();
}

void SymmetricHeap::rollback(size_t offset) {
  auto it = live_.find(offset);
  if (it == live_.end()) return;
  used_ -= it->second;
  insert_free(offset, it->second);
  live_.erase(it);
}

size_t SymmetricHeap::find(size_t offset, size_t bytes) const {
  auto it = live_.upper_bound(offset);
  if (it == live_.begin()) return npos;
  --it;
  if (offset + bytes > it->first + it->second || offset + bytes < offset) return npos;
  return it->first;
}

size_t SymmetricHeap::size_of(size_t offset) const {
  auto it = live_.find(offset);
  return it == live_.end() ? 0 : it->second;
}

uint64_t SymmetricHeap::digest() const {
  // FNV-1a over (offset, size) pairs.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  for (const auto& [o, b] : live_) {
    mix(o);
    mix(b);
  }
  return h;
}

Status SymmetricHeap::drain() {
  Status first;
  for (auto& [o, r] : retiring_) {
    if (!r.wait) continue;
    Status s = r.wait();
    if (first.ok() && !s.ok()) first = s;
  }
  retiring_.clear();
  return first;
}

std::string AllocRecord::encode() const {
  std::string s(32, '\0');
  const uint64_t v[4] = {asked, offset, used, digest};
  std::memcpy(s.data(), v, sizeof(v));
  return s;
}

Result<AllocRecord> AllocRecord::decode(const std::string& s) {
  if (s.size() != 32) return make_error(ErrorCode::kInternal, fmt::format("allocation record of {} bytes", s.size()));
  uint64_t v[4];
  std::memcpy(v, s.data(), sizeof(v));
  return AllocRecord{v[0], v[1], v[2], v[3]};
}

Status check_agreement(const std::vector<AllocRecord>& records) {
  if (records.empty()) return Status();
  const AllocRecord& a = records.front();
  for (size_t r = 1; r < records.size(); ++r) {
    const AllocRecord& b = records[r];
    if (b.asked != a.asked) {
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("symmetric allocate: ranks asked different sizes: rank 0 asked {} bytes, rank {} "
                                    "asked {} (every rank must allocate the same sizes in the same order)",
                                    a.asked, r, b.asked));
    }
    if (b.used != a.used || b.digest != a.digest) {
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("symmetric allocate of {} bytes: the ranks' heaps have diverged (rank 0 has {} "
                                    "bytes in use, rank {} has {}; digests {:016x} vs {:016x}): the ranks did not "
                                    "allocate and free the same tensors before this call",
                                    a.asked, a.used, r, b.used, a.digest, b.digest));
    }
    if (b.offset != a.offset) {
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("symmetric allocate of {} bytes: rank 0 got offset {}, rank {} got {}", a.asked,
                                    a.offset, r, b.offset));
    }
  }
  return Status();
}

}  // namespace kiln::runtime::detail
