// The all-reduce's choice catalogue: which configurations of kiln's templates exist (a deterministic sample
// per algorithm, rendered and compiled through the gate), the ranks' agreement on which of them loaded, and how
// one choice is launched: NCCL, NCCL's symmetric-memory all-reduce, or a template on the staging buffers.
#include <algorithm>
#include <limits>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "allreduce_impl.h"
#include "kiln/jit/driver.h"
#include "kiln/templates/registry.h"
#include "nccl_api.h"

namespace kiln::runtime {

using namespace detail;

Result<std::vector<TemplateChoice>> detail::render_choices(const std::string& name, const AllReduceOptions& o,
                                                           int world, const templates::DeviceLimits& limits,
                                                           const Target& target, PrecompileGate& gate) {
  KILN_ASSIGN_OR_RETURN(templates::TemplatePtr t, templates::find_template(name));
  const templates::ParamSpec* algo = t->param("algo");
  if (!algo) return make_error(ErrorCode::kInternal, name + " has no algo parameter");
  // A sample per algorithm: one sample over all of them gave the two-shot only a third of the configurations,
  // and none of its bandwidth-bound corner (vec 8, 128-256 blocks) at some seeds.
  std::vector<templates::Params> sampled;
  for (const templates::Value& a : algo->values) {
    templates::Params fixed{{"dtype", templates::Value::dtype(o.dtype)}, {"world", templates::Value::integer(world)},
                            {"algo", a}};
    KILN_ASSIGN_OR_RETURN(templates::Grid grid, templates::Grid::create(t, fixed));
    for (auto& p : templates::sample(grid, limits, static_cast<size_t>(std::max(1, o.max_configs)))) {
      sampled.push_back(std::move(p));
    }
  }
  std::vector<TemplateChoice> out;
  for (auto& p : sampled) {
    TemplateChoice c;
    c.tmpl = t;
    auto r = t->render(p);
    if (!r.ok()) {  // the sample is pruned already: a render error is a template bug the tests catch
      spdlog::warn("kiln: {} configuration not rendered: {}", name, r.status().to_string());
      continue;
    }
    c.name = r->config_name;
    c.params = r->params;
    c.push = templates::get_enum(c.params, "algo") == "push";
    c.push2 = templates::get_enum(c.params, "algo") == "push2";
    c.in_place = name != "allreduce" || templates::get_enum(c.params, "algo") != "oneshot";
    // The launch geometry does not depend on the sizes; ask with a shape every configuration can serve.
    const int64_t vec = templates::get_int(c.params, "vec");
    c.vec = vec;
    auto l = t->geometry(c.params, name == "allreduce" ? templates::Shape{.m = 64 * vec} : templates::Shape{.m = 1, .n = vec});
    if (!l.ok()) {
      spdlog::warn("kiln: {} has no launch geometry: {}", c.name, l.status().to_string());
      continue;
    }
    c.launch = *l;
    c.binary = gate.precompile(r->source, target, Priority::kNormal, r->compile_cost);
    out.push_back(std::move(c));
  }
  return out;
}

Status AllReduce::Impl::agree(std::vector<TemplateChoice>& list) {
  std::vector<double> failed(list.size(), 0);
  for (size_t i = 0; i < list.size(); ++i) {
    TemplateChoice& c = list[i];
    if (c.agreed) {
      failed[i] = c.kernel ? 0 : 1;
      continue;
    }
    const Result<Binary>& b = c.binary.get();
    if (!b.ok()) {
      c.status = b.status();
    } else {
      auto k = load_kernel(*b);
      if (k.ok()) c.kernel.emplace(std::move(k).value());
      else c.status = k.status();
    }
    failed[i] = c.kernel ? 0 : 1;
    if (!c.kernel) spdlog::warn("kiln: all-reduce choice {} is unavailable: {}", c.name, c.status.to_string());
  }
  KILN_RETURN_IF_ERROR(comm->all_reduce_max(failed));
  for (size_t i = 0; i < list.size(); ++i) {
    TemplateChoice& c = list[i];
    if (failed[i] > 0 && c.kernel) {
      c.kernel.reset();
      c.status = make_error(ErrorCode::kFailedPrecondition, "failed to compile or load on another rank");
    }
    c.agreed = true;
  }
  return Status();
}

const TemplateChoice* AllReduce::Impl::find(const std::vector<TemplateChoice>& list, const std::string& name) const {
  for (const auto& c : list) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

std::vector<std::string> AllReduce::Impl::names_for(int64_t count, AllReduceCall call) const {
  const bool in_place_call = call == AllReduceCall::kSymmetricInPlace;
  std::vector<std::string> out{kNccl};
  const size_t bytes = static_cast<size_t>(count) * elem_bytes;
  if (window && bytes <= window->bytes) out.push_back(kNcclSymmetric);
  for (const auto& c : choices) {
    if (!c.kernel || (c.push && bytes > push_slot_bytes) || (in_place_call && !c.in_place)) continue;
    if (c.push2 && (!in_place_call || push2_chunk_bytes(c, count) > push_slot_bytes)) continue;
    if (c.tmpl->check_problem(c.params, templates::Shape{.m = count}).ok()) out.push_back(c.name);
  }
  return out;
}

Status AllReduce::Impl::run_named(const std::string& name, CUdeviceptr in, CUdeviceptr out, int64_t count,
                                  CUstream stream) const {
  if (count <= 0 || count > std::numeric_limits<int>::max()) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("all-reduce of {} elements", count));
  }
  KILN_ASSIGN_OR_RETURN(Pick p, resolve(name));
  return run_pick(p, locate(in, static_cast<size_t>(count) * elem_bytes), in, out, count, stream);
}

