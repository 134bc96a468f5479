// kiln cache stats|ls|export|import|prune|clear|verify|repair: look after the cache folder (see docs/cache.md,
// docs/reliability.md).
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <ctime>

#include "commands.h"
#include "kiln/cache/cache.h"

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

// "512M", "2G", "1048576" -> bytes.
Result<uint64_t> parse_size(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string unit(end);
  double mult = unit.empty() || unit == "B" ? 1 : unit == "K" || unit == "KiB" ? 1024.0
              : unit == "M" || unit == "MiB" ? 1048576.0 : unit == "G" || unit == "GiB" ? 1073741824.0 : -1;
  if (end == s.c_str() || mult < 0 || v < 0) return make_error(ErrorCode::kInvalidArgument, fmt::format("bad size '{}' (e.g. 512M, 2G)", s));
  return static_cast<uint64_t>(v * mult);
}

// "30d", "12h", "90m", "3600" (seconds) -> seconds.
Result<std::chrono::seconds> parse_age(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string unit(end);
  double mult = unit.empty() || unit == "s" ? 1 : unit == "m" ? 60 : unit == "h" ? 3600 : unit == "d" ? 86400 : -1;
  if (end == s.c_str() || mult < 0 || v <= 0) return make_error(ErrorCode::kInvalidArgument, fmt::format("bad age '{}' (e.g. 30d, 12h)", s));
  return std::chrono::seconds(static_cast<int64_t>(v * mult));
}

void run_stats(const CacheArgs& a) {
  auto store = open_store(a, cache::Role::kReader, "stats");
  auto st = store->stats();
  if (!st.ok()) fail("stats", st.status());
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
}

void run_ls(const CacheArgs& a) {
  auto store = open_store(a, cache::Role::kReader, "ls");
  if (a.kind == "decisions" || a.kind == "all") {
    for (const auto& d : store->decisions(a.prefix)) {
      std::string params;
      for (const auto& [k, v] : d->params) params += fmt::format("{}{}={}", params.empty() ? "" : ",", k, v);
      fmt::print("decision  {}\n          -> {} {:.2f} us{}{} ({})\n", d->problem, d->choice, d->median_us,
                 params.empty() ? "" : " [" + params + "]", d->kernel ? " kernel " + d->kernel->hex() : "",
                 age(d->decided_at_ns));
    }
  }
  if (a.kind == "timings" || a.kind == "all") {
    for (const auto& t : store->all_timings()) {
      if (t.problem.compare(0, a.prefix.size(), a.prefix) != 0) continue;
      if (t.ok) {
        fmt::print("timing    {} | {}: {:.2f} us (min {:.2f}, p90 {:.2f}, n={})\n", t.problem, t.choice, t.median_us,
                   t.min_us, t.p90_us, t.samples);
      } else {
        fmt::print("failure   {} | {}: {}\n", t.problem, t.choice, t.reason);
      }
    }
  }
  if (a.kind == "binaries" || a.kind == "all") {
    auto invalid = store->for_each_binary([](const cache::BinaryInfo& b) {
      fmt::print("binary    {} {:<8} NVRTC {}.{} {:>10} {} ({}, used {})\n", b.key.hex(), b.arch, b.nvrtc_major,
                 b.nvrtc_minor, human_bytes(double(b.cubin_bytes)), b.name, age(b.created_at_ns), age(b.used_at_ns));
      return true;
    });
    if (!invalid.ok()) fail("ls", invalid.status());
    if (*invalid) fmt::print("({} binaries fail their checks)\n", *invalid);
  }
  if (a.kind != "decisions" && a.kind != "timings" && a.kind != "binaries" && a.kind != "all") {
    fail("ls", make_error(ErrorCode::kInvalidArgument, "--kind is decisions, timings, binaries or all"), 2);
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
  auto dir_option = [&](CLI::App* c) {
    c->add_option("--cache-dir", args->dir, "The cache folder (default: $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, "
                                            "else ~/.cache/kiln)");
  };
  auto* stats = g.add_subcommand("stats", "Count decisions, timings, failures and binaries; size on disk");
  dir_option(stats);
  stats->callback([args] { run_stats(*args); });

  auto* ls = g.add_subcommand("ls", "List entries");
  dir_option(ls);
  ls->add_option("--kind", args->kind, "decisions (default), timings, binaries or all");
  ls->add_option("--prefix", args->prefix, "Only problems whose canonical key starts with this");
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
