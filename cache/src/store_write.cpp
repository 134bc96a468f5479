// Store: writes. Every put becomes Entries written in one go: the writer applies them to RocksDB directly; a
// reader publishes them as a staged batch (SST files) that the writer ingests, promptly from a background
// thread or at the latest on sync() and close. Both paths merge by the same newest-wins rule (rocks.h), so
// the order in which batches land does not matter.
#include <fmt/format.h>
#include <rocksdb/sst_file_reader.h>
#include <rocksdb/sst_file_writer.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "format.h"
#include "rocks.h"
#include "stamp.h"
#include "store_impl.h"

namespace kiln::cache {

namespace fs = std::filesystem;

Status Store::Impl::write(std::vector<Entry> entries) {
  hook("write:before");
  {
    std::shared_lock lock(role_mu);
    if (writer) {
      KILN_RETURN_IF_ERROR(database_writable());
      rocksdb::WriteBatch batch;
      for (const auto& e : entries) KILN_CHECK(batch.Merge(db->cf(e.cf), e.key, e.value));
      rocksdb::Status s = db->db->Write(write_options(), &batch);
      if (!s.ok()) {
        return note_write(to_status(s, "DB::Write", __FILE__, __LINE__).with_context("writing to the cache database '" + db_path + "'"));
      }
    } else {
      KILN_RETURN_IF_ERROR(note_write(stage(std::move(entries)), false));
    }
  }
  hook("write:after");
  if (!writer) {
    // The role may be free (the writer closed or died): take it so staged entries land in the database.
    Status s = maybe_promote();
    if (!s.ok()) spdlog::warn("kiln cache: could not take over the writer role: {}", s.to_string());
  }
  return Status();
}

// Publishes entries as one staging batch: an SST file per column family in a folder renamed into place
// whole, so the writer sees a batch completely or not at all.
Status Store::Impl::stage(std::vector<Entry> entries) {
  std::lock_guard lock(stage_mu);
  uint64_t seq = ++stage_seq;
  fs::path tmp = fs::path(staging_dir) / fmt::format(".tmp-{}-{:08d}", token, seq);
  std::error_code ec;
  fs::create_directories(tmp, ec);
  if (ec) return make_error(ErrorCode::kIoError, fmt::format("cannot create '{}': {}", tmp.string(), ec.message()));
  // A batch that could not be written whole (a full disk) is removed at once, not left for clean_dead().
  struct RemoveUnlessPublished {
    fs::path path;
    bool published = false;
    ~RemoveUnlessPublished() {
      std::error_code ec;
      if (!published) fs::remove_all(path, ec);
    }
  } guard{tmp};
  auto check = [&](const rocksdb::Status& s, const char* what) {
    return s.ok() ? Status() : to_status(s, what, __FILE__, __LINE__).with_context("staging a batch in '" + tmp.string() + "'");
  };
  std::array<std::vector<Entry*>, kCfCount> by_cf;
  for (auto& e : entries) by_cf[e.cf].push_back(&e);
  for (int cf = 0; cf < kCfCount; ++cf) {
    auto& list = by_cf[cf];
    if (list.empty()) continue;
    // An SST holds each key once, in order: keep the winner of duplicates.
    std::stable_sort(list.begin(), list.end(), [](Entry* a, Entry* b) { return a->key < b->key; });
    rocksdb::SstFileWriter w(rocksdb::EnvOptions(), sst_options(cf, env()));
    KILN_RETURN_IF_ERROR(check(w.Open((tmp / (std::string(kCfNames[cf]) + ".sst")).string()), "SstFileWriter::Open"));
    for (size_t i = 0; i < list.size(); ++i) {
      Entry* best = list[i];
      while (i + 1 < list.size() && list[i + 1]->key == best->key) {
        ++i;
        if (!first_wins(best->value, list[i]->value)) best = list[i];
      }
      KILN_RETURN_IF_ERROR(check(w.Merge(best->key, best->value), "SstFileWriter::Merge"));
    }
    KILN_RETURN_IF_ERROR(check(w.Finish(), "SstFileWriter::Finish"));
  }
  hook("stage:before_publish");
  fs::path final_name = fs::path(staging_dir) / fmt::format("{:020d}-{}-{:08d}", now_ns(), token, seq);
  fs::rename(tmp, final_name, ec);
  if (ec) return make_error(ErrorCode::kIoError, fmt::format("cannot publish '{}': {}", tmp.string(), ec.message()));
  guard.published = true;
  staged_anything = true;
  hook("stage:after_publish");
  return Status();
}

std::vector<fs::path> Store::Impl::staged_batches() const {
  std::vector<fs::path> out;
  std::error_code ec;
  for (auto it = fs::directory_iterator(staging_dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (!name.empty() && name[0] != '.') out.push_back(it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Writer only: applies every published staging batch. A batch is read and verified first (one whose values
// fail their checks is dropped whole). Small batches, the common case of one measurement each, are written
// together through one WriteBatch: microseconds each. Ingesting them as files instead flushes the memtable
// for every batch whose keys overlap it (bench/cache measured about 20 ms per batch). A large batch (a bulk
// import) is ingested as files (IngestExternalFiles), which skips the WAL and the memtable. The merge rule
// makes the outcome independent of the order, and applying a batch twice (a writer killed between writing
// it and deleting it) harmless.
Status Store::Impl::ingest_staged() {
  std::lock_guard lock(ingest_mu);
  std::shared_lock role(role_mu);
  if (!writer) return Status();
  auto batches = staged_batches();
  if (batches.empty()) return Status();
  KILN_RETURN_IF_ERROR(database_writable());
  hook("ingest:before");
  constexpr uintmax_t kIngestAsFilesBytes = 4u << 20;
  rocksdb::WriteBatch wb;
  std::vector<fs::path> written;
  std::vector<Entry> seen;  // timings and decisions, for this process's memory
  auto commit = [&]() -> Status {
    if (wb.Count() > 0) {
      KILN_RETURN_IF_ERROR(note_write(KILN_ROCKS_STATUS(db->db->Write(write_options(), &wb))));
      wb.Clear();
    }
    for (const auto& b : written) {
      std::error_code ec;
      fs::remove_all(b, ec);
    }
    written.clear();
    for (auto& e : seen) absorb(e.cf, e.key, e.value);
    seen.clear();
    return Status();
  };
  for (const fs::path& batch : batches) {
    std::vector<std::pair<int, fs::path>> files;
    uintmax_t bytes = 0;
    for (int cf = 0; cf < kCfCount; ++cf) {
      fs::path file = batch / (std::string(kCfNames[cf]) + ".sst");
      std::error_code ec;
      if (!fs::exists(file, ec)) continue;
      bytes += fs::file_size(file, ec);
      files.emplace_back(cf, file);
    }
    const bool as_files = bytes > kIngestAsFilesBytes;
    std::vector<Entry> mine;  // the batch's entries, when it is written rather than ingested
    std::vector<Entry> mine_seen;
    Status bad;
    for (const auto& [cf, file] : files) {
      rocksdb::SstFileReader reader(sst_options(cf, env()));
      rocksdb::Status s = reader.Open(file.string());
      if (s.ok()) s = reader.VerifyChecksum();
      if (!s.ok()) {
        bad = to_status(s, "SstFileReader", __FILE__, __LINE__);
        break;
      }
      std::unique_ptr<rocksdb::Iterator> it(reader.NewIterator(rocksdb::ReadOptions()));
      for (it->SeekToFirst(); it->Valid() && bad.ok(); it->Next()) {
        auto env = open_envelope(it->value().ToStringView());
        if (!env.ok()) {
          bad = env.status();
          break;
        }
        if (!as_files) mine.push_back({Cf(cf), it->key().ToString(), it->value().ToString()});
        if (cf == kTimings || cf == kDecisions) mine_seen.push_back({Cf(cf), it->key().ToString(), it->value().ToString()});
      }
      if (bad.ok() && !it->status().ok()) bad = to_status(it->status(), "SstFileReader iterator", __FILE__, __LINE__);
      if (!bad.ok()) break;
    }
    if (!bad.ok()) {
      spdlog::warn("kiln cache: dropping staged batch {}: {}", batch.filename().string(), bad.to_string());
      std::error_code ec;
      fs::remove_all(batch, ec);
      continue;
    }
    if (as_files) {
      KILN_RETURN_IF_ERROR(commit());
      std::vector<rocksdb::IngestExternalFileArg> args;
      for (const auto& [cf, file] : files) {
        rocksdb::IngestExternalFileArg arg;
        arg.column_family = db->cf(cf);
        arg.external_files = {file.string()};
        arg.options.move_files = true;
        arg.options.write_global_seqno = false;
        args.push_back(std::move(arg));
      }
      rocksdb::Status s = db->db->IngestExternalFiles(args);
      if (!s.ok()) return note_write(to_status(s, "IngestExternalFiles", __FILE__, __LINE__).with_context("ingesting " + batch.string()));
    } else {
      for (const auto& e : mine) KILN_CHECK(wb.Merge(db->cf(e.cf), e.key, e.value));
    }
    written.push_back(batch);
    for (auto& e : mine_seen) seen.push_back(std::move(e));
    if (wb.GetDataSize() > (16u << 20)) KILN_RETURN_IF_ERROR(commit());
  }
  KILN_RETURN_IF_ERROR(commit());
  hook("ingest:after");
  return Status();
}

void Store::Impl::start_ingest_thread() {
  if (options.ingest_interval.count() <= 0 || ingest_thread.joinable()) return;
  ingest_thread = std::jthread([this](std::stop_token stop) {
    std::unique_lock lock(ingest_thread_mu);
    while (!stop.stop_requested()) {
      ingest_cv.wait_for(lock, stop, options.ingest_interval, [] { return false; });
      if (stop.stop_requested()) break;
      lock.unlock();
      if (!staged_batches().empty()) {
        Status s = ingest_staged();
        if (!s.ok()) spdlog::warn("kiln cache: ingesting staged entries: {}", s.to_string());
      }
      lock.lock();
    }
  });
}

Status Store::put_binary(const Binary& binary) {
  if (binary.cubin.empty()) return make_error(ErrorCode::kInvalidArgument, "a binary without a cubin");
  std::string key = binary_key(binary.key);
  KILN_RETURN_IF_ERROR(impl_->write({{kBinaries, key, encode_binary(binary, now_ns())}}));
  impl_->binaries.update(key, [&](const auto&) { return std::make_shared<const Binary>(binary); });
  return Status();
}

Status Store::put_timing(TimingRecord t) {
  KILN_RETURN_IF_ERROR(stamp_record(t, impl_->toolchain));
  KILN_RETURN_IF_ERROR(impl_->write({{kTimings, timing_key(t.problem, t.choice), encode_timing(t)}}));
  impl_->merge_timing(std::move(t));
  return Status();
}

Status Store::put_decision(Decision d) {
  KILN_RETURN_IF_ERROR(stamp_record(d, impl_->toolchain));
  KILN_RETURN_IF_ERROR(impl_->write({{kDecisions, d.problem, encode_decision(d)}}));
  impl_->merge_decision(std::move(d));
  return Status();
}

Status Store::put_all(std::vector<TimingRecord> timings, std::vector<Decision> decisions,
                      const std::vector<Binary>& binaries) {
  Impl& m = *impl_;
  std::vector<Entry> entries;
  for (auto& t : timings) {
    KILN_RETURN_IF_ERROR(stamp_record(t, m.toolchain));
    entries.push_back({kTimings, timing_key(t.problem, t.choice), encode_timing(t)});
  }
  for (auto& d : decisions) {
    KILN_RETURN_IF_ERROR(stamp_record(d, m.toolchain));
    entries.push_back({kDecisions, d.problem, encode_decision(d)});
  }
  int64_t now = now_ns();
  for (const auto& b : binaries) {
    if (b.cubin.empty()) return make_error(ErrorCode::kInvalidArgument, "a binary without a cubin");
    entries.push_back({kBinaries, binary_key(b.key), encode_binary(b, now)});
  }
  if (entries.empty()) return Status();
  KILN_RETURN_IF_ERROR(m.write(std::move(entries)));
  for (auto& t : timings) m.merge_timing(std::move(t));
  for (auto& d : decisions) m.merge_decision(std::move(d));
  return Status();
}

Status Store::touch(const std::vector<KernelKey>& keys) {
  Impl& m = *impl_;
  int64_t now = now_ns();
  constexpr int64_t kHour = 3600LL * 1000 * 1000 * 1000;
  std::vector<Entry> entries;
  {
    std::lock_guard lock(m.used_mu);
    for (const auto& k : keys) {
      int64_t& last = m.used_written[k];
      if (now - last < kHour) continue;
      last = now;
      entries.push_back({kMeta, used_key(k), encode_used(now)});
    }
  }
  if (entries.empty()) return Status();
  return m.write(std::move(entries));
}

Status Store::sync() {
  Impl& m = *impl_;
  if (!m.writer) KILN_RETURN_IF_ERROR(m.maybe_promote());
  if (!m.writer) return Status();
  KILN_RETURN_IF_ERROR(m.ingest_staged());
  m.clean_dead();
  std::shared_lock role(m.role_mu);
  if (!m.writer) return Status();
  KILN_RETURN_IF_ERROR(m.database_writable());
  KILN_RETURN_IF_ERROR(m.note_write(KILN_ROCKS_STATUS(m.db->db->SyncWAL())));
  return Status();
}

}  // namespace kiln::cache
