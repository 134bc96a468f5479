// kiln.cache.push / pull and the remote part of kiln.cache.stats: the fleet's remote cache (kiln/cache/remote.h)
// from Python. Calls that reach Redis run without the GIL. An unreachable remote raises (push, pull: a command
// asked for explicitly fails loudly) or is reported (stats); no message carries a key or a password.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "errors.h"
#include "kiln/cache/remote.h"
#include "kiln/jit/target.h"
#include "text.h"
#include "tuner.h"

namespace nb = nanobind;

namespace kiln::py {

/// A tier's counters in this process, as Tuner.stats()["remote"] and kiln.cache.stats()["remote"]["process"]
/// show them.
nb::dict remote_counters(const cache::RedisTier& tier) {
  const cache::RemoteCounters c = tier.counters();
  nb::dict d;
  d["remote"] = tier.describe(), d["signing"] = tier.signing();
  d["hits"] = c.hits, d["misses"] = c.misses, d["refused"] = c.refused;
  d["refused_unsigned"] = c.refused_unsigned, d["refused_signature"] = c.refused_signature;
  d["refused_malformed"] = c.refused_malformed, d["errors"] = c.errors, d["skipped"] = c.skipped;
  d["queued"] = c.queued, d["published"] = c.published, d["queue_drops"] = c.queue_drops;
  d["write_errors"] = c.write_errors, d["withheld"] = c.withheld, d["breaker_opened"] = c.breaker_opened;
  d["breaker"] = c.breaker, d["last_error"] = c.last_error;
  return d;
}

namespace {

template <class F>
auto without_gil(F&& f) {
  nb::gil_scoped_release release;
  return f();
}

// The process's tier for what the caller named; kFailedPrecondition when nothing (nor the environment) names
// one.
Result<std::shared_ptr<cache::RedisTier>> named_tier(const std::optional<std::string>& remote,
                                                     const std::optional<std::string>& key_file, bool allow_unsigned) {
  KILN_ASSIGN_OR_RETURN(auto o, remote_options(remote, key_file, allow_unsigned));
  if (!o) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "no remote cache named: pass remote='redis://host:port/db' or set $KILN_REMOTE_CACHE");
  }
  return shared_remote(*o);
}

nb::dict sync(bool is_push, const std::optional<std::string>& remote, const std::string& cache_dir,
              const std::optional<std::string>& key_file, bool allow_unsigned, bool decisions_only,
              const std::string& arch) {
  struct Out {
    cache::SyncReport report;
    std::string where;
    bool signing = false;
  };
  auto r = without_gil([&]() -> Result<Out> {
    cache::SyncOptions so;
    so.decisions_only = decisions_only;
    if (!arch.empty()) {
      KILN_RETURN_IF_ERROR(Target::parse(arch).status().with_context("arch"));
      so.arch = arch;
    }
    KILN_ASSIGN_OR_RETURN(auto tier, named_tier(remote, key_file, allow_unsigned));
    KILN_ASSIGN_OR_RETURN(auto store, shared_store(cache_dir));
    Out out;
    out.where = tier->describe();
    out.signing = tier->signing();
    KILN_ASSIGN_OR_RETURN(out.report, (is_push ? cache::push(*store, *tier, so) : cache::pull(*store, *tier, so))
                                          .with_context(strf("{} {}", is_push ? "pushing to" : "pulling from", out.where)));
    if (!is_push) {
      KILN_RETURN_IF_ERROR(store->sync());
      KILN_RETURN_IF_ERROR(store->first_write_error().with_context("storing what was pulled"));
    }
    return out;
  });
  Out o = unwrap(std::move(r));
  nb::dict d;
  d["decisions"] = o.report.decisions, d["timings"] = o.report.timings, d["binaries"] = o.report.binaries;
  d["refused"] = o.report.refused, d["withheld"] = o.report.withheld, d["failed"] = o.report.failed;
  d["errors"] = o.report.errors, d["remote"] = o.where, d["signing"] = o.signing;
  return d;
}

// What the remote holds and its fleet-wide counters, with this process's; None when no remote is named. An
// unreachable remote is reported (reachable False, error), not raised: statistics are for looking.
nb::object remote_stats(const std::optional<std::string>& remote, const std::optional<std::string>& key_file,
                        bool allow_unsigned) {
  auto o = unwrap(remote_options(remote, key_file, allow_unsigned));
  if (!o) return nb::none();
  auto tier = unwrap(without_gil([&] { return shared_remote(*o); }));
  auto s = without_gil([&] { return cache::summarize(*tier); });
  nb::dict d;
  d["url"] = tier->describe(), d["signing"] = tier->signing(), d["reachable"] = s.ok();
  if (s.ok()) {
    d["binaries"] = s->binaries, d["decisions"] = s->decisions, d["timing_problems"] = s->timing_problems;
    d["used_memory"] = s->used_memory, d["max_memory"] = s->max_memory, d["eviction_policy"] = s->eviction_policy;
    nb::dict fleet;
    for (const auto& [name, n] : s->fleet_counters) fleet[name.c_str()] = n;
    d["fleet"] = fleet;
  } else {
    d["error"] = s.status().to_string();
  }
  d["process"] = remote_counters(*tier);
  return d;
}

}  // namespace

void bind_remote(nb::module_& m) {
  for (bool is_push : {true, false}) {
    m.def(is_push ? "_cache_push" : "_cache_pull",
          [is_push](std::optional<std::string> remote, std::string cache_dir, std::optional<std::string> key_file,
                    bool allow_unsigned, bool decisions_only, std::string arch) {
            return sync(is_push, remote, cache_dir, key_file, allow_unsigned, decisions_only, arch);
          },
          nb::arg("remote").none(), nb::arg("cache_dir"), nb::arg("key_file").none(), nb::arg("allow_unsigned"),
          nb::arg("decisions_only"), nb::arg("arch"));
  }
  m.def("_cache_remote_stats", &remote_stats, nb::arg("remote").none(), nb::arg("key_file").none(),
        nb::arg("allow_unsigned"));
}

}  // namespace kiln::py
