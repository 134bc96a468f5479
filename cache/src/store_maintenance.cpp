// Store: whole-cache operations, the ones `kiln cache` runs: iterating the stored binaries (for listing and
// export), stats, flushing RocksDB's memtable, prune (by arch, toolchain, age and size, least recently
// used first) and clear. Prune and clear need the writer role and scan RocksDB itself, not the in-memory
// layer: binaries are read on demand, and entries that fail their checks must go too.
#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <functional>
#include <unordered_map>

#include "format.h"
#include "rocks.h"
#include "store_impl.h"

namespace kiln::cache {

namespace fs = std::filesystem;

namespace {

uint64_t dir_bytes(const fs::path& p) {
  uint64_t n = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(p, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code ec2;
    if (it->is_regular_file(ec2)) n += it->file_size(ec2);
  }
  return n;
}

// Every binary's last use, from meta's used/<key> entries. An entry that fails its checks is skipped, or
// handed to `invalid` when given (prune drops it). Caller holds role_mu (shared).
Result<std::unordered_map<KernelKey, int64_t>> read_used(
    const Db& db, const std::function<Status(const rocksdb::Slice& key)>& invalid = {}) {
  std::unordered_map<KernelKey, int64_t> used;
  std::unique_ptr<rocksdb::Iterator> it(db.db->NewIterator(rocksdb::ReadOptions(), db.cf(kMeta)));
  for (it->Seek(std::string(kUsedPrefix)); it->Valid() && it->key().starts_with(std::string(kUsedPrefix)); it->Next()) {
    auto key = parse_binary_key(it->key().ToStringView().substr(kUsedPrefix.size()));
    auto when = decode_used(it->value().ToStringView());
    if (key.ok() && when.ok()) {
      used[*key] = *when;
    } else if (invalid) {
      KILN_RETURN_IF_ERROR(invalid(it->key()));
    }
  }
  KILN_CHECK(it->status());
  return used;
}

}  // namespace

Result<uint64_t> Store::for_each_binary(const std::function<bool(const BinaryInfo&)>& fn) {
  Impl& m = *impl_;
  std::shared_lock role(m.role_mu);
  KILN_ASSIGN_OR_RETURN(auto used, read_used(*m.db));
  uint64_t invalid = 0;
  std::unique_ptr<rocksdb::Iterator> it(m.db->db->NewIterator(rocksdb::ReadOptions(), m.db->cf(kBinaries)));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    auto info = decode_binary_info(it->value().ToStringView());
    auto key = parse_binary_key(it->key().ToStringView());
    if (info.ok() && (!key.ok() || *key != info->key)) info = make_error(ErrorCode::kCorrupt, "stored under another key");
    if (!info.ok()) {
      ++invalid;
      continue;
    }
    if (auto u = used.find(info->key); u != used.end()) info->used_at_ns = u->second;
    if (!fn(*info)) break;
  }
  KILN_CHECK(it->status());
  return invalid;
}

Result<StoreStats> Store::stats() {
  Impl& m = *impl_;
  StoreStats st;
  st.dir = m.dir;
  st.writer = m.writer;
  std::map<std::string, uint64_t> by_arch;
  KILN_ASSIGN_OR_RETURN(uint64_t invalid_binaries, for_each_binary([&](const BinaryInfo& b) {
                          st.binaries++;
                          st.binary_bytes += b.value_bytes;
                          by_arch[b.arch]++;
                          if (b.nvrtc_major != m.toolchain.nvrtc_major || b.nvrtc_minor != m.toolchain.nvrtc_minor) st.stale++;
                          return true;
                        }));
  st.binaries_by_arch.assign(by_arch.begin(), by_arch.end());
  for (auto& [problem, all] : m.timings.entries()) {
    for (const auto& [choice, t] : *all) {
      if (t.toolchain != m.toolchain) {
        st.stale++;
      } else {
        (t.ok ? st.timings : st.failures)++;
      }
    }
  }
  for (auto& [problem, d] : m.decisions.entries()) (d->toolchain == m.toolchain ? st.decisions : st.stale)++;
  st.invalid = invalid_binaries + m.invalid_loaded;
  st.staged_batches = m.staged_batches().size();
  st.disk_bytes = dir_bytes(m.dir);
  return st;
}

