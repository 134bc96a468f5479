// kiln cache stats|ls|export|import|prune|clear|verify|repair: look after the cache folder (see docs/cache.md,
// docs/reliability.md).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <ctime>

#include "commands.h"
#include "kiln/cache/cache.h"
#include "remote_cli.h"

namespace kiln::cli {
namespace {

struct CacheArgs {
  std::string dir;
  std::string file;
  std::string kind = "decisions";
  std::string prefix;
  bool binaries = false;
  bool json = false;
  std::string max_size;
  std::string older_than;
  std::string arch;
  bool other_toolchains = false;
  bool dry_run = false;
  bool yes = false;
  std::string sign_key;
  std::vector<std::string> trust_keys;
  bool trust_unsigned = false;
  RemoteArgs remote;
};

[[noreturn]] void fail(const std::string& what, const Status& s, int code = 1) {
  fmt::print(stderr, "kiln cache {}: {}\n", what, s.to_string());
  throw ExitCode(code);
}

std::unique_ptr<cache::Store> open_store(const CacheArgs& a, cache::Role role, const char* what) {
  cache::StoreOptions o;
  o.dir = a.dir;
  o.role = role;
  o.ingest_interval = std::chrono::milliseconds(0);
  auto s = cache::Store::open(o);
  if (!s.ok()) fail(what, s.status());
  return std::move(s).value();
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.1f} {}", b, units[u]);
}

std::string age(int64_t ns) {
  if (ns <= 0) return "never";
  double s = (cache::now_ns() - ns) / 1e9;
  if (s < 120) return fmt::format("{:.0f}s ago", s);
  if (s < 7200) return fmt::format("{:.0f}m ago", s / 60);
  if (s < 172800) return fmt::format("{:.0f}h ago", s / 3600);
  return fmt::format("{:.0f}d ago", s / 86400);
}

// "512M", "2G", "1048576" -> bytes. strtod also reads "nan", "inf" and 1e400: refused, as is anything past 2^62
// bytes, since converting such a double to an integer is undefined (it once read `--max-size nan` as some size).
Result<uint64_t> parse_size(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string unit(end);
  double mult = unit.empty() || unit == "B" ? 1 : unit == "K" || unit == "KiB" ? 1024.0
              : unit == "M" || unit == "MiB" ? 1048576.0 : unit == "G" || unit == "GiB" ? 1073741824.0 : -1;
  const double bytes = v * mult;
  if (end == s.c_str() || mult < 0 || !(bytes >= 0 && bytes <= 0x1p62)) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("bad size '{}' (e.g. 512M, 2G)", s));
  }
  return static_cast<uint64_t>(bytes);
}

// "30d", "12h", "90m", "3600" (seconds) -> seconds; like sizes, not NaN, infinite or past 10,000 years.
Result<std::chrono::seconds> parse_age(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string unit(end);
  double mult = unit.empty() || unit == "s" ? 1 : unit == "m" ? 60 : unit == "h" ? 3600 : unit == "d" ? 86400 : -1;
  const double seconds = v * mult;
  if (end == s.c_str() || mult < 0 || !(seconds > 0 && seconds <= 1e4 * 365.25 * 86400)) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("bad age '{}' (e.g. 30d, 12h)", s));
  }
  return std::chrono::seconds(static_cast<int64_t>(seconds));
}

// The remote part of `kiln cache stats`: what it holds and the fleet's counters (every kiln process adds its
// own when it closes). JSON null with the reason when it cannot be reached; `ok` false then.
nlohmann::json remote_stats(const CacheArgs& a, bool& ok) {
  ok = true;
  auto tier = open_remote(a.remote, false);
  if (!tier.ok()) fail("stats", tier.status(), 2);
  if (!*tier) return nullptr;
  nlohmann::json out{{"url", (*tier)->describe()}, {"signing", (*tier)->signing()}};
  auto s = cache::summarize(**tier);
  if (!s.ok()) {
    ok = false;
    out["reachable"] = false;
    out["error"] = s.status().to_string();
    return out;
  }
  nlohmann::json counters = nlohmann::json::object();
  for (const auto& [name, n] : s->fleet_counters) counters[name] = n;
  out.update({{"reachable", true}, {"binaries", s->binaries}, {"decisions", s->decisions},
              {"timing_problems", s->timing_problems}, {"used_memory", s->used_memory},
              {"max_memory", s->max_memory}, {"eviction_policy", s->eviction_policy}, {"fleet_counters", counters}});
  return out;
}

