// Store: reads. Timings and decisions live in an in-memory layer (loaded at open, merged by stamp with what
// this process and others write) and are served from it without touching RocksDB; binaries are read on demand
// and remembered once read. A stored value that fails its checks, or was made with another toolchain, is a
// miss here, reported once.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <tuple>
#include <unordered_set>

#include "format.h"
#include "rocks.h"
#include "store_impl.h"

namespace kiln::cache {

namespace {

// A record wins over another by the same rule first_wins() applies to stored values: newer stamp, then the
// larger encoding. Memory and database therefore agree on every key once they have seen the same writes.
bool timing_wins(const TimingRecord& a, const TimingRecord& b) {
  if (a.measured_at_ns != b.measured_at_ns) return a.measured_at_ns > b.measured_at_ns;
  return encode_timing(a) >= encode_timing(b);
}
bool decision_wins(const Decision& a, const Decision& b) {
  if (a.decided_at_ns != b.decided_at_ns) return a.decided_at_ns > b.decided_at_ns;
  return encode_decision(a) >= encode_decision(b);
}

}  // namespace

// Once per entry per process (not per Store), and at most 20 lines: a damaged cache must not flood logs.
void Store::Impl::report_invalid(int cf, std::string_view key, const Status& why) {
  static std::mutex mu;
  static std::unordered_set<std::string> reported;
  std::lock_guard lock(mu);
  std::string id = dir + "|" + kCfNames[cf] + "|" + std::string(key);
  if (!reported.insert(id).second) return;
  if (reported.size() > 20) {
    if (reported.size() == 21) spdlog::warn("kiln cache: further invalid entries are not logged");
    return;
  }
  std::string printable;
  for (unsigned char c : key.substr(0, 120)) printable += (c >= 0x20 && c < 0x7f) ? char(c) : '.';
  spdlog::warn("kiln cache: {} entry '{}' is a miss: {} (it is replaced when written again; `kiln cache verify` "
               "checks the whole cache)", kCfNames[cf], printable, why.to_string());
}

void Store::Impl::report_stale(int cf, const Toolchain& made_with) {
  std::lock_guard lock(report_mu);
  if (reported_stale[cf]) return;
  reported_stale[cf] = true;
  spdlog::info("kiln cache: {} made with {} are misses for {} (re-measured when needed)", kCfNames[cf],
               made_with.str(), toolchain.str());
}

void Store::Impl::merge_decision(Decision d) {
  auto incoming = std::make_shared<const Decision>(std::move(d));
  decisions.update(incoming->problem, [&](const std::shared_ptr<const Decision>& cur) {
    return (!cur || decision_wins(*incoming, *cur)) ? incoming : nullptr;
  });
}

void Store::Impl::merge_timing(TimingRecord t) {
  std::string problem = t.problem;
  timings.update(problem, [&](const std::shared_ptr<const ProblemTimings>& cur) -> std::shared_ptr<const ProblemTimings> {
    if (cur) {
      auto it = cur->find(t.choice);
      if (it != cur->end() && !timing_wins(t, it->second)) return nullptr;
    }
    // Copy on write: readers keep the map they found.
    auto next = cur ? std::make_shared<ProblemTimings>(*cur) : std::make_shared<ProblemTimings>();
    (*next)[t.choice] = t;
    return next;
  });
}

// Decodes one stored timing/decision and merges it into memory; invalid ones are reported and counted.
void Store::Impl::absorb(int cf, std::string_view key, std::string_view value) {
  if (cf == kTimings) {
    auto t = decode_timing(value);
    if (t.ok() && timing_key(t->problem, t->choice) != key) t = make_error(ErrorCode::kCorrupt, "stored under another key");
    if (!t.ok()) {
      invalid_loaded++;
      return report_invalid(cf, key, t.status());
    }
    merge_timing(std::move(t).value());
  } else if (cf == kDecisions) {
    auto d = decode_decision(value);
    if (d.ok() && d->problem != key) d = make_error(ErrorCode::kCorrupt, "stored under another key");
    if (!d.ok()) {
      invalid_loaded++;
      return report_invalid(cf, key, d.status());
    }
    merge_decision(std::move(d).value());
  }
}

// Reads every timing and decision into memory. Caller holds role_mu (shared).
Status Store::Impl::load_memory() {
  invalid_loaded = 0;
  for (int cf : {kTimings, kDecisions}) {
    std::unique_ptr<rocksdb::Iterator> it(db->db->NewIterator(rocksdb::ReadOptions(), db->cf(cf)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) absorb(cf, it->key().ToStringView(), it->value().ToStringView());
    KILN_CHECK(it->status());
  }
  return Status();
}

std::optional<TimingRecord> Store::timing(std::string_view problem, std::string_view choice) const {
  auto all = impl_->timings.find(problem);
  if (!all) return std::nullopt;
  auto it = all->find(choice);
  if (it == all->end()) return std::nullopt;
  if (it->second.toolchain != impl_->toolchain) {
    impl_->report_stale(kTimings, it->second.toolchain);
    return std::nullopt;
  }
  return it->second;
}

std::vector<TimingRecord> Store::timings(std::string_view problem) const {
  std::vector<TimingRecord> out;
  if (auto all = impl_->timings.find(problem)) {
    for (const auto& [choice, t] : *all) {
      if (t.toolchain == impl_->toolchain) out.push_back(t);
    }
  }
  return out;
}

std::shared_ptr<const Decision> Store::decision(std::string_view problem) const {
  auto d = impl_->decisions.find(problem);
  if (d && d->toolchain != impl_->toolchain) {
    impl_->report_stale(kDecisions, d->toolchain);
    return nullptr;
  }
  return d;
}

std::vector<std::shared_ptr<const Decision>> Store::decisions(std::string_view prefix) const {
  std::vector<std::shared_ptr<const Decision>> out;
  for (auto& [problem, d] : impl_->decisions.entries()) {
    if (problem.compare(0, prefix.size(), prefix) == 0 && d->toolchain == impl_->toolchain) out.push_back(d);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a->problem < b->problem; });
  return out;
}

std::vector<TimingRecord> Store::all_timings() const {
  std::vector<TimingRecord> out;
  for (auto& [problem, all] : impl_->timings.entries()) {
    for (const auto& [choice, t] : *all) {
      if (t.toolchain == impl_->toolchain) out.push_back(t);
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return std::tie(a.problem, a.choice) < std::tie(b.problem, b.choice);
  });
  return out;
}

namespace {

Result<std::shared_ptr<const Binary>> check_arch(const KernelKey& key, std::shared_ptr<const Binary> b,
                                                 std::string_view arch) {
  if (!arch.empty() && b->arch != arch) {
    return make_error(ErrorCode::kNotFound, fmt::format("binary {} was built for {}, not {}", key.hex(), b->arch, arch));
  }
  return b;
}

}  // namespace

// Decodes and checks one stored binary value (the envelope's checksum, the key it names, the NVRTC that built
// it); remembers it when asked. A value that fails is reported once and is a miss.
Result<std::shared_ptr<const Binary>> Store::Impl::decode_stored_binary(const KernelKey& key, const std::string& k,
                                                                        std::string_view value, bool remember) {
  auto stored = decode_binary(value);
  Status bad;
  if (!stored.ok()) {
    bad = stored.status();
  } else if (stored->binary.key != key) {
    bad = make_error(ErrorCode::kCorrupt, fmt::format("holds binary {}", stored->binary.key.hex()));
  } else if (toolchain.nvrtc_major != 0 && (stored->binary.nvrtc_major != toolchain.nvrtc_major ||
                                            stored->binary.nvrtc_minor != toolchain.nvrtc_minor)) {
    bad = make_error(ErrorCode::kFailedPrecondition,
                     fmt::format("built by NVRTC {}.{}, this is {}.{}", stored->binary.nvrtc_major,
                                 stored->binary.nvrtc_minor, toolchain.nvrtc_major, toolchain.nvrtc_minor));
  }
  if (!bad.ok()) {
    report_invalid(kBinaries, key.hex(), bad);
    return make_error(ErrorCode::kNotFound, fmt::format("binary {} is a miss: {}", key.hex(), bad.to_string()));
  }
  auto b = std::make_shared<const Binary>(std::move(stored->binary));
  if (remember) binaries.update(k, [&](const auto&) { return b; });
  return b;
}

Result<std::shared_ptr<const Binary>> Store::get_binary(const KernelKey& key, std::string_view arch, bool remember) {
  Impl& m = *impl_;
  std::string k = binary_key(key);
  if (auto hit = m.binaries.find(k)) return check_arch(key, std::move(hit), arch);
  rocksdb::PinnableSlice value;
  rocksdb::Status s;
  for (int attempt = 0; attempt < 2; ++attempt) {
    {
      std::shared_lock role(m.role_mu);
      value.Reset();
      s = m.db->db->Get(rocksdb::ReadOptions(), m.db->cf(kBinaries), k, &value);
    }
    if (!s.IsNotFound() || m.writer || attempt == 1) break;
    // A reader's view may be behind the writer's: catch up once before calling it a miss.
    KILN_RETURN_IF_ERROR(m.catch_up(false));
  }
  if (s.IsNotFound()) return make_error(ErrorCode::kNotFound, fmt::format("no binary {} in the cache", key.hex()));
  if (!s.ok()) {
    // A damaged table block (or a failing disk): a compile replaces the entry, but the user hears of it.
    Status unreadable = to_status(s, "Get", __FILE__, __LINE__);
    m.report_invalid(kBinaries, key.hex(), unreadable);
    return unreadable;
  }
  KILN_ASSIGN_OR_RETURN(auto b, m.decode_stored_binary(key, k, value.ToStringView(), remember));
  return check_arch(key, std::move(b), arch);
}

std::vector<Result<std::shared_ptr<const Binary>>> Store::get_binaries(const std::vector<KernelKey>& keys,
                                                                       std::string_view arch, bool remember,
                                                                       BinaryReadTimes* times) {
  Impl& m = *impl_;
  using Clock = std::chrono::steady_clock;
  std::vector<Result<std::shared_ptr<const Binary>>> out(keys.size(), make_error(ErrorCode::kInternal, "not read"));
  std::vector<std::string> names(keys.size());
  std::vector<size_t> to_read;  // indices not served from memory
  for (size_t i = 0; i < keys.size(); ++i) {
    names[i] = binary_key(keys[i]);
    if (auto hit = m.binaries.find(names[i])) {
      out[i] = check_arch(keys[i], std::move(hit), arch);
    } else {
      to_read.push_back(i);
    }
  }
  if (to_read.empty()) return out;
  // One MultiGet for the batch: RocksDB sorts the keys, looks up each block once and reads blocks that several
  // keys share once, instead of one Get (with its own lookups and locking) per binary.
  auto t0 = Clock::now();
  std::vector<rocksdb::Slice> slices;
  slices.reserve(to_read.size());
  for (size_t i : to_read) slices.emplace_back(names[i]);
  std::vector<rocksdb::PinnableSlice> values(to_read.size());
  std::vector<rocksdb::Status> statuses(to_read.size());
  {
    std::shared_lock role(m.role_mu);
    m.db->db->MultiGet(rocksdb::ReadOptions(), m.db->cf(kBinaries), slices.size(), slices.data(), values.data(),
                       statuses.data());
  }
  auto t1 = Clock::now();
  for (size_t j = 0; j < to_read.size(); ++j) {
    size_t i = to_read[j];
    const rocksdb::Status& s = statuses[j];
    if (s.IsNotFound()) {
      // A reader may be behind the writer: get_binary catches up once before calling it a miss.
      out[i] = m.writer ? Result<std::shared_ptr<const Binary>>(make_error(
                              ErrorCode::kNotFound, fmt::format("no binary {} in the cache", keys[i].hex())))
                        : get_binary(keys[i], arch, remember);
      continue;
    }
    if (!s.ok()) {
      Status unreadable = to_status(s, "MultiGet", __FILE__, __LINE__);
      m.report_invalid(kBinaries, keys[i].hex(), unreadable);
      out[i] = std::move(unreadable);
      continue;
    }
    auto b = m.decode_stored_binary(keys[i], names[i], values[j].ToStringView(), remember);
    values[j].Reset();  // unpin the block as soon as it is decoded
    out[i] = b.ok() ? check_arch(keys[i], std::move(b).value(), arch) : std::move(b);
  }
  if (times) {
    times->read_seconds += std::chrono::duration<double>(t1 - t0).count();
    times->decode_seconds += std::chrono::duration<double>(Clock::now() - t1).count();
  }
  return out;
}

bool Store::has_binary(const KernelKey& key) { return get_binary(key, {}, false).ok(); }

Status Store::refresh() {
  KILN_RETURN_IF_ERROR(impl_->catch_up(true));
  std::shared_lock role(impl_->role_mu);
  return impl_->load_memory();
}

}  // namespace kiln::cache
