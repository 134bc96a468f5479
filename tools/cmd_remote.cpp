// kiln cache push|pull: move a cache's decisions, timings and binaries to and from the fleet's remote cache
// (docs/fleet.md). Explicit commands: an unreachable remote, a refused value or an entry not written is an
// error here (exit 1), where a tune just carries on locally.
#include <fmt/format.h>

#include "commands.h"
#include "kiln/cache/cache.h"
#include "kiln/cache/remote.h"
#include "remote_cli.h"

namespace kiln::cli {
namespace {

struct SyncArgs {
  std::string dir;
  RemoteArgs remote;
  bool decisions_only = false;
  std::string arch;
};

int report_errors(const char* what, const cache::SyncReport& r) {
  for (const auto& e : r.errors) fmt::print(stderr, "  {}\n", e);
  if (r.withheld) {
    fmt::print(stderr, "kiln cache {}: {} binaries not sent: no fleet key (--key-file or KILN_CACHE_KEY_FILE), and "
                       "unsigned binaries are not allowed\n", what, r.withheld);
  }
  if (r.refused) {
    fmt::print(stderr, "kiln cache {}: {} values refused (unsigned, signed with another key, or damaged); none of "
                       "them was stored\n", what, r.refused);
  }
  if (r.failed) fmt::print(stderr, "kiln cache {}: {} entries not written\n", what, r.failed);
  return r.withheld || r.refused || r.failed ? 1 : 0;
}

int run_sync(const SyncArgs& a, bool is_push) {
  const char* what = is_push ? "push" : "pull";
  auto tier = open_remote(a.remote, false);
  if (!tier.ok() || !*tier) {
    fmt::print(stderr, "kiln cache {}: {}\n", what,
               tier.ok() ? "no remote cache named (--remote URL or KILN_REMOTE_CACHE)" : tier.status().to_string());
    return 2;
  }
  cache::StoreOptions o;
  o.dir = a.dir;
  o.role = is_push ? cache::Role::kReader : cache::Role::kAuto;
  o.ingest_interval = std::chrono::milliseconds(0);
  auto store = cache::Store::open(o);
  if (!store.ok()) {
    fmt::print(stderr, "kiln cache {}: {}\n", what, store.status().to_string());
    return 1;
  }
  cache::SyncOptions s;
  s.decisions_only = a.decisions_only;
  s.arch = a.arch;
  auto r = is_push ? cache::push(**store, **tier, s) : cache::pull(**store, **tier, s);
  if (!r.ok()) {
    fmt::print(stderr, "kiln cache {}: {} (the local cache is unchanged{})\n", what, r.status().to_string(),
               is_push ? "" : " apart from what was pulled before");
    return 1;
  }
  if (!is_push) {
    if (Status st = (*store)->sync(); !st.ok()) {
      fmt::print(stderr, "kiln cache pull: {}\n", st.to_string());
      return 1;
    }
    if (Status st = (*store)->first_write_error(); !st.ok()) {
      fmt::print(stderr, "kiln cache pull: storing locally failed: {}\n", st.to_string());
      return 1;
    }
  }
  fmt::print("{} {} {}: {} decisions, {} timings, {} binaries{}\n", is_push ? "pushed" : "pulled",
             is_push ? "to" : "from", (*tier)->describe(), r->decisions, r->timings, r->binaries,
             (*tier)->signing() ? " (signed)" : " (no fleet key: unsigned)");
  return report_errors(what, *r);
}

void add_remote_commands(CLI::App& root) {
  CLI::App& g = group(root, "cache", "Inspect and maintain the kernel cache (binaries, timings, decisions)");
  for (bool is_push : {true, false}) {
    auto args = std::make_shared<SyncArgs>();
    auto* cmd = g.add_subcommand(is_push ? "push" : "pull",
                                 is_push ? "Publish this cache's decisions, timings and binaries to the remote cache"
                                         : "Fetch, verify and store what the remote cache holds");
    add_cache_dir_option(cmd, args->dir);
    add_remote_options(cmd, args->remote);
    cmd->add_flag("--decisions-only", args->decisions_only, "Decisions only (no timings, no binaries)");
    cmd->add_option("--arch", args->arch, "Only binaries for this arch, and problems of its compute capability (sm_90a)");
    on_run(cmd, args, [is_push](const SyncArgs& a) { return run_sync(a, is_push); });
  }
}

}  // namespace

KILN_REGISTER_COMMAND(add_remote_commands);

}  // namespace kiln::cli
