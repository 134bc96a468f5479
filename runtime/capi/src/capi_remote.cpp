// The C API's side of the fleet's remote cache (kiln/cache/remote.h): the remote options of a context, push and
// pull of a context's cache, and the remote's counters. Nothing here ever puts a key or a password in a message:
// the tier's own messages leave them out (RemoteUrl::display, SigningKey), and this file adds only field names.
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>

#include "capi_args.h"

using namespace kiln;

namespace kiln::capi {

Result<std::optional<cache::RemoteOptions>> remote_options(const char* url, const char* key_file, int allow_unsigned,
                                                           int connect_timeout_ms, int read_timeout_ms,
                                                           const std::string& what) {
  if (url != nullptr && *url == '\0') return std::optional<cache::RemoteOptions>();
  if (allow_unsigned != 0 && allow_unsigned != 1) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("{}allow_unsigned is {}: use 1 (allow) or 0 (the environment's)", what, allow_unsigned));
  }
  for (auto [name, ms] : {std::pair{"connect_timeout_ms", connect_timeout_ms}, std::pair{"read_timeout_ms", read_timeout_ms}}) {
    if (ms < 0 || ms > 600000) {
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("{}{} is {}: give milliseconds, 1 to 600000 (0: the default)", what, name, ms));
    }
  }
  KILN_ASSIGN_OR_RETURN(auto env, cache::RemoteOptions::from_env(str(url)));
  if (!env) return env;
  cache::RemoteOptions& o = *env;
  if (key_file != nullptr) o.key_file = key_file;  // "" clears the environment's
  if (allow_unsigned == 1) o.allow_unsigned_binaries = true;
  if (connect_timeout_ms > 0) o.connect_timeout = std::chrono::milliseconds(connect_timeout_ms);
  if (read_timeout_ms > 0) o.read_timeout = std::chrono::milliseconds(read_timeout_ms);
  return env;
}

}  // namespace kiln::capi

namespace {

// "closed", "open", "half-open" (RemoteCounters::breaker) as the C enum.
kiln_breaker_state breaker_of(const std::string& s) {
  if (s == "open") return KILN_BREAKER_OPEN;
  if (s == "half-open") return KILN_BREAKER_HALF_OPEN;
  return KILN_BREAKER_CLOSED;
}

template <size_t N>
void copy_text(char (&out)[N], const std::string& text) {
  std::snprintf(out, N, "%s", text.c_str());
}

// The tier a push or pull goes through: the one the options name (opened read-only for this call), else the
// context's.
Result<std::shared_ptr<cache::RedisTier>> sync_tier(const capi::Args& arg, kiln_context* ctx, const kiln_sync_options& o) {
  if (o.remote_cache != nullptr && *o.remote_cache != '\0') {
    KILN_ASSIGN_OR_RETURN(auto named, capi::remote_options(o.remote_cache, o.key_file, o.allow_unsigned, 0, 0, "options."));
    named->write_behind = false;
    return cache::RedisTier::open(std::move(*named));
  }
  if (o.allow_unsigned != 0 || o.key_file != nullptr) {
    return arg.bad("options.key_file and options.allow_unsigned go with options.remote_cache (the context's remote "
                   "keeps its own)");
  }
  if (!ctx->remote) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "no remote cache named: set kiln_sync_options.remote_cache, kiln_context_options.remote_cache or "
                      "$KILN_REMOTE_CACHE");
  }
  return ctx->remote;
}

Status sync(const capi::Args& arg, kiln_context* ctx, const kiln_sync_options* options, kiln_sync_report* report,
            bool is_push) {
  KILN_RETURN_IF_ERROR(arg.given(ctx, "ctx"));
  if (report != nullptr) KILN_RETURN_IF_ERROR(capi::check_out_struct(report, arg.fn(), "report"));
  kiln_sync_options o;
  kiln_sync_options_init(&o);
  if (options != nullptr) {
    KILN_ASSIGN_OR_RETURN(o, capi::read_struct(options, kiln_sync_options_init, "options"));
  }
  if (o.decisions_only != 0 && o.decisions_only != 1) {
    return arg.bad(fmt::format("options.decisions_only is {}: use 0 or 1", o.decisions_only));
  }
  cache::SyncOptions so;
  so.decisions_only = o.decisions_only == 1;
  if (o.arch != nullptr && *o.arch != '\0') {
    KILN_RETURN_IF_ERROR(Target::parse(o.arch).status().with_context("options.arch"));
    so.arch = o.arch;
  }
  cache::Store* store = ctx->cache->store();
  if (store == nullptr) return make_error(ErrorCode::kFailedPrecondition, "this context has no cache (tune mode off)");
  KILN_ASSIGN_OR_RETURN(auto tier, sync_tier(arg, ctx, o));
  KILN_ASSIGN_OR_RETURN(cache::SyncReport r,
                        (is_push ? cache::push(*store, *tier, so) : cache::pull(*store, *tier, so))
                            .with_context(fmt::format("{} {}", is_push ? "pushing to" : "pulling from", tier->describe())));
  if (!is_push) {
    KILN_RETURN_IF_ERROR(store->sync());
    KILN_RETURN_IF_ERROR(store->first_write_error().with_context("storing what was pulled"));
  }
  if (report != nullptr) {
    kiln_sync_report out{};
    out.decisions = r.decisions;
    out.timings = r.timings;
    out.binaries = r.binaries;
    out.refused = r.refused;
    out.withheld = r.withheld;
    out.failed = r.failed;
    capi::write_struct(report, out);
  }
  return Status();
}

}  // namespace

extern "C" {

KILN_API void kiln_sync_options_init(kiln_sync_options* options) { (void)capi::init_struct(options); }

KILN_API kiln_status kiln_cache_push(kiln_context* ctx, const kiln_sync_options* options, kiln_sync_report* report) {
  return capi::entry("kiln_cache_push",
                     [&](const capi::Args& arg) { return sync(arg, ctx, options, report, true); });
}

KILN_API kiln_status kiln_cache_pull(kiln_context* ctx, const kiln_sync_options* options, kiln_sync_report* report) {
  return capi::entry("kiln_cache_pull",
                     [&](const capi::Args& arg) { return sync(arg, ctx, options, report, false); });
}

KILN_API kiln_status kiln_cache_remote_stats(kiln_context* ctx, kiln_remote_stats* stats) {
  return capi::entry("kiln_cache_remote_stats", [&](const capi::Args& arg) -> Status {
    KILN_RETURN_IF_ERROR(arg.given(ctx, "ctx"));
    KILN_RETURN_IF_ERROR(capi::check_out_struct(stats, arg.fn(), "stats"));
    kiln_remote_stats out{};
    if (ctx->remote) {
      const cache::RemoteCounters c = ctx->remote->counters();
      out.configured = 1;
      out.signing = ctx->remote->signing() ? 1 : 0;
      out.hits = c.hits;
      out.misses = c.misses;
      out.refused = c.refused;
      out.refused_unsigned = c.refused_unsigned;
      out.refused_signature = c.refused_signature;
      out.refused_malformed = c.refused_malformed;
      out.errors = c.errors;
      out.skipped = c.skipped;
      out.queued = c.queued;
      out.published = c.published;
      out.queue_drops = c.queue_drops;
      out.write_errors = c.write_errors;
      out.withheld = c.withheld;
      out.breaker_opened = c.breaker_opened;
      out.breaker = breaker_of(c.breaker);
      copy_text(out.remote, ctx->remote->describe());
      copy_text(out.last_error, c.last_error);
    }
    capi::write_struct(stats, out);
    return Status();
  });
}

}  // extern "C"
