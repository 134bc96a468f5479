// push, pull and summarize: whole-cache transfers a person or a build machine runs. They use their own
// connection outside the circuit breaker (a command asked for explicitly fails loudly rather than skipping)
// and pipeline their commands in batches.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "tier_impl.h"

namespace kiln::cache {
namespace {

constexpr size_t kBatch = 64;
constexpr size_t kBinaryBatch = 16;

std::string prefix() { return fmt::format("kiln:f{}:", value_format_version()); }

// "sm_90a" -> "sm_90": the compute capability a problem's key names.
std::string cc_arch(std::string_view arch) {
  std::string a(arch);
  while (!a.empty() && std::isalpha(static_cast<unsigned char>(a.back()))) a.pop_back();
  return a;
}

bool problem_selected(std::string_view problem, const SyncOptions& o) {
  return o.arch.empty() || problem_arch(problem) == cc_arch(o.arch);
}

void note(SyncReport& r, std::string line) {
  if (r.errors.size() < 20) r.errors.push_back(std::move(line));
}

// Sends `cmds` as one pipeline and clears it; adds the commands the remote accepted to `sent` and counts
// error replies (a full Redis) in report.failed. Errors: the connection's.
Status send(RedisConnection& conn, std::vector<std::vector<std::string>>& cmds, SyncReport& report, uint64_t& sent) {
  if (cmds.empty()) return Status();
  KILN_ASSIGN_OR_RETURN(auto replies, conn.pipeline(cmds));
  for (size_t i = 0; i < replies.size(); ++i) {
    if (replies[i].type == Reply::kError) {
      ++report.failed;
      note(report, fmt::format("{}: {}", cmds[i][1].substr(0, 160), replies[i].str));
    } else {
      ++sent;
    }
  }
  cmds.clear();
  return Status();
}

// Every key matching `pattern` (SCAN, so a large remote is never blocked).
Result<std::vector<std::string>> scan(RedisConnection& conn, const std::string& pattern) {
  std::vector<std::string> keys;
  std::string cursor = "0";
  do {
    KILN_ASSIGN_OR_RETURN(Reply r, conn.command({"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"}));
    if (r.type != Reply::kArray || r.elements.size() != 2) {
      return make_error(ErrorCode::kUnavailable, fmt::format("SCAN answered {}", r.type == Reply::kError ? r.str : "oddly"));
    }
    cursor = r.elements[0].str;
    for (auto& k : r.elements[1].elements) keys.push_back(std::move(k.str));
  } while (cursor != "0");
  std::sort(keys.begin(), keys.end());
  return keys;
}

}  // namespace

Result<SyncReport> push(Store& store, RedisTier& remote, const SyncOptions& options) {
  RedisTier::Impl& m = *remote.impl_;
  KILN_ASSIGN_OR_RETURN(auto conn, m.connect_now());
  SyncReport report;
  std::vector<std::vector<std::string>> cmds;
  for (const auto& d : options.binaries_only ? decltype(store.decisions()){} : store.decisions()) {
    if (!problem_selected(d->problem, options)) continue;
    cmds.push_back(m.store_command(*d));
    if (cmds.size() == kBatch) KILN_RETURN_IF_ERROR(send(*conn, cmds, report, report.decisions));
  }
  KILN_RETURN_IF_ERROR(send(*conn, cmds, report, report.decisions));
  if (options.decisions_only) return report;
  for (const auto& t : options.binaries_only ? std::vector<TimingRecord>{} : store.all_timings()) {
    if (!problem_selected(t.problem, options)) continue;
    cmds.push_back(m.store_command(t));
    if (cmds.size() == kBatch) KILN_RETURN_IF_ERROR(send(*conn, cmds, report, report.timings));
  }
  KILN_RETURN_IF_ERROR(send(*conn, cmds, report, report.timings));

  std::vector<KernelKey> keys = options.binaries;
  if (keys.empty()) {
    KILN_ASSIGN_OR_RETURN(uint64_t invalid, store.for_each_binary([&](const BinaryInfo& b) {
      if (options.arch.empty() || b.arch == options.arch) keys.push_back(b.key);
      return true;
    }));
    (void)invalid;
  }
  for (const auto& k : keys) {
    auto b = store.get_binary(k, {}, false);
    if (!b.ok()) {
      ++report.failed;
      note(report, fmt::format("binary {}: {}", k.hex(), b.status().to_string()));
      continue;
    }
    if (!options.arch.empty() && (*b)->arch != options.arch) continue;
    if (!m.may_send_binaries()) {
      ++report.withheld;
      continue;
    }
    cmds.push_back(m.store_command(**b));
    if (cmds.size() == kBinaryBatch) KILN_RETURN_IF_ERROR(send(*conn, cmds, report, report.binaries));
  }
  KILN_RETURN_IF_ERROR(send(*conn, cmds, report, report.binaries));
  return report;
}

Result<SyncReport> pull(Store& store, RedisTier& remote, const SyncOptions& options) {
  RedisTier::Impl& m = *remote.impl_;
  KILN_ASSIGN_OR_RETURN(auto conn, m.connect_now());
  SyncReport report;
  const std::string p = prefix();
  const std::string problem_arch_glob = options.arch.empty() ? "*" : cc_arch(options.arch);
  auto refused = [&](Refusal why, const std::string& slot, const Status& s) {
    ++report.refused;
    m.count_refusal(why, slot, s);
  };
  auto store_batch = [&](std::vector<TimingRecord> t, std::vector<Decision> d, std::vector<Binary> b) {
    const size_t n = t.size() + d.size() + b.size();
    if (n == 0) return;
    if (Status s = store.put_all(std::move(t), std::move(d), b); !s.ok()) {
      report.failed += n;
      note(report, "storing locally: " + s.to_string());
    }
  };

  // Decisions.
  {
    const std::string head = p + "dec:";
    KILN_ASSIGN_OR_RETURN(auto keys, scan(*conn, head + problem_arch_glob + ":*"));
    for (size_t i = 0; i < keys.size(); i += kBatch) {
      std::vector<std::vector<std::string>> cmds;
      for (size_t j = i; j < std::min(keys.size(), i + kBatch); ++j) cmds.push_back({"GET", keys[j]});
      KILN_ASSIGN_OR_RETURN(auto replies, conn->pipeline(cmds));
      std::vector<Decision> got;
      for (size_t j = 0; j < replies.size(); ++j) {
        const std::string& slot = cmds[j][1];
        if (replies[j].type != Reply::kString) continue;  // gone since the scan
        const size_t colon = slot.find(':', head.size());
        std::string problem = slot.substr(colon + 1);
        Refusal why;
        auto d = unseal_decision(slot, replies[j].str, problem, m.policy, &why);
        if (!d.ok()) {
          refused(why, slot, d.status());
          continue;
        }
        got.push_back(std::move(d).value());
      }
      report.decisions += got.size();
      store_batch({}, std::move(got), {});
    }
  }
  if (options.decisions_only) return report;

  // Timings.
  {
    const std::string head = p + "tim:";
    KILN_ASSIGN_OR_RETURN(auto keys, scan(*conn, head + problem_arch_glob + ":*"));
    for (size_t i = 0; i < keys.size(); i += kBatch) {
      std::vector<std::vector<std::string>> cmds;
      for (size_t j = i; j < std::min(keys.size(), i + kBatch); ++j) cmds.push_back({"HGETALL", keys[j]});
      KILN_ASSIGN_OR_RETURN(auto replies, conn->pipeline(cmds));
      std::vector<TimingRecord> got;
      for (size_t j = 0; j < replies.size(); ++j) {
        const std::string& slot = cmds[j][1];
        const std::string problem = slot.substr(slot.find(':', head.size()) + 1);
        const auto& e = replies[j].elements;
        for (size_t f = 0; f + 1 < e.size(); f += 2) {
          const std::string field_slot = slot + "\n" + e[f].str;
          Refusal why;
          auto t = unseal_timing(field_slot, e[f + 1].str, problem, e[f].str, m.policy, &why);
          if (!t.ok()) {
            refused(why, field_slot, t.status());
            continue;
          }
          got.push_back(std::move(t).value());
        }
      }
      report.timings += got.size();
      store_batch(std::move(got), {}, {});
    }
  }

  // Binaries: only where they can pass (a key, or unsigned binaries allowed).
  if (!m.may_send_binaries()) return report;
  {
    const std::string head = p + "bin:";
    KILN_ASSIGN_OR_RETURN(auto keys, scan(*conn, head + (options.arch.empty() ? "*" : options.arch) + ":*"));
    for (size_t i = 0; i < keys.size(); i += kBinaryBatch) {
      std::vector<std::vector<std::string>> cmds;
      for (size_t j = i; j < std::min(keys.size(), i + kBinaryBatch); ++j) cmds.push_back({"GET", keys[j]});
      KILN_ASSIGN_OR_RETURN(auto replies, conn->pipeline(cmds));
      std::vector<Binary> got;
      for (size_t j = 0; j < replies.size(); ++j) {
        const std::string& slot = cmds[j][1];
        if (replies[j].type != Reply::kString) continue;
        auto k = KernelKey::parse(std::string_view(slot).substr(slot.rfind(':') + 1));
        if (!k.ok()) {
          refused(Refusal::kMalformed, slot, k.status());
          continue;
        }
        Refusal why;
        auto b = unseal_binary(slot, replies[j].str, *k, m.policy, &why);
        if (!b.ok()) {
          refused(why, slot, b.status());
          continue;
        }
        got.push_back(std::move(b).value());
      }
      report.binaries += got.size();
      store_batch({}, {}, std::move(got));
    }
  }
  return report;
}

Result<RemoteSummary> summarize(RedisTier& remote) {
  RedisTier::Impl& m = *remote.impl_;
  KILN_ASSIGN_OR_RETURN(auto conn, m.connect_now());
  RemoteSummary s;
  s.url = m.where;
  const std::string p = prefix();
  KILN_ASSIGN_OR_RETURN(auto bins, scan(*conn, p + "bin:*"));
  KILN_ASSIGN_OR_RETURN(auto decs, scan(*conn, p + "dec:*"));
  KILN_ASSIGN_OR_RETURN(auto tims, scan(*conn, p + "tim:*"));
  s.binaries = bins.size();
  s.decisions = decs.size();
  s.timing_problems = tims.size();
  KILN_ASSIGN_OR_RETURN(Reply info, conn->command({"INFO", "memory"}));
  auto field = [&](std::string_view name) -> std::string {
    const std::string key = std::string(name) + ":";
    size_t at = info.str.find(key);
    if (at == std::string::npos) return "";
    at += key.size();
    return info.str.substr(at, info.str.find_first_of("\r\n", at) - at);
  };
  s.used_memory = std::strtoull(field("used_memory").c_str(), nullptr, 10);
  s.max_memory = std::strtoull(field("maxmemory").c_str(), nullptr, 10);
  s.eviction_policy = field("maxmemory_policy");
  KILN_ASSIGN_OR_RETURN(Reply stats, conn->command({"HGETALL", p + "stats"}));
  for (size_t i = 0; i + 1 < stats.elements.size(); i += 2) {
    s.fleet_counters.emplace_back(stats.elements[i].str, std::strtoull(stats.elements[i + 1].str.c_str(), nullptr, 10));
  }
  std::sort(s.fleet_counters.begin(), s.fleet_counters.end());
  return s;
}

}  // namespace kiln::cache
