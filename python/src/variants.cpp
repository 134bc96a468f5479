// kiln.tune(variants, problem_key, check=...): kiln's variant tuner (kiln/runtime/variants.h) for a DSL
// written in Python. The Python callbacks (buffers, check, geometry) run under the GIL, taken only while they
// run: the tune itself (compiles, benchmarks) runs without it.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <mutex>
#include <unordered_map>

#include "args.h"
#include "errors.h"
#include "kiln/jit/compiler.h"
#include "kiln/jit/device.h"
#include "kiln/runtime/builtin.h"
#include "kiln/runtime/variants.h"
#include "tensor.h"
#include "text.h"
#include "tuner.h"

namespace nb = nanobind;

namespace kiln::py {
namespace {

[[noreturn]] void bad(const std::string& message) { raise(make_error(ErrorCode::kInvalidArgument, message)); }

// A Python object that kiln's registry may copy and drop on any thread: its reference is taken and dropped
// under the GIL (and leaked once the interpreter is gone, at process exit).
class PyRef {
 public:
  explicit PyRef(nb::handle h) : obj_(h.inc_ref().ptr()) {}
  ~PyRef() {
    if (!Py_IsInitialized()) return;
    nb::gil_scoped_acquire gil;
    Py_XDECREF(obj_);
  }
  nb::handle get() const { return obj_; }

 private:
  PyObject* obj_;
};
using Ref = std::shared_ptr<PyRef>;

std::string python_error_text() {
  try {
    throw;
  } catch (nb::python_error& e) {
    return e.what();
  } catch (std::exception& e) {
    return e.what();
  }
}

nb::list size_list(std::span<const int64_t> sizes) {
  nb::list l;
  for (int64_t s : sizes) l.append(s);
  return l;
}

// What one buffers() call made: the Python arguments (kept alive while the tune uses them) and their bytes.
struct Owned {
  Ref args;
  PackedArgs packed;
};
// The checked run hands the check its parameter array; the first parameter's address finds the Python args.
std::mutex owned_mu;
std::unordered_map<const void*, std::weak_ptr<Owned>> owned_by_storage;

runtime::OutputRegion output_region(nb::handle t, const char* kind, size_t index, bool restore) {
  TensorView v = tensor_view(t, kind);
  if (v.device != DeviceKind::kCuda || !v.has_kiln_dtype()) {
    bad(strf("{} {}: a CUDA float16, bfloat16 or float32 tensor is compared with the reference", kind, index));
  }
  runtime::OutputRegion r;
  r.ptr = v.ptr;
  r.dtype = v.kiln_dtype();
  r.cols = v.ndim ? v.shape[v.ndim - 1] : 1;
  r.rows = 1;
  for (int i = 0; i + 1 < v.ndim; ++i) r.rows *= v.shape[i];
  r.ld = v.ndim >= 2 ? v.strides[v.ndim - 2] : r.cols;
  if (!v.contiguous()) bad(strf("{} {}: must be contiguous", kind, index));
  r.name = strf("{}{}", kind, index);
  r.restore = restore;
  return r;
}

class PyTunedOp {
 public:
  PyTunedOp(std::shared_ptr<runtime::Selection> sel, std::vector<size_t> params, std::vector<int64_t> sizes)
      : sel_(std::move(sel)), params_(std::move(params)), sizes_(std::move(sizes)) {}
  std::string chosen() const { return sel_->choice_name(); }
  std::string report() const { return sel_->report().json(); }
  bool from_cache() const { return sel_->report().decision_from_cache; }
  std::vector<int64_t> sizes() const { return sizes_; }

  void run(nb::sequence args, std::optional<std::vector<int64_t>> sizes, nb::handle stream_arg) const {
    if (nb::len(args) != params_.size()) bad(strf("the variants take {} arguments, {} given", params_.size(), nb::len(args)));
    PackedArgs packed(args, params_);
    const std::vector<int64_t> s = sizes ? *sizes : sizes_;
    auto stream = reinterpret_cast<CUstream>(resolve_stream(stream_arg, TensorView{}));
    Status st;
    {
      nb::gil_scoped_release release;
      st = runtime::run_variant(*sel_, s, packed.pointers.data(), stream);
    }
    check(st);
  }