Status AllReduce::Impl::run_pick(const Pick& p, const Operand& where, CUdeviceptr in, CUdeviceptr out, int64_t count,
                                 CUstream stream) const {
  switch (p.kind) {
    case Pick::kNcclPick: {
      KILN_ASSIGN_OR_RETURN(const NcclApi* n, nccl());
      KILN_ASSIGN_OR_RETURN(ncclDataType_t t, nccl_dtype(options.dtype));
      KILN_CHECK(n->ncclAllReduce(reinterpret_cast<const void*>(in), reinterpret_cast<void*>(out),
                                  static_cast<size_t>(count), t, ncclSum, comm->nccl(), stream));
      return Status();
    }
    case Pick::kNcclSymmetricPick:
      return run_symmetric(in, out, count, stream);
    case Pick::kTemplatePick:
      return launch_template(*p.choice, where, in, out, count, stream);
  }
  return make_error(ErrorCode::kInternal, "unknown pick");
}

KilnAllReduceArgs AllReduce::Impl::base_args() const {
  KilnAllReduceArgs a{};
  for (int r = 0; r < comm->world(); ++r) {
    a.data[r] = reinterpret_cast<void*>(static_cast<uintptr_t>(staging->ptr(r)));
    a.gather[r] = a.data[r];
    a.signals[r] = reinterpret_cast<unsigned*>(static_cast<uintptr_t>(signals->ptr(r)));
  }
  for (int r = 0; r < comm->world() && push; ++r) a.push[r] = reinterpret_cast<void*>(static_cast<uintptr_t>(push->ptr(r)));
  a.slot = static_cast<long long>(push_slot_bytes / elem_bytes);
  a.rank = comm->rank();
  return a;
}

Status AllReduce::Impl::stage_input(const TemplateChoice& c, const Operand& where, bool in_place, CUdeviceptr in,
                                    size_t bytes, CUstream stream, KilnAllReduceArgs& a) const {
  if (c.push2) {
    // The sums go straight into every rank's tensor: the call must be in place on peer-mapped memory.
    if (!in_place || !where.region) {
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("{} reduces in place on symmetric (heap or staging) tensors only", c.name));
    }
    const int64_t count = static_cast<int64_t>(bytes / elem_bytes);
    if (push2_chunk_bytes(c, count) > push_slot_bytes) {
      return make_error(ErrorCode::kInvalidArgument, fmt::format("{}: chunks of {} bytes exceed its {}-byte slots",
                                                                 c.name, push2_chunk_bytes(c, count), push_slot_bytes));
    }
    a.in = reinterpret_cast<const void*>(static_cast<uintptr_t>(in));
    for (int r = 0; r < comm->world(); ++r) {
      a.gather[r] = reinterpret_cast<void*>(static_cast<uintptr_t>(where.region->ptr(r) + where.offset));
    }
    return Status();
  }
  if (c.push) {
    if (bytes > push_slot_bytes) {
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("{}: {} bytes exceed its {}-byte slots", c.name, bytes, push_slot_bytes));
    }
    a.in = reinterpret_cast<const void*>(static_cast<uintptr_t>(in));
    return Status();
  }
  if (where.region) {
    const int world = comm->world();
    for (int r = 0; r < world; ++r) {
      a.data[r] = reinterpret_cast<void*>(static_cast<uintptr_t>(where.region->ptr(r) + where.offset));
    }
    // A heap input reduced out of place keeps its value: the all-gather goes to the staging buffers (base).
    if (in_place || where.region == staging.get()) {
      for (int r = 0; r < world; ++r) a.gather[r] = a.data[r];
    }
    return Status();
  }
  // A staged call: the kernel copies the input into this rank's staging itself (one launch), when the input is
  // aligned for its vector loads; otherwise a copy launch first.
  if (in % static_cast<CUdeviceptr>(c.vec * elem_bytes) == 0) {
    a.in = reinterpret_cast<const void*>(static_cast<uintptr_t>(in));
    return Status();
  }
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  KILN_CHECK(d->cuMemcpyDtoDAsync(staging->local(), in, bytes, stream));
  return Status();
}

