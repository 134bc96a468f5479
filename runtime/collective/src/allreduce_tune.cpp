// AllReduce::tune(): one decision per size bucket, the same on every rank. The decisions come from the cache when
// every rank finds the same stored list there (keyed by dtype, in-place, world size, device and bucket), else
// from measuring every choice at each bucket (allreduce_measure.cpp); measured decisions are stored for the next
// process. The result is the dispatch table run() reads.
#include <algorithm>
#include <functional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "allreduce_impl.h"
#include "kiln/jit/device.h"

namespace kiln::runtime {

using namespace detail;

// The staged and in-place keys are those kiln stored before symmetric calls had their own table.
std::string AllReduce::Impl::cache_key(size_t bytes, std::string_view what, AllReduceCall call) const {
  auto info = device_info(comm->device());
  const char* kind = call == AllReduceCall::kSymmetricInPlace ? " in-place"
                     : call == AllReduceCall::kSymmetric      ? " symmetric"
                                                              : "";
  return fmt::format("{}{} {} w{} {} {}B", what, kind,
                     templates::dtype_name(options.dtype), comm->world(), info.ok() ? info->name : std::string("?"),
                     bytes);
}

Result<std::optional<std::vector<std::string>>> AllReduce::Impl::agreed_cached(const std::vector<std::string>& keys) {
  std::string mine;
  bool all = options.cache != nullptr;
  std::vector<std::string> names;
  for (const auto& k : keys) {
    if (!all) break;
    auto d = options.cache->lookup_decision(k);
    if (!d.ok() || !*d) {
      all = false;
      break;
    }
    names.push_back((*d)->choice);
    mine += (*d)->choice + ";";
  }
  if (!all) mine.clear();
  // all_gather needs one size on every rank: exchange a fixed-size digest of the list.
  std::string digest(64, '\0');
  const std::string h = fmt::format("{:016x}{:08x}", std::hash<std::string>{}(mine), mine.size());
  std::copy(h.begin(), h.end(), digest.begin());
  if (mine.empty()) digest.assign(64, '\0');
  KILN_ASSIGN_OR_RETURN(auto all_digests, comm->all_gather(digest));
  for (const auto& g : all_digests) {
    if (g != digest || mine.empty()) return std::optional<std::vector<std::string>>();
  }
  return std::optional<std::vector<std::string>>(std::move(names));
}

Result<std::vector<CollectiveReport>> AllReduce::tune(std::vector<size_t> bucket_bytes) {
  return tune(impl_->options_call(), std::move(bucket_bytes));
}

Result<std::vector<CollectiveReport>> AllReduce::tune(AllReduceCall call, std::vector<size_t> bucket_bytes) {
  Impl& s = *impl_;
  if (bucket_bytes.empty()) {
    for (size_t b = 1024; b <= s.options.max_bytes; b *= 2) bucket_bytes.push_back(b);
  }
  std::sort(bucket_bytes.begin(), bucket_bytes.end());
  bucket_bytes.erase(std::unique(bucket_bytes.begin(), bucket_bytes.end()), bucket_bytes.end());
  for (size_t b : bucket_bytes) {
    if (b == 0 || b % s.elem_bytes || b > s.options.max_bytes) {
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("bucket of {} bytes: must be a positive multiple of {} up to {}", b, s.elem_bytes,
                                    s.options.max_bytes));
    }
  }
  KILN_RETURN_IF_ERROR(s.make_current());

  std::vector<std::string> keys;
  for (size_t b : bucket_bytes) keys.push_back(s.cache_key(b, "allreduce", call));
  KILN_ASSIGN_OR_RETURN(auto cached, s.agreed_cached(keys));
  std::vector<CollectiveReport> reports;
  std::vector<std::string> picks;
  if (cached) {
    for (size_t i = 0; i < bucket_bytes.size(); ++i) {
      const std::string& name = (*cached)[i];
      if (name != kNccl && !(name == kNcclSymmetric && s.window) && !s.find(s.choices, name)) {
        cached.reset();  // a stored choice that is not among this build's: every rank sees the same, so all tune
        break;
      }
      CollectiveReport r;
      r.bytes = bucket_bytes[i];
      r.call = call_name(call);
      r.chosen = name;
      r.from_cache = true;
      reports.push_back(std::move(r));
      picks.push_back(name);
    }
  }
  if (!cached) {
    reports.clear();
    picks.clear();
    KILN_RETURN_IF_ERROR(s.ensure_check_buffers(bucket_bytes.back()));
    for (size_t bytes : bucket_bytes) {
      const int64_t count = static_cast<int64_t>(bytes / s.elem_bytes);
      KILN_ASSIGN_OR_RETURN(auto timings, s.measure_call(call, s.names_for(count, call), count));
      const std::vector<double> us = figures(timings);
      const int w = pick_collective(us);
      CollectiveReport r;
      r.bytes = bytes;
      r.call = call_name(call);
      r.chosen = w >= 0 ? timings[w].name : kNccl;
      r.choices = std::move(timings);
      if (s.options.cache && w >= 0) {
        cache::Decision dec;
        dec.problem = s.cache_key(bytes, "allreduce", call);
        dec.choice = r.chosen;
        dec.median_us = us[w];
        if (Status st = s.options.cache->record_decision(std::move(dec)); !st.ok()) spdlog::warn("kiln: {}", st.to_string());
      }
      picks.push_back(r.chosen);
      reports.push_back(std::move(r));
    }
  }
  Table table;
  table.bounds = bucket_bytes;
  for (const std::string& name : picks) {
    KILN_ASSIGN_OR_RETURN(Pick p, s.resolve(name));
    table.picks.push_back(std::move(p));
  }
  s.tables[static_cast<int>(call)] = std::move(table);
  s.tuned = true;
  return reports;
}

}  // namespace kiln::runtime
