#include "kiln/runtime/builtin.h"

#include "builtin_ops.h"
#include "kiln/runtime/extern_choices.h"
#include "kiln/runtime/bench_worker.h"

namespace kiln::runtime {

OpRegistry& default_ops() {
  static OpRegistry* registry = [] {
    auto* r = new OpRegistry();  // used from any thread until exit, so never destroyed
    for (auto& def : detail::builtin_ops()) (void)r->add(std::move(def));
    return r;
  }();
  return *registry;
}

TuneServices default_services() {
  TuneServices s;
  s.ops = &default_ops();
  s.sandbox = make_isolation_sandbox;
  s.library_versions = cublas_version();
  return s;
}

Result<std::unique_ptr<Tuner>> make_tuner(TuneOptions options) {
  return Tuner::create(std::move(options), default_services());
}

}  // namespace kiln::runtime