Status Store::flush() {
  Impl& m = *impl_;
  std::shared_lock role(m.role_mu);
  if (!m.writer) return Status();
  KILN_RETURN_IF_ERROR(m.database_writable());
  rocksdb::FlushOptions fo;
  std::vector<rocksdb::ColumnFamilyHandle*> cfs(m.db->handles.begin() + 1, m.db->handles.end());
  KILN_RETURN_IF_ERROR(m.note_write(KILN_ROCKS_STATUS(m.db->db->Flush(fo, cfs))));
  return Status();
}

Result<PruneReport> Store::prune(const PruneOptions& o) {
  Impl& m = *impl_;
  if (!m.writer) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "pruning needs the writer role; another process using the cache holds it");
  }
  KILN_RETURN_IF_ERROR(m.database_writable());
  KILN_RETURN_IF_ERROR(m.ingest_staged());
  PruneReport report;
  const int64_t now = now_ns();
  const int64_t cutoff = o.older_than.count() > 0 ? now - int64_t(o.older_than.count()) * 1000000000LL : INT64_MIN;
  rocksdb::WriteBatch batch;
  std::vector<std::string> dropped_binaries;

  // Binaries: by arch, toolchain and age first, then the least recently used until under the size bound.
  struct Candidate {
    BinaryInfo info;
    int64_t last_use;
  };
  std::vector<Candidate> kept;
  {
    std::shared_lock role(m.role_mu);
    KILN_ASSIGN_OR_RETURN(auto used, read_used(*m.db, [&](const rocksdb::Slice& key) -> Status {
      report.invalid++;
      KILN_CHECK(batch.Delete(m.db->cf(kMeta), key));
      return Status();
    }));
    std::unique_ptr<rocksdb::Iterator> it(m.db->db->NewIterator(rocksdb::ReadOptions(), m.db->cf(kBinaries)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      auto info = decode_binary_info(it->value().ToStringView());
      auto key = parse_binary_key(it->key().ToStringView());
      bool drop = false;
      if (!info.ok() || !key.ok() || *key != info->key) {
        report.invalid++;
        drop = true;
      } else {
        int64_t last_use = std::max(info->created_at_ns, used.count(*key) ? used[*key] : 0);
        bool other_nvrtc = info->nvrtc_major != m.toolchain.nvrtc_major || info->nvrtc_minor != m.toolchain.nvrtc_minor;
        drop = (!o.arch.empty() && info->arch == o.arch) || (o.other_toolchains && other_nvrtc) || last_use < cutoff;
        if (drop) {
          report.binaries++;
          report.binary_bytes += it->value().size();
        } else {
          kept.push_back({std::move(info).value(), last_use});
        }
      }
      if (drop) {
        KILN_CHECK(batch.Delete(m.db->cf(kBinaries), it->key()));
        dropped_binaries.push_back(it->key().ToString());
      }
    }
    KILN_CHECK(it->status());
    if (o.max_binary_bytes > 0) {
      uint64_t total = 0;
      for (const auto& c : kept) total += c.info.value_bytes;
      std::sort(kept.begin(), kept.end(), [](const Candidate& a, const Candidate& b) { return a.last_use < b.last_use; });
      for (const auto& c : kept) {
        if (total <= o.max_binary_bytes) break;
        total -= c.info.value_bytes;
        report.binaries++;
        report.binary_bytes += c.info.value_bytes;
        std::string k = binary_key(c.info.key);
        KILN_CHECK(batch.Delete(m.db->cf(kBinaries), k));
        dropped_binaries.push_back(k);
      }
    }
    for (const auto& k : dropped_binaries) KILN_CHECK(batch.Delete(m.db->cf(kMeta), std::string(kUsedPrefix) + k));

    // Timings and decisions: invalid, made with another toolchain, or older than the cutoff.
    for (int cf : {kTimings, kDecisions}) {
      std::unique_ptr<rocksdb::Iterator> ti(m.db->db->NewIterator(rocksdb::ReadOptions(), m.db->cf(cf)));
      for (ti->SeekToFirst(); ti->Valid(); ti->Next()) {
        std::optional<Toolchain> made_with;
        int64_t stamp = 0;
        std::string_view key = ti->key().ToStringView();
        if (cf == kTimings) {
          auto t = decode_timing(ti->value().ToStringView());
          if (t.ok() && timing_key(t->problem, t->choice) == key) made_with = t->toolchain, stamp = t->measured_at_ns;
        } else {
          auto d = decode_decision(ti->value().ToStringView());
          if (d.ok() && d->problem == key) made_with = d->toolchain, stamp = d->decided_at_ns;
        }
        bool drop = !made_with || (o.other_toolchains && *made_with != m.toolchain) || stamp < cutoff;
        if (!drop) continue;
        (!made_with ? report.invalid : cf == kTimings ? report.timings : report.decisions)++;
        KILN_CHECK(batch.Delete(m.db->cf(cf), ti->key()));
        if (!o.dry_run) {
          std::string key = ti->key().ToString();
          if (cf == kDecisions) {
            m.decisions.erase(key);
          } else {
            std::string problem = key.substr(0, key.find('\0'));
            std::string choice = key.substr(key.find('\0') + 1);
            m.timings.update(problem, [&](const std::shared_ptr<const ProblemTimings>& cur) -> std::shared_ptr<const ProblemTimings> {
              if (!cur) return nullptr;
              auto next = std::make_shared<ProblemTimings>(*cur);
              next->erase(choice);
              return next;
            });
          }
        }
      }
      KILN_CHECK(ti->status());
    }
    if (o.dry_run) return report;
    KILN_RETURN_IF_ERROR(m.note_write(KILN_ROCKS_STATUS(m.db->db->Write(m.write_options(), &batch))));
    m.invalid_loaded = 0;  // every invalid timing and decision was just dropped
    for (const auto& k : dropped_binaries) m.binaries.erase(k);
    // Reclaim the space now rather than at the next compaction.
    for (int cf = 0; cf < kCfCount; ++cf) {
      KILN_CHECK(m.db->db->CompactRange(rocksdb::CompactRangeOptions(), m.db->cf(cf), nullptr, nullptr));
    }
  }
  return report;
}