// Outputs must not be in the staging buffer, where the peers read while the kernel writes: except an in-place
// call's, which is the whole buffer and the input too.
Status AllReduce::Impl::not_in_staging(CUdeviceptr p, const char* what) const {
  const CUdeviceptr lo = staging->local(), hi = lo + staging->bytes();
  if (p >= lo && p < hi) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("the {} is inside the staging buffer (input_buffer())", what));
  }
  return Status();
}

// Per call: no string compares, no template lookups (the count's divisibility is the only problem constraint of
// the all-reduce template), one launch (a staged input is copied into the staging buffer by the kernel itself,
// unless it is not aligned for the vector loads).
Status AllReduce::Impl::launch_template(const TemplateChoice& c, const Operand& where, CUdeviceptr in,
                                        CUdeviceptr out, int64_t count, CUstream stream) const {
  if (!c.kernel) return c.status.ok() ? make_error(ErrorCode::kFailedPrecondition, c.name + " is not loaded") : c.status;
  const size_t bytes = static_cast<size_t>(count) * elem_bytes;
  if (bytes > staging->bytes()) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("{} bytes exceed the {} the staging buffers hold", bytes, staging->bytes()));
  }
  if (count % c.vec) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("{} elements are not a multiple of vec {}", count, c.vec));
  }
  const bool in_place = where.region && in == out;
  if (!in_place) {
    KILN_RETURN_IF_ERROR(not_in_staging(out, "output"));
    if (where.region && out < in + bytes && in < out + bytes) {
      return make_error(ErrorCode::kInvalidArgument, "the output overlaps the input without being it (in place)");
    }
  }
  if (in_place && !c.in_place && !c.push) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("{} cannot reduce in place (its peers read the input while it writes it); tune "
                                  "symmetric in-place calls for them",
                                  c.name));
  }
  KilnAllReduceArgs a = base;
  KILN_RETURN_IF_ERROR(stage_input(c, where, in_place, in, bytes, stream, a));
  a.out = reinterpret_cast<void*>(static_cast<uintptr_t>(out));
  a.count = static_cast<int>(count);
  return (*c.kernel)(launch_config(c.launch, stream), a);
}

// NCCL's symmetric kernels need both buffers in the registered window: the input is copied in and the result
// out (a caller's tensor is not in kiln's window), and the all-reduce runs in place there.
Status AllReduce::Impl::run_symmetric(CUdeviceptr in, CUdeviceptr out, int64_t count, CUstream stream) const {
  if (!window) return make_error(ErrorCode::kNotFound, "no nccl_symmetric choice (no symmetric window)");
  const size_t bytes = static_cast<size_t>(count) * elem_bytes;
  if (bytes > window->bytes) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("nccl_symmetric: {} bytes exceed its {}-byte window",
                                                               bytes, window->bytes));
  }
  KILN_ASSIGN_OR_RETURN(const DriverApi* d, driver());
  KILN_ASSIGN_OR_RETURN(const NcclApi* n, nccl());
  KILN_ASSIGN_OR_RETURN(ncclDataType_t t, nccl_dtype(options.dtype));
  void* w = reinterpret_cast<void*>(static_cast<uintptr_t>(window->ptr()));
  KILN_CHECK(d->cuMemcpyDtoDAsync(window->ptr(), in, bytes, stream));
  KILN_CHECK(n->ncclAllReduce(w, w, static_cast<size_t>(count), t, ncclSum, comm->nccl(), stream));
  KILN_CHECK(d->cuMemcpyDtoDAsync(out, window->ptr(), bytes, stream));
  return Status();
}

}  // namespace kiln::runtime