 private:
  std::shared_ptr<runtime::Selection> sel_;
  std::vector<size_t> params_;
  std::vector<int64_t> sizes_;
};

// buffers() gives the kernel arguments, or {"args": [...], "outputs": [...], "inouts": [...]}: tensors the
// variants write (poisoned before each checked run), and tensors they update in place (y = a * x + y: restored
// to what buffers() made before each checked run; poison there would be read back and fail every variant).
// Both are compared with the reference variant's.
struct Made {
  nb::sequence args;
  nb::object outputs = nb::none(), inouts = nb::none();
};

bool same_memory(nb::handle a, nb::handle b) {
  if (a.is(b)) return true;
  try {
    return tensor_view(a, "output").ptr == tensor_view(b, "argument").ptr;
  } catch (...) {
    return false;
  }
}

Made split_made(nb::object made) {
  Made m;
  if (!nb::isinstance<nb::dict>(made)) {
    m.args = nb::cast<nb::sequence>(made);
    return m;
  }
  nb::dict d = nb::cast<nb::dict>(made);
  for (auto [k, v] : d) {
    std::string key = nb::cast<std::string>(nb::str(k));
    if (key != "args" && key != "outputs" && key != "inouts") {
      throw std::runtime_error(strf("buffers' dict has \"{}\"; its keys are \"args\", \"outputs\" and \"inouts\"", key));
    }
  }
  if (!d.contains("args")) throw std::runtime_error("buffers' dict needs \"args\"");
  m.args = nb::cast<nb::sequence>(d["args"]);
  if (d.contains("outputs")) m.outputs = nb::borrow(d["outputs"]);
  if (d.contains("inouts")) m.inouts = nb::borrow(d["inouts"]);
  // A tensor the kernels never get cannot be written by them: every variant would fail as "not written".
  for (auto [kind, list] : {std::pair{"outputs", m.outputs}, std::pair{"inouts", m.inouts}}) {
    if (list.is_none()) continue;
    size_t i = 0;
    for (nb::handle t : nb::cast<nb::sequence>(list)) {
      bool passed = false;
      for (nb::handle a : m.args) passed = passed || same_memory(t, a);
      if (!passed) throw std::runtime_error(strf("{}[{}] is not among the args: the kernels cannot write it", kind, i));
      ++i;
    }
  }
  return m;
}

runtime::Variant variant_of(nb::handle v) {
  runtime::Variant out;
  auto field = [&](const char* name) { return v.attr(name); };
  out.name = nb::cast<std::string>(field("name"));
  out.source = nb::cast<std::string>(field("source"));
  out.kernel = nb::cast<std::string>(field("kernel"));
  for (auto [k, val] : nb::cast<nb::dict>(field("defines"))) {
    out.defines.emplace_back(nb::cast<std::string>(nb::str(k)), nb::cast<std::string>(nb::str(val)));
  }
  out.options = nb::cast<std::vector<std::string>>(field("options"));
  out.include_dirs = nb::cast<std::vector<std::string>>(field("include_dirs"));
  for (auto [k, val] : nb::cast<nb::dict>(field("parameters"))) {
    out.parameters[nb::cast<std::string>(nb::str(k))] = nb::cast<std::string>(nb::str(val));
  }
  nb::object geometry = field("geometry");
  if (!geometry.is_none()) {
    Ref fn = std::make_shared<PyRef>(geometry);
    std::string name = out.name;
    out.geometry = [fn, name](std::span<const int64_t> sizes) -> Result<runtime::LaunchDims> {
      nb::gil_scoped_acquire gil;
      try {
        nb::tuple t = nb::cast<nb::tuple>(fn->get()(size_list(sizes)));
        if (t.size() < 2 || t.size() > 3) throw std::runtime_error("geometry must return (grid, block[, shared_mem])");
        runtime::LaunchDims d{dim3_of(t[0], "grid"), dim3_of(t[1], "block"), t.size() > 2 ? nb::cast<unsigned>(t[2]) : 0u};
        return d;
      } catch (...) {
        return make_error(ErrorCode::kInvalidArgument, strf("variant '{}': geometry: {}", name, python_error_text()));
      }
    };
  } else {
    out.dims = {dim3_of(field("grid"), "grid"), dim3_of(field("block"), "block"), nb::cast<unsigned>(field("shared_mem"))};
  }
  return out;
}

// The parameter sizes every variant shares, from the reference variant compiled and loaded here (the tune
// compiles through the gate and its cache; this one compile is what reading the signature costs).
std::vector<size_t> signature(const std::string& op, const runtime::Variant& ref, int device, size_t count) {
  auto r = [&]() -> Result<std::vector<size_t>> {
    nb::gil_scoped_release release;
    KILN_RETURN_IF_ERROR(ensure_context(device));
    KILN_ASSIGN_OR_RETURN(DeviceInfo info, device_info(device));
    KILN_ASSIGN_OR_RETURN(Target t, Target::parse(info.arch()));
    KILN_ASSIGN_OR_RETURN(Binary b, kiln::compile(runtime::variant_source(op, ref), t));
    KILN_ASSIGN_OR_RETURN(Kernel k, load_kernel(b));
    nb::gil_scoped_acquire gil;
    return param_sizes(k.get(), count, ref.kernel);
  }();
  return unwrap(std::move(r));
}

std::shared_ptr<PyTunedOp> tune(std::shared_ptr<PyTuner> tuner, const std::string& op_name, nb::sequence variants,
                                std::vector<int64_t> sizes, nb::object buffers, nb::object check_fn,
                                std::string reference, double tolerance, std::map<std::string, std::string> attributes,
                                int device) {
  runtime::VariantOp op;
  op.name = op_name;
  for (size_t i = 0; i < nb::len(variants); ++i) op.variants.push_back(variant_of(variants[i]));
  op.reference = reference;
  op.tolerance = tolerance;
  check(runtime::validate_variants([&] {
    runtime::VariantOp probe = op;
    probe.buffers = [](std::span<const int64_t>, uint32_t) -> Result<runtime::VariantBuffers> { return runtime::VariantBuffers{}; };
    return probe;
  }()));
  if (buffers.is_none()) bad(strf("variant op '{}' needs buffers(sizes, seed) -> args or (args, outputs)", op_name));
  const runtime::Variant& ref = reference.empty() ? op.variants.front() : *std::find_if(op.variants.begin(), op.variants.end(), [&](const auto& v) { return v.name == reference; });

  // One call of buffers() for this problem tells the argument count; its objects serve the signature only.
  // It is also where a malformed dict is caught, before anything needs a device.
  nb::sequence probe_seq = [&] {
    try {
      return split_made(buffers(size_list(sizes), 1)).args;
    } catch (...) {
      bad(strf("variant op '{}': buffers: {}", op_name, python_error_text()));
    }
  }();
  std::vector<size_t> params = signature(op_name, ref, device, nb::len(probe_seq));

  Ref buffers_fn = std::make_shared<PyRef>(buffers);
  op.buffers = [buffers_fn, params](std::span<const int64_t> s, uint32_t seed) -> Result<runtime::VariantBuffers> {
    nb::gil_scoped_acquire gil;
    try {
      Made made = split_made(buffers_fn->get()(size_list(s), seed));
      if (nb::len(made.args) != params.size()) {
        throw std::runtime_error(strf("buffers gave {} arguments; the kernels take {}", nb::len(made.args), params.size()));
      }
      auto owned = std::make_shared<Owned>(Owned{std::make_shared<PyRef>(made.args), PackedArgs(made.args, params)});
      runtime::VariantBuffers vb;
      vb.params.assign(owned->packed.pointers.begin(), owned->packed.pointers.end() - 1);
      for (auto [kind, list, restore] : {std::tuple{"output", made.outputs, false}, std::tuple{"inout", made.inouts, true}}) {
        if (list.is_none()) continue;
        size_t i = 0;
        for (nb::handle t : nb::cast<nb::sequence>(list)) vb.outputs.push_back(output_region(t, kind, i++, restore));
      }
      {
        std::lock_guard lock(owned_mu);
        owned_by_storage[owned->packed.storage.data()] = owned;
      }
      vb.owner = owned;
      return vb;
    } catch (...) {
      return make_error(ErrorCode::kInvalidArgument, strf("buffers: {}", python_error_text()));
    }
  };
  if (!check_fn.is_none()) {
    Ref check_ref = std::make_shared<PyRef>(check_fn);
    op.check = [check_ref](std::span<const int64_t> s, void** p, CUstream) -> Status {
      std::shared_ptr<Owned> owned;
      {
        std::lock_guard lock(owned_mu);
        auto it = owned_by_storage.find(p ? p[0] : nullptr);
        if (it != owned_by_storage.end()) owned = it->second.lock();
      }
      if (!owned) return make_error(ErrorCode::kInternal, "check: the arguments of this run are gone");
      nb::gil_scoped_acquire gil;
      try {
        nb::object ok = check_ref->get()(size_list(s), owned->args->get());
        if (!ok.is_none() && !nb::cast<bool>(ok)) return make_error(ErrorCode::kWrongResult, "check returned False");
        return Status();
      } catch (...) {
        return make_error(ErrorCode::kWrongResult, strf("check: {}", python_error_text()));
      }
    };
  }
  auto r = [&]() -> Result<std::shared_ptr<runtime::Selection>> {
    nb::gil_scoped_release release;
    KILN_ASSIGN_OR_RETURN(runtime::VariantSet set, runtime::register_variants(runtime::default_ops(), std::move(op)));
    KILN_ASSIGN_OR_RETURN(runtime::Tuner * t, tuner->tuner(device));
    return t->tune(set.problem(sizes, attributes));
  }();
  return std::make_shared<PyTunedOp>(unwrap(std::move(r)), std::move(params), sizes);
}

}  // namespace

void bind_variants(nb::module_& m) {
  nb::class_<PyTunedOp>(m, "TunedOp", "kiln.tune's result: the chosen variant, ready to run (capture-safe).")
      .def_prop_ro("chosen", &PyTunedOp::chosen, "The chosen variant's name.")
      .def_prop_ro("from_cache", &PyTunedOp::from_cache, "True when the decision came from the cache (no tuning).")
      .def_prop_ro("sizes", &PyTunedOp::sizes)
      .def("report", &PyTunedOp::report, "The tune's report as JSON text (every variant's time or failure).")
      .def("run", &PyTunedOp::run, nb::arg("args"), nb::arg("sizes").none() = nb::none(),
           nb::arg("stream").none() = nb::none(),
           "run(args, sizes=None, stream=None): launches the chosen variant with `args` (as Kernel.launch takes\n"
           "them) for `sizes` (default: the tuned ones; they choose the geometry). Without the GIL.");
  m.def("_tune_variants", &tune, nb::arg("tuner"), nb::arg("op"), nb::arg("variants"), nb::arg("sizes"),
        nb::arg("buffers").none(), nb::arg("check").none(), nb::arg("reference"), nb::arg("tolerance"),
        nb::arg("attributes"), nb::arg("device"));
}

}  // namespace kiln::py