Status Store::clear() {
  Impl& m = *impl_;
  if (!m.writer) {
    return make_error(ErrorCode::kFailedPrecondition, "clearing needs the writer role; another process using the cache holds it");
  }
  KILN_RETURN_IF_ERROR(m.database_writable());
  std::shared_lock role(m.role_mu);
  rocksdb::WriteBatch batch;
  for (int cf = 0; cf < kCfCount; ++cf) {
    std::unique_ptr<rocksdb::Iterator> it(m.db->db->NewIterator(rocksdb::ReadOptions(), m.db->cf(cf)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      if (cf == kMeta && it->key() == rocksdb::Slice(kMetaFormatKey.data(), kMetaFormatKey.size())) continue;
      KILN_CHECK(batch.Delete(m.db->cf(cf), it->key()));
    }
    KILN_CHECK(it->status());
  }
  KILN_RETURN_IF_ERROR(m.note_write(KILN_ROCKS_STATUS(m.db->db->Write(m.write_options(), &batch))));
  m.decisions.clear();
  m.timings.clear();
  m.binaries.clear();
  for (int cf = 0; cf < kCfCount; ++cf) {
    KILN_CHECK(m.db->db->CompactRange(rocksdb::CompactRangeOptions(), m.db->cf(cf), nullptr, nullptr));
  }
  return Status();
}

}  // namespace kiln::cache
