// The per-template memo behind generation_cache_enabled() (template.h): rendered configurations and grid
// samples, keyed by exact parameter values (code parameters by their full text, not their tag).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/templates/template.h"

namespace kiln::templates::detail {

struct GenerationMemo {
  std::mutex mu;
  uint64_t epoch = 0;  // clear_generation_cache() bumps the global epoch; an older memo empties itself
  std::unordered_map<std::string, std::shared_ptr<const Rendered>> renders;
  std::unordered_map<std::string, std::shared_ptr<const std::vector<Params>>> samples;
};

/// Bounds per template (a rendered GEMM configuration is ~50 KB with its headers, so 1024 are ~50 MB): a kind
/// (dtype, layouts, epilogue, alignment) needs ~70 renders at default effort, so a dozen kinds fit; past that
/// the memo empties and fills again, which costs what generation cost without it. They keep a long-running
/// process that tunes endless new epilogues from growing without end.
inline constexpr size_t kMaxMemoRenders = 1024;
inline constexpr size_t kMaxMemoSamples = 512;

/// An exact, unambiguous key of a parameter set (names, kinds and full values).
std::string params_key(const Params& p);
/// Every field of the limits, for sample keys.
std::string limits_key(const DeviceLimits& l);

/// The memo's entry for `key` in `map` (nullptr when absent or the memo is off), emptying a stale memo first.
template <class Map>
typename Map::mapped_type memo_find(GenerationMemo& m, Map GenerationMemo::*map, const std::string& key);
/// Stores `value` under `key` (when the memo is on), emptying the map first when it is full.
template <class Map>
void memo_store(GenerationMemo& m, Map GenerationMemo::*map, size_t cap, const std::string& key,
                typename Map::mapped_type value);

uint64_t memo_epoch();
void count_render(bool hit);
void count_sample(bool hit);
void count_sample_checks(uint64_t n);

template <class Map>
typename Map::mapped_type memo_find(GenerationMemo& m, Map GenerationMemo::*map, const std::string& key) {
  if (!generation_cache_enabled()) return nullptr;
  std::lock_guard lock(m.mu);
  if (m.epoch != memo_epoch()) {
    m.renders.clear();
    m.samples.clear();
    m.epoch = memo_epoch();
    return nullptr;
  }
  auto it = (m.*map).find(key);
  return it == (m.*map).end() ? nullptr : it->second;
}

template <class Map>
void memo_store(GenerationMemo& m, Map GenerationMemo::*map, size_t cap, const std::string& key,
                typename Map::mapped_type value) {
  if (!generation_cache_enabled()) return;
  std::lock_guard lock(m.mu);
  if (m.epoch != memo_epoch()) {
    m.renders.clear();
    m.samples.clear();
    m.epoch = memo_epoch();
  }
  if ((m.*map).size() >= cap) (m.*map).clear();
  (m.*map).emplace(key, std::move(value));
}

}  // namespace kiln::templates::detail