void print_remote_stats(const nlohmann::json& r) {
  fmt::print("remote     {} ({})\n", r["url"].get<std::string>(), r["signing"].get<bool>() ? "signed with the fleet key" : "no fleet key");
  if (!r["reachable"].get<bool>()) {
    fmt::print("  unreachable: {}\n", r["error"].get<std::string>());
    return;
  }
  fmt::print("  holds    {} decisions, {} problems' timings, {} binaries\n", r["decisions"].get<uint64_t>(),
             r["timing_problems"].get<uint64_t>(), r["binaries"].get<uint64_t>());
  const uint64_t max = r["max_memory"].get<uint64_t>();
  fmt::print("  memory   {} of {} ({})\n", human_bytes(double(r["used_memory"].get<uint64_t>())),
             max ? human_bytes(double(max)) : std::string("no limit"), r["eviction_policy"].get<std::string>());
  const auto& c = r["fleet_counters"];
  auto n = [&](const char* k) { return c.contains(k) ? c[k].get<uint64_t>() : uint64_t(0); };
  fmt::print("  fleet    {} hits, {} misses, {} refused, {} lookup errors, {} skipped (breaker open, opened {} "
             "times), {} published, {} queue drops, {} not published, {} binaries withheld (no key)\n",
             n("hits"), n("misses"), n("refused"), n("errors"), n("skipped"), n("breaker_opened"), n("published"),
             n("queue_drops"), n("write_errors"), n("withheld"));
}

