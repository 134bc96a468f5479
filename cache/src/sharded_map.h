// Internal: the in-memory layer's map. A string-keyed hash map split into shards, each behind its own
// reader-writer lock, holding immutable values by shared_ptr: a lookup hashes a string_view (no allocation),
// takes one shard's lock shared and copies a shared_ptr (well under a microsecond), and concurrent readers
// of different problems rarely touch the same lock.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kiln::cache {

template <class T>
class ShardedMap {
 public:
  using Ptr = std::shared_ptr<const T>;

  Ptr find(std::string_view key) const {
    size_t h = hash(key);
    const Shard& s = shards_[h % kShards];
    std::shared_lock lock(s.mu);
    auto it = s.map.find(key);
    return it == s.map.end() ? nullptr : it->second;
  }

  /// Calls `update(current)` (current may be null) under the shard's exclusive lock and stores what it returns
  /// unless that is null. Returns the stored value (or the current one when nothing was stored).
  template <class F>
  Ptr update(std::string_view key, F&& update) {
    size_t h = hash(key);
    Shard& s = shards_[h % kShards];
    std::unique_lock lock(s.mu);
    auto it = s.map.find(key);
    Ptr current = it == s.map.end() ? nullptr : it->second;
    Ptr next = update(current);
    if (!next) return current;
    if (it == s.map.end()) {
      s.map.emplace(std::string(key), next);
    } else {
      it->second = next;
    }
    return next;
  }

  void erase(std::string_view key) {
    Shard& s = shards_[hash(key) % kShards];
    std::unique_lock lock(s.mu);
    if (auto it = s.map.find(key); it != s.map.end()) s.map.erase(it);
  }

  void clear() {
    for (auto& s : shards_) {
      std::unique_lock lock(s.mu);
      s.map.clear();
    }
  }

  /// A snapshot of every entry (each shard read under its lock; not one atomic view across shards).
  std::vector<std::pair<std::string, Ptr>> entries() const {
    std::vector<std::pair<std::string, Ptr>> out;
    for (const auto& s : shards_) {
      std::shared_lock lock(s.mu);
      for (const auto& [k, v] : s.map) out.emplace_back(k, v);
    }
    return out;
  }

  size_t size() const {
    size_t n = 0;
    for (const auto& s : shards_) {
      std::shared_lock lock(s.mu);
      n += s.map.size();
    }
    return n;
  }

 private:
  static constexpr size_t kShards = 64;
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  static size_t hash(std::string_view s) { return Hash{}(s) * 0x9e3779b97f4a7c15ull >> 20; }
  struct alignas(64) Shard {
    mutable std::shared_mutex mu;
    std::unordered_map<std::string, Ptr, Hash, std::equal_to<>> map;
  };
  std::array<Shard, kShards> shards_;
};

}  // namespace kiln::cache
