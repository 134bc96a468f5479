// kiln.Tuner and the current tuner, kiln.warmup, kiln.precompile and kiln.cache: the bindings around
// tuner.h and kiln's cache. Every long call (tuning, compiling, loading, cache I/O) runs without the GIL.
#include "text.h"
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>

#include "errors.h"
#include "kiln/cache/bundle.h"
#include "kiln/cache/cache.h"
#include "kiln/cache/signing.h"
#include "kiln/pool/gate.h"
#include "kiln/runtime/builtin.h"
#include "kiln/runtime/workload.h"
#include "tuner.h"

namespace nb = nanobind;

namespace kiln::py {

nb::dict remote_counters(const cache::RedisTier& tier);  // remote.cpp
void bind_remote(nb::module_& m);

namespace {

std::mutex current_mu;
std::vector<std::shared_ptr<PyTuner>> stack;  // `with Tuner(...)`, innermost last
std::shared_ptr<PyTuner> default_tuner;

std::shared_ptr<PyTuner> make(TunerOptions o) {
  auto t = PyTuner::create(std::move(o));
  if (!t.ok()) raise(t.status());
  return *t;
}

template <class F>
auto without_gil(F&& f) {
  nb::gil_scoped_release release;
  return f();
}

runtime::Workload workload_of(const std::string& text) {
  auto w = without_gil([&] { return runtime::parse_workload(text); });
  return unwrap(std::move(w));
}

nb::dict report_dict(const WarmupReport& r) {
  nb::dict d;
  d["problems"] = r.problems, d["ready"] = r.ready, d["from_cached_decision"] = r.from_cached_decision;
  d["tuned"] = r.tuned, d["compiled"] = r.compiled, d["skipped"] = r.skipped, d["failed"] = r.failed;
  d["seconds"] = r.seconds, d["errors"] = r.errors;
  d["open_seconds"] = r.open_seconds, d["fetch_seconds"] = r.fetch_seconds, d["load_seconds"] = r.load_seconds;
  d["threads"] = r.threads, d["taken_by_calls"] = r.taken_by_calls;
  nb::list slowest;
  for (const auto& x : r.slowest) {
    nb::dict e;
    e["problem"] = x.problem, e["chosen"] = x.chosen, e["fetch_seconds"] = x.fetch_seconds;
    e["load_seconds"] = x.load_seconds;
    slowest.append(e);
  }
  d["slowest"] = slowest;
  return d;
}

std::vector<runtime::Problem> warmup_problems(PyTuner& tuner, const std::optional<std::string>& workload, int device) {
  if (workload) return workload_of(*workload).problems;
  return unwrap(without_gil([&] { return tuner.cached_problems(device); }));
}

nb::dict warmup(const std::shared_ptr<PyTuner>& tuner, std::optional<std::string> workload, int device, int threads) {
  std::vector<runtime::Problem> problems = warmup_problems(*tuner, workload, device);
  auto r = without_gil([&] { return tuner->warmup(problems, device, threads); });
  return report_dict(unwrap(std::move(r)));
}

nb::dict precompile(const std::string& workload, const std::string& arch, const std::string& cache_dir, int configs,
                    const std::string& executor) {
  runtime::Workload w = workload_of(workload);
  struct Out {
    int kernels = 0, cached = 0, failed = 0;
    uint64_t compiles = 0;
    std::vector<std::string> failures;
    double seconds = 0;
    std::string dir;
  };
  auto r = without_gil([&]() -> Result<Out> {
    auto start = std::chrono::steady_clock::now();
    KILN_ASSIGN_OR_RETURN(Target target, Target::parse(arch));
    KILN_ASSIGN_OR_RETURN(auto store, shared_store(cache_dir));
    auto cache = std::make_shared<cache::TuningCache>(cache::TuneMode::kTune, store);
    ExecutorOptions eo;
    if (!executor.empty()) {
      KILN_ASSIGN_OR_RETURN(eo.kind, parse_executor_kind(executor));
    }
    KILN_ASSIGN_OR_RETURN(auto exec, make_executor(eo));
    KILN_ASSIGN_OR_RETURN(auto gate, runtime::make_cached_gate(cache, exec));
    runtime::TuneOptions options;
    options.max_template_configs = configs;
    Out out;
    out.dir = store->dir();
    for (const auto& p : w.problems) {
      auto pr = runtime::precompile_problem(runtime::default_ops(), p, target, *gate, options);
      if (!pr.ok()) {
        out.failures.push_back(strf("{}: {}", p.describe(), pr.status().to_string()));
        continue;
      }
      out.kernels += pr->kernels, out.cached += pr->cached, out.failed += pr->failed;
      for (auto& f : pr->failures) out.failures.push_back(std::move(f));
    }
    KILN_RETURN_IF_ERROR(store->flush());
    out.compiles = gate->counters().compiles;
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return out;
  });
  Out o = unwrap(std::move(r));
  nb::dict d;
  d["problems"] = w.problems.size(), d["kernels"] = o.kernels, d["cached"] = o.cached, d["compiled"] = o.compiles;
  d["failed"] = o.failed, d["failures"] = o.failures, d["seconds"] = o.seconds, d["cache_dir"] = o.dir;
  d["arch"] = arch;
  return d;
}

nb::dict cache_stats(const std::string& dir) {
  auto st = without_gil([&]() -> Result<cache::StoreStats> {
    KILN_ASSIGN_OR_RETURN(auto store, shared_store(dir));
    return store->stats();
  });
  cache::StoreStats s = unwrap(std::move(st));
  nb::dict d, by_arch;
  d["dir"] = s.dir, d["writer"] = s.writer, d["binaries"] = s.binaries, d["binary_bytes"] = s.binary_bytes;
  d["timings"] = s.timings, d["failures"] = s.failures, d["decisions"] = s.decisions, d["stale"] = s.stale;
  d["invalid"] = s.invalid, d["disk_bytes"] = s.disk_bytes;
  for (const auto& [arch, n] : s.binaries_by_arch) by_arch[arch.c_str()] = n;
  d["binaries_by_arch"] = by_arch;
  return d;
}

nb::dict counts(const cache::BundleCounts& c) {
  nb::dict d;
  d["decisions"] = c.decisions, d["timings"] = c.timings, d["binaries"] = c.binaries;
  return d;
}

nb::dict cache_export(const std::string& path, const std::string& dir, bool binaries, const std::string& prefix,
                      const std::string& sign_key) {
  auto n = without_gil([&]() -> Result<cache::BundleCounts> {
    KILN_ASSIGN_OR_RETURN(auto store, shared_store(dir));
    cache::ExportOptions o{binaries, prefix, std::nullopt};
    if (!sign_key.empty()) {
      KILN_ASSIGN_OR_RETURN(o.sign_with, cache::SigningKey::load(sign_key));
    }
    return cache::export_bundle(*store, path, o);
  });
  return counts(unwrap(std::move(n)));
}

nb::dict cache_import(const std::string& path, const std::string& dir, const std::vector<std::string>& trusted_keys,
                      bool trust_unsigned) {
  auto r = without_gil([&]() -> Result<cache::ImportReport> {
    cache::ImportOptions o;
    o.trust_unsigned = trust_unsigned;
    for (const auto& k : trusted_keys) {
      KILN_ASSIGN_OR_RETURN(cache::SigningKey key, cache::SigningKey::load(k));
      o.trusted_keys.push_back(std::move(key));
    }
    KILN_ASSIGN_OR_RETURN(auto store, shared_store(dir));
    KILN_ASSIGN_OR_RETURN(auto report, cache::import_bundle(*store, path, o));
    KILN_RETURN_IF_ERROR(store->sync());
    return report;
  });
  cache::ImportReport rep = unwrap(std::move(r));
  nb::dict d = counts(rep.imported);
  d["rejected"] = rep.rejected, d["other_toolchain"] = rep.other_toolchain, d["errors"] = rep.errors;
  d["signature"] = rep.signature, d["binaries_trusted"] = rep.binaries_trusted;
  return d;
}

}  // namespace

std::shared_ptr<PyTuner> current_tuner() {
  std::lock_guard lock(current_mu);
  if (!stack.empty()) return stack.back();
  if (!default_tuner) {
    auto t = PyTuner::create({});
    if (!t.ok()) raise(t.status());
    default_tuner = *t;
  }
  return default_tuner;
}

void bind_api(nb::module_& m) {
  nb::class_<PyTuner>(m, "Tuner",
                      "Tuner(cache_dir=None, mode=None, executor=None, configs=0, remote=None, key_file=None,\n"
                      "      allow_unsigned=False)\n\n"
                      "Where kiln's ops get their kernels: a cache folder seen through a tune mode.\n"
                      "mode: 'tune' measures what the cache lacks; 'use' never measures (cached decision, else the\n"
                      "op's default choice); 'strict' never measures and a missing decision raises\n"
                      "kiln.NotFoundError; 'off' keeps results in memory. Default: $KILN_TUNE_MODE, else 'tune'.\n"
                      "cache_dir: default $KILN_CACHE_DIR, else ~/.cache/kiln. executor: 'inline', 'arena' or\n"
                      "'process' (kiln's default otherwise). configs: template configurations per template (0: the tune's effort's sample, as `kiln tune` and `kiln precompile`, so a cache they built serves this tuner without compiling).\n"
                      "remote: the fleet's remote cache behind the local one, 'redis://[user:password@]host:port/db'\n"
                      "or 'unix:///path?db=N' (default $KILN_REMOTE_CACHE; '' none): a local miss asks it, what this\n"
                      "tuner records is published to it, and a slow or dead remote costs bounded misses only.\n"
                      "key_file: the fleet key that signs and verifies (default $KILN_CACHE_KEY_FILE; '' none: then only\n"
                      "decisions and timings travel, unless allow_unsigned=True on a trusted network).\n\n"
                      "`with tuner:` makes it the one the ops use (process-wide, innermost wins).")
      .def(nb::new_([](std::optional<std::string> cache_dir, std::optional<std::string> mode,
                       std::optional<std::string> executor, int configs, std::optional<std::string> remote,
                       std::optional<std::string> key_file, bool allow_unsigned) {
             TunerOptions o{cache_dir.value_or(""), mode.value_or(""), executor.value_or(""), configs};
             o.remote = std::move(remote);
             o.key_file = std::move(key_file);
             o.allow_unsigned = allow_unsigned;
             return make(std::move(o));
           }),
           nb::arg("cache_dir").none() = nb::none(), nb::arg("mode").none() = nb::none(),
           nb::arg("executor").none() = nb::none(), nb::arg("configs") = 0, nb::kw_only(),
           nb::arg("remote").none() = nb::none(), nb::arg("key_file").none() = nb::none(),
           nb::arg("allow_unsigned") = false)
      .def_prop_ro("mode", [](const PyTuner& t) { return std::string(cache::tune_mode_name(t.mode())); })
      .def_prop_ro("cache_dir", &PyTuner::cache_dir)
      .def("stats", [](const PyTuner& t) {
        TunerStats s = t.stats();
        nb::dict d;
        d["hits"] = s.hits, d["misses"] = s.misses, d["tuned"] = s.tuned, d["compiled"] = t.compiles();
        d["capture_nearest"] = s.capture_nearest, d["capture_errors"] = s.capture_errors;
        d["remote"] = t.remote() ? nb::object(remote_counters(*t.remote())) : nb::none();
        return d;
      }, "Counters: hits (calls whose kernel was ready), misses (calls that resolved one), tuned (misses that\n"
         "measured), compiled (kernels compiled), capture_nearest / capture_errors (misses inside graph capture);\n"
         "remote: None, or this process's use of the remote cache (hits, misses, refused, errors, skipped,\n"
         "published, queue_drops, write_errors, withheld, breaker 'closed'/'open'/'half-open', last_error).")
      .def("reports", [](const PyTuner& t) {
        std::vector<std::string> out;
        for (const auto& r : t.reports()) out.push_back(r.json());
        return out;
      }, "Every tune's report as JSON text, in order.")
      .def("__enter__", [](std::shared_ptr<PyTuner> t) {
        std::lock_guard lock(current_mu);
        stack.push_back(t);
        return t;
      })
      .def("__exit__", [](std::shared_ptr<PyTuner> t, nb::args) {
        std::lock_guard lock(current_mu);
        for (auto it = stack.rbegin(); it != stack.rend(); ++it) {
          if (*it == t) {
            stack.erase(std::next(it).base());
            break;
          }
        }
        return false;
      })
      .def("__repr__", [](const PyTuner& t) {
        return strf("kiln.Tuner(cache_dir='{}', mode='{}')", t.cache_dir(), cache::tune_mode_name(t.mode()));
      })
      .def("_warmup", &warmup, nb::arg("workload").none(), nb::arg("device"), nb::arg("threads") = 0)
      .def("_start_warmup", [](const std::shared_ptr<PyTuner>& t, std::optional<std::string> workload, int device,
                               int threads) {
        std::vector<runtime::Problem> problems = warmup_problems(*t, workload, device);
        check(t->start_warmup(std::move(problems), device, threads));
      }, nb::arg("workload").none(), nb::arg("device"), nb::arg("threads") = 0)
      .def("_wait_warmup", [](PyTuner& t) {
        auto r = without_gil([&] { return t.wait_warmup(); });
        return report_dict(unwrap(std::move(r)));
      })
      .def("_warmup_done", &PyTuner::warmup_done);
  m.def("_set_default_tuner", [](std::shared_ptr<PyTuner> t) {
    std::lock_guard lock(current_mu);
    default_tuner = std::move(t);
  }, nb::arg("tuner").none());
  m.def("current_tuner", &current_tuner, "The Tuner the ops use now.");
  m.def("_precompile", &precompile, nb::arg("workload"), nb::arg("arch"), nb::arg("cache_dir"), nb::arg("configs"),
        nb::arg("executor"));
  // A workload file read as every kiln command reads one (kiln/input.h: $KILN_MAX_WORKLOAD_BYTES, /dev/zero or a
  // FIFO bounded); bytes, which the caller decodes.
  m.def("_read_workload_file", [](const std::string& path) {
    if (path.find('\0') != std::string::npos) {
      unwrap(Result<int>(make_error(ErrorCode::kInvalidArgument, "a workload path holds a NUL byte")));
    }
    auto r = without_gil([&] { return read_file_limited(path, runtime::kWorkloadBytesLimit); });
    std::string text = unwrap(std::move(r));
    return nb::bytes(text.data(), text.size());
  }, nb::arg("path"));
  m.def("_cache_stats", &cache_stats, nb::arg("cache_dir"));
  m.def("_cache_export", &cache_export, nb::arg("path"), nb::arg("cache_dir"), nb::arg("binaries"), nb::arg("prefix"),
        nb::arg("sign_key"));
  bind_remote(m);
  m.def("_cache_import", &cache_import, nb::arg("path"), nb::arg("cache_dir"), nb::arg("trusted_keys"),
        nb::arg("trust_unsigned"));
}

}  // namespace kiln::py