void run_stats(const CacheArgs& a) {
  auto store = open_store(a, cache::Role::kReader, "stats");
  auto st = store->stats();
  if (!st.ok()) fail("stats", st.status());
  bool remote_ok = true;
  const nlohmann::json remote = remote_stats(a, remote_ok);
  if (a.json) {
    nlohmann::json by_arch = nlohmann::json::object();
    for (const auto& [arch, n] : st->binaries_by_arch) by_arch[arch] = n;
    nlohmann::json out{{"dir", st->dir},
                       {"toolchain", store->toolchain().str()},
                       {"decisions", st->decisions},
                       {"timings", st->timings},
                       {"failures", st->failures},
                       {"binaries", st->binaries},
                       {"binary_bytes", st->binary_bytes},
                       {"binaries_by_arch", by_arch},
                       {"stale", st->stale},
                       {"invalid", st->invalid},
                       {"staged_batches", st->staged_batches},
                       {"disk_bytes", st->disk_bytes},
                       {"remote", remote}};
    fmt::print("{}\n", out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
    if (!remote_ok) throw ExitCode(1);
    return;
  }
  fmt::print("cache      {}\n", st->dir);
  fmt::print("toolchain  {}\n", store->toolchain().str());
  fmt::print("decisions  {}\n", st->decisions);
  fmt::print("timings    {} ({} cached failures)\n", st->timings, st->failures);
  fmt::print("binaries   {} ({})\n", st->binaries, human_bytes(double(st->binary_bytes)));
  for (const auto& [arch, n] : st->binaries_by_arch) fmt::print("  {:<8} {}\n", arch, n);
  fmt::print("stale      {} (made with another toolchain; re-measured when needed)\n", st->stale);
  fmt::print("invalid    {} (fail their checks; replaced when re-written, dropped by prune)\n", st->invalid);
  fmt::print("staged     {} batches waiting for the writer\n", st->staged_batches);
  fmt::print("on disk    {}\n", human_bytes(double(st->disk_bytes)));
  if (!remote.is_null()) print_remote_stats(remote);
  if (!remote_ok) throw ExitCode(1);
}

void run_ls(const CacheArgs& a) {
  if (a.kind != "decisions" && a.kind != "timings" && a.kind != "binaries" && a.kind != "all") {
    fail("ls", make_error(ErrorCode::kInvalidArgument, "--kind is decisions, timings, binaries or all"), 2);
  }
  auto store = open_store(a, cache::Role::kReader, "ls");
  const bool all = a.kind == "all";
  nlohmann::json out = nlohmann::json::array();
  size_t listed = 0;
  // Each entry once, as a line or a JSON object.
  auto emit = [&](nlohmann::json entry, const std::string& line) {
    ++listed;
    if (a.json) out.push_back(std::move(entry));
    else fmt::print("{}\n", line);
  };
  if (a.kind == "decisions" || all) {
    for (const auto& d : store->decisions(a.prefix)) {
      std::string params;
      for (const auto& [k, v] : d->params) params += fmt::format("{}{}={}", params.empty() ? "" : ",", k, v);
      emit({{"kind", "decision"}, {"problem", d->problem}, {"choice", d->choice}, {"median_us", d->median_us},
            {"params", d->params}, {"kernel", d->kernel ? nlohmann::json(d->kernel->hex()) : nlohmann::json()},
            {"decided_at_ns", d->decided_at_ns}},
           fmt::format("decision  {}\n          -> {} {:.2f} us{}{} ({})", d->problem, d->choice, d->median_us,
                       params.empty() ? "" : " [" + params + "]", d->kernel ? " kernel " + d->kernel->hex() : "",
                       age(d->decided_at_ns)));
    }
  }
  if (a.kind == "timings" || all) {
    for (const auto& t : store->all_timings()) {
      if (t.problem.compare(0, a.prefix.size(), a.prefix) != 0) continue;
      nlohmann::json j{{"kind", t.ok ? "timing" : "failure"}, {"problem", t.problem}, {"choice", t.choice}};
      if (t.ok) {
        j.update({{"median_us", t.median_us}, {"min_us", t.min_us}, {"p90_us", t.p90_us}, {"samples", t.samples}});
        emit(std::move(j), fmt::format("timing    {} | {}: {:.2f} us (min {:.2f}, p90 {:.2f}, n={})", t.problem,
                                       t.choice, t.median_us, t.min_us, t.p90_us, t.samples));
      } else {
        j["reason"] = t.reason;
        emit(std::move(j), fmt::format("failure   {} | {}: {}", t.problem, t.choice, t.reason));
      }
    }
  }
  uint64_t invalid = 0;
  if (a.kind == "binaries" || all) {
    auto bad = store->for_each_binary([&](const cache::BinaryInfo& b) {
      emit({{"kind", "binary"}, {"key", b.key.hex()}, {"arch", b.arch}, {"name", b.name},
            {"nvrtc", fmt::format("{}.{}", b.nvrtc_major, b.nvrtc_minor)}, {"cubin_bytes", b.cubin_bytes},
            {"created_at_ns", b.created_at_ns}, {"used_at_ns", b.used_at_ns}},
           fmt::format("binary    {} {:<8} NVRTC {}.{} {:>10} {} ({}, used {})", b.key.hex(), b.arch, b.nvrtc_major,
                       b.nvrtc_minor, human_bytes(double(b.cubin_bytes)), b.name, age(b.created_at_ns),
                       age(b.used_at_ns)));
      return true;
    });
    if (!bad.ok()) fail("ls", bad.status());
    invalid = *bad;
  }
  if (a.json) {
    fmt::print("{}\n", out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
    return;
  }
  if (invalid) fmt::print("({} binaries fail their checks)\n", invalid);
  if (listed == 0) {
    // An empty listing must not read as an empty cache: say what the other kinds hold.
    auto st = store->stats();
    if (st.ok()) {
      fmt::print("no {}{} in {} (it holds {} decisions, {} timings, {} failures, {} binaries; --kind all lists "
                 "everything)\n",
                 all ? "entries" : a.kind, a.prefix.empty() ? "" : " under '" + a.prefix + "'", st->dir, st->decisions,
                 st->timings, st->failures, st->binaries);
    }
  }
}

void run_export(const CacheArgs& a) {
  cache::ExportOptions o;
  o.binaries = a.binaries;
  o.prefix = a.prefix;
  if (!a.sign_key.empty()) {
    auto key = cache::SigningKey::load(a.sign_key);
    if (!key.ok()) fail("export", key.status(), 2);
    o.sign_with = std::move(key).value();
  }
  auto store = open_store(a, cache::Role::kReader, "export");
  auto n = cache::export_bundle(*store, a.file, o);
  if (!n.ok()) fail("export", n.status());
  fmt::print("exported {} decisions, {} timings, {} binaries to {}{}\n", n->decisions, n->timings, n->binaries, a.file,
             o.sign_with ? fmt::format(" (signed with key {})", o.sign_with->id()) : std::string(" (unsigned)"));
}

cache::ImportOptions import_options(const CacheArgs& a) {
  cache::ImportOptions o;
  o.trust_unsigned = a.trust_unsigned;
  for (const auto& f : a.trust_keys) {
    auto key = cache::SigningKey::load(f);
    if (!key.ok()) fail("import", key.status(), 2);
    o.trusted_keys.push_back(std::move(key).value());
  }
  return o;
}

// What the signature check decided, on stderr when binaries were left out. Returns whether the bundle failed
// its check (a signature that does not match its content).
bool report_trust(const cache::ImportReport& r) {
  if (r.binaries_skipped == 0 && r.signature_valid) return false;
  fmt::print(stderr, "kiln cache import: the bundle is {}: {} binaries not imported (decisions and timings were). "
                     "Pass --trust-key FILE with the key it was signed with{}\n",
             r.signature, r.binaries_skipped, r.signature == "unsigned" ? ", or --trust-unsigned" : "");
  return !r.signature_valid;
}

void run_import(const CacheArgs& a) {
  cache::ImportOptions options = import_options(a);
  auto store = open_store(a, cache::Role::kAuto, "import");
  auto r = cache::import_bundle(*store, a.file, options);
  if (!r.ok()) fail("import", r.status());
  if (auto s = store->sync(); !s.ok()) fail("import", s);
  fmt::print("imported {} decisions, {} timings, {} binaries from {}{}\n", r->imported.decisions, r->imported.timings,
             r->imported.binaries, a.file, store->is_writer() ? "" : " (staged for the process that writes the cache)");
  if (r->other_toolchain) {
    fmt::print("{} of them were made with another toolchain than {}: stored, but not used here\n", r->other_toolchain,
               store->toolchain().str());
  }
  bool forged = report_trust(*r);
  if (r->rejected) {
    fmt::print(stderr, "rejected {} entries that failed verification:\n", r->rejected);
    for (const auto& e : r->errors) fmt::print(stderr, "  {}\n", e);
    throw ExitCode(1);
  }
  if (forged) throw ExitCode(1);
}

// Exit 0 when the cache verifies, 1 when it is damaged or has bad entries (each named), 2 when there is none.
void run_verify(const CacheArgs& a) {
  auto r = cache::verify_cache(a.dir);
  if (!r.ok()) fail("verify", r.status(), r.status().code() == ErrorCode::kNotFound ? 2 : 1);
  for (const auto& d : r->damage) fmt::print(stderr, "damage: {}\n", d);
  for (const auto& e : r->errors) fmt::print(stderr, "bad entry: {}\n", e);
  fmt::print("checked {} entries in {}: {} bad, {}\n", r->checked, r->dir, r->bad,
             r->damage.empty() ? "no damage" : fmt::format("{} damaged files (run `kiln cache repair`)", r->damage.size()));
  if (!r->ok()) throw ExitCode(1);
}

void run_repair(const CacheArgs& a) {
  auto r = cache::repair_cache(a.dir);
  if (!r.ok()) fail("repair", r.status());
  fmt::print("copied the database as it was to {}\n", r->backup);
  for (const auto& f : r->set_aside) fmt::print("set aside (unusable): {}\n", f);
  fmt::print("repaired: {} entries, {} bad, {}\n", r->after.checked, r->after.bad,
             r->after.damage.empty() ? "no damage left" : r->after.damage.front());
  if (!r->after.ok()) throw ExitCode(1);
}

void run_prune(const CacheArgs& a) {
  cache::PruneOptions o;
  if (!a.max_size.empty()) {
    auto v = parse_size(a.max_size);
    if (!v.ok()) fail("prune", v.status(), 2);
    o.max_binary_bytes = *v;
  }
  if (!a.older_than.empty()) {
    auto v = parse_age(a.older_than);
    if (!v.ok()) fail("prune", v.status(), 2);
    o.older_than = *v;
  }
  o.arch = a.arch;
  o.other_toolchains = a.other_toolchains;
  o.dry_run = a.dry_run;
  auto store = open_store(a, cache::Role::kWriter, "prune");
  auto r = store->prune(o);
  if (!r.ok()) fail("prune", r.status());
  fmt::print("{} {} binaries ({}), {} timings, {} decisions, {} invalid entries\n", a.dry_run ? "would drop" : "dropped",
             r->binaries, human_bytes(double(r->binary_bytes)), r->timings, r->decisions, r->invalid);
}

void run_clear(const CacheArgs& a) {
  if (!a.yes) {
    fmt::print(stderr, "kiln cache clear: drops every entry of the cache; run again with --yes\n");
    throw ExitCode(2);
  }
  auto store = open_store(a, cache::Role::kWriter, "clear");
  if (auto s = store->clear(); !s.ok()) fail("clear", s);
  fmt::print("cleared {}\n", store->dir());
}

template <class DirOption>
void add_integrity_commands(CLI::App& g, const std::shared_ptr<CacheArgs>& args, const DirOption& dir_option) {
  auto* verify = g.add_subcommand("verify", "Check every table block, log record and entry; exit 1 on damage");
  dir_option(verify);
  verify->callback([args] { run_verify(*args); });
  auto* repair = g.add_subcommand("repair", "Copy the database into quarantine/, then rebuild it from what is intact");
  dir_option(repair);
  repair->callback([args] { run_repair(*args); });
}

void add_cache_commands(CLI::App& root) {
  auto args = std::make_shared<CacheArgs>();
  CLI::App& g = group(root, "cache", "Inspect and maintain the kernel cache (binaries, timings, decisions)");
  auto dir_option = [&](CLI::App* c) { add_cache_dir_option(c, args->dir); };
  auto* stats = g.add_subcommand("stats", "Count decisions, timings, failures and binaries; size on disk");
  dir_option(stats);
  stats->add_flag("--json", args->json, "Print the counts as JSON");
  add_remote_options(stats, args->remote, "Also show the fleet's remote cache");
  stats->callback([args] { run_stats(*args); });

  auto* ls = g.add_subcommand("ls", "List entries");
  dir_option(ls);
  ls->add_option("--kind", args->kind, "decisions (default), timings, binaries or all");
  ls->add_option("--prefix", args->prefix, "Only problems whose canonical key starts with this");
  ls->add_flag("--json", args->json, "Print the entries as a JSON list");
  ls->callback([args] { run_ls(*args); });

  auto* exp = g.add_subcommand("export", "Write a portable bundle (JSON) of decisions and timings");
  dir_option(exp);
  exp->add_option("file", args->file, "The bundle to write")->required();
  exp->add_flag("--binaries", args->binaries, "Include the cubins (base64)");
  exp->add_option("--prefix", args->prefix, "Only problems whose canonical key starts with this");
  exp->add_option("--sign-key", args->sign_key, "Sign the bundle with the key in this file (HMAC-SHA256; mode 600)");
  exp->callback([args] { run_export(*args); });

  auto* imp = g.add_subcommand("import", "Verify every entry of a bundle and store those that pass");
  dir_option(imp);
  imp->add_option("file", args->file, "The bundle to read")->required();
  imp->add_option("--trust-key", args->trust_keys, "Import binaries when the bundle is signed with the key in this file "
                                                   "(repeatable)");
  imp->add_flag("--trust-unsigned", args->trust_unsigned, "Import the binaries of an unsigned bundle too");
  imp->callback([args] { run_import(*args); });

  add_integrity_commands(g, args, dir_option);

  auto* prune = g.add_subcommand("prune", "Drop entries: least recently used, old, for an arch or another toolchain");
  dir_option(prune);
  prune->add_option("--max-size", args->max_size, "Keep binaries under this size, least recently used go first (512M, 2G)");
  prune->add_option("--older-than", args->older_than, "Drop what was not used or measured within this long (30d, 12h)");
  prune->add_option("--arch", args->arch, "Drop binaries built for this arch (sm_80)");
  prune->add_flag("--other-toolchains", args->other_toolchains, "Drop everything made with another NVRTC/driver/kiln");
  prune->add_flag("--dry-run", args->dry_run, "Only report what would be dropped");
  prune->callback([args] { run_prune(*args); });

  auto* clear = g.add_subcommand("clear", "Drop every entry");
  dir_option(clear);
  clear->add_flag("--yes", args->yes, "Really clear");
  clear->callback([args] { run_clear(*args); });
}

}  // namespace

KILN_REGISTER_COMMAND(add_cache_commands);

}  // namespace kiln::cli
