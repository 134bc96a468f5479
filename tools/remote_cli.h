// The options every command that talks to the fleet's remote cache shares (--remote, --key-file,
// --allow-unsigned-binaries), and opening the tier from them or from the environment.
#pragma once

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <memory>
#include <string>

#include "kiln/cache/remote.h"

namespace kiln::cli {

struct RemoteArgs {
  std::string url;
  std::string key_file;
  bool allow_unsigned = false;
};

inline void add_remote_options(CLI::App* cmd, RemoteArgs& r, const char* what = "the fleet's remote cache") {
  cmd->add_option("--remote", r.url, fmt::format("{}: redis://[user:password@]host:port/db or unix:///path "
                                                 "(default $KILN_REMOTE_CACHE)", what));
  cmd->add_option("--key-file", r.key_file, "The fleet key that signs and verifies remote values (default "
                                            "$KILN_CACHE_KEY_FILE; mode 600)");
  cmd->add_flag("--allow-unsigned-binaries", r.allow_unsigned,
                "Without a key, send and accept unsigned binaries (a trusted private network only)");
}

/// The tier the flags (else the environment) name; null when neither names one. `write_behind` false: a
/// read-only tier (the command publishes with push()).
inline Result<std::shared_ptr<cache::RedisTier>> open_remote(const RemoteArgs& r, bool write_behind = true) {
  KILN_ASSIGN_OR_RETURN(auto env, cache::RemoteOptions::from_env(r.url));
  if (!env) return std::shared_ptr<cache::RedisTier>();
  cache::RemoteOptions o = std::move(*env);
  if (!r.key_file.empty()) o.key_file = r.key_file;
  if (r.allow_unsigned) o.allow_unsigned_binaries = true;
  o.write_behind = write_behind;
  KILN_ASSIGN_OR_RETURN(auto tier, cache::RedisTier::open(std::move(o)));
  return tier;
}

/// One line for the end of a run: what the remote did for it, and what went wrong, plainly.
inline std::string remote_summary_line(const cache::RedisTier& tier) {
  const cache::RemoteCounters c = tier.counters();
  std::string line = fmt::format("remote cache {}: {} hits, {} misses, {} refused, {} published, {} queue drops, "
                                 "{} not published, breaker {}",
                                 tier.describe(), c.hits, c.misses, c.refused, c.published, c.queue_drops,
                                 c.write_errors, c.breaker);
  if (c.errors + c.skipped + c.write_errors + c.queue_drops + c.refused > 0 && !c.last_error.empty()) {
    line += fmt::format("\n  last problem: {} (kiln ran from its local cache where the remote failed)", c.last_error);
  }
  return line;
}

}  // namespace kiln::cli
