// kiln.gemm, kiln.rmsnorm, kiln.softmax: tensors in (tensor.h), the tuned selection out of the current
// tuner (tuner.h), one launch on the caller's stream. The hot path is a key build, a hash lookup and the
// launch with the GIL released; everything else happens once per problem.
#include "text.h"
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <mutex>
#include <unordered_map>

#include "errors.h"
#include "kiln/cache/tuning.h"
#include "kiln/jit/device.h"
#include "kiln/templates/epilogue.h"
#include "tensor.h"
#include "tuner.h"

namespace nb = nanobind;

namespace kiln::py {
namespace {

using templates::DType;
using templates::Layout;

[[noreturn]] void bad(const std::string& message) { raise(make_error(ErrorCode::kInvalidArgument, message)); }

void require_cuda(const TensorView& v, const char* what, int device) {
  if (v.device != DeviceKind::kCuda) bad(strf("{}: kiln runs on CUDA tensors; this one is on the CPU", what));
  if (v.device_index >= 0 && v.device_index != device) {
    bad(strf("{}: on cuda:{}, but the other operands are on cuda:{}", what, v.device_index, device));
  }
  if (!v.has_kiln_dtype()) bad(strf("{}: dtype {}; kiln takes float16, bfloat16 or float32", what, v.dtype_name));
}

TensorView view(nb::handle obj, const char* what, int device) {
  TensorView v = tensor_view(obj, what);
  require_cuda(v, what, device);
  return v;
}

void ensure_thread_context(int device) {
  // The launching thread needs a current context: torch's threads have one; a fresh thread gets the
  // device's primary context (the one torch uses).
  thread_local int ready_for = -1;
  if (ready_for == device) return;
  auto ctx = ensure_context(device);
  if (!ctx.ok()) raise(ctx.status());
  ready_for = device;
}

/// The selection for `key`, resolving a miss without the GIL. A miss inside capture with nothing to run
/// raises kiln.CaptureMissError (kiln.torch catches it and runs torch, except in strict mode).
const runtime::Selection* selection(const OpKey& key, const runtime::Problem& problem, uintptr_t stream) {
  std::shared_ptr<PyTuner> tuner = current_tuner();
  if (const auto* s = tuner->find(key)) return s;
  Result<const runtime::Selection*> r = make_error(ErrorCode::kInternal, "unset");
  {
    nb::gil_scoped_release release;
    r = tuner->resolve(key, problem, reinterpret_cast<CUstream>(stream));
  }
  if (!r.ok()) raise(r.status());
  return *r;
}

template <class Args>
void launch(const runtime::Selection* sel, const Args& args, uintptr_t stream) {
  Status s;
  {
    nb::gil_scoped_release release;
    s = sel->run(runtime::OpArgs(args), reinterpret_cast<CUstream>(stream));
  }
  check(s);
}

// A new contiguous tensor like `like` (its dtype and device) of `shape`, and its view. Outputs are allocated by
// torch's caching allocator (kiln allocates nothing of its own per call), as cheaply as Python allows: the
// sizes go to new_empty as separate ints (torch parses them faster than a tuple: measured ~2 us less per
// call), the method is called without making a bound method, and the view is filled from what is known,
// reading only data_ptr() back instead of the five attributes tensor_view() reads.
nb::object new_output(nb::handle like, const TensorView& v, const int64_t* shape, int ndim, const char* what,
                      TensorView& out) {
  if (!v.torch) bad(strf("{}: pass out= (kiln allocates outputs only for torch tensors)", what));
  static PyObject* new_empty = PyUnicode_InternFromString("new_empty");
  static PyObject* data_ptr = PyUnicode_InternFromString("data_ptr");
  PyObject* args[9] = {like.ptr()};
  for (int i = 0; i < ndim; ++i) args[i + 1] = PyLong_FromLongLong(shape[i]);
  PyObject* made = PyObject_VectorcallMethod(new_empty, args, (ndim + 1) | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
  for (int i = 0; i < ndim; ++i) Py_DECREF(args[i + 1]);
  if (!made) throw nb::python_error();
  nb::object result = nb::steal(made);
  PyObject* self[1] = {made};
  nb::object ptr = nb::steal(PyObject_VectorcallMethod(data_ptr, self, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr));
  if (!ptr.is_valid()) throw nb::python_error();
  out = v;
  out.ptr = nb::cast<uintptr_t>(ptr);
  out.ndim = ndim;
  int64_t stride = 1;
  for (int i = ndim - 1; i >= 0; --i) out.shape[i] = shape[i], out.strides[i] = stride, stride *= shape[i];
  return result;
}

// The parsed epilogue for (text, dtypes), by a small string key: parse_epilogue runs once per spelling.
struct EpilogueEntry {
  templates::EpilogueSpec spec;
  uint16_t id = 0;
};
const EpilogueEntry& epilogue_of(const std::string& text, DType out, DType bias, DType residual) {
  static std::mutex mu;
  static std::unordered_map<std::string, EpilogueEntry> entries;
  std::string key = text;
  key += char('0' + int(out)), key += char('0' + int(bias)), key += char('0' + int(residual));
  std::lock_guard lock(mu);
  if (auto it = entries.find(key); it != entries.end()) return it->second;
  auto spec = templates::parse_epilogue(text, out);
  if (!spec.ok()) raise(spec.status());
  spec->bias_dtype = bias;
  spec->residual_dtype = residual;
  EpilogueEntry e{*spec, intern_epilogue(spec->tag())};
  return entries.emplace(std::move(key), std::move(e)).first->second;
}

bool mentions(const std::string& text, const char* op) { return text.find(op) != std::string::npos; }

// Operand layout of a 2-D view: row-major (unit last stride) or column-major (unit first stride), with
// dense leading dimensions, which is what every kiln GEMM choice takes.
Layout layout_of(const TensorView& v, const char* what) {
  int64_t rows = v.shape[0], cols = v.shape[1];
  if ((v.strides[1] == 1 || cols == 1) && (v.strides[0] == cols || rows == 1)) return Layout::kRowMajor;
  if ((v.strides[0] == 1 || rows == 1) && (v.strides[1] == rows || cols == 1)) return Layout::kColMajor;
  bad(strf("{}: strides ({}, {}) for shape ({}, {}); kiln's GEMM takes dense row- or column-major operands "
                  "(call .contiguous())", what, v.strides[0], v.strides[1], rows, cols));
}

nb::object gemm(nb::handle a, nb::handle b, nb::handle bias, const std::string& epilogue_text, nb::handle out,
                nb::handle residual, float alpha, float beta, nb::handle stream_arg, bool b_constant) {
  TensorView va = tensor_view(a, "a");
  const int device = va.device_index < 0 ? 0 : va.device_index;
  require_cuda(va, "a", device);
  TensorView vb = view(b, "b", device);
  if (va.ndim != 2 || vb.ndim != 2) bad(strf("gemm takes 2-D a and b; got {}-D and {}-D", va.ndim, vb.ndim));
  const int64_t m = va.shape[0], k = va.shape[1], n = vb.shape[1];
  if (vb.shape[0] != k) bad(strf("gemm: a is {}x{} and b is {}x{}: inner sizes differ", m, k, vb.shape[0], n));
  const Layout la = layout_of(va, "a"), lb = layout_of(vb, "b");

  nb::object result;
  TensorView vd;
  if (out.is_none()) {
    const int64_t shape[2] = {m, n};
    result = new_output(a, va, shape, 2, "gemm", vd);
  } else {
    result = nb::borrow(out);
    vd = view(result, "out", device);
  }
  if (vd.ndim != 2 || vd.shape[0] != m || vd.shape[1] != n || layout_of(vd, "out") != Layout::kRowMajor) {
    bad(strf("gemm: out must be a dense row-major {}x{} tensor", m, n));
  }
  std::string text = epilogue_text;
  TensorView vbias, vres;
  DType bias_dtype = vd.kiln_dtype(), res_dtype = vd.kiln_dtype();
  if (!bias.is_none()) {
    vbias = view(bias, "bias", device);
    if (vbias.ndim != 1 || vbias.shape[0] != n || (n > 1 && vbias.strides[0] != 1)) bad(strf("bias: must be a contiguous vector of {}", n));
    if (!mentions(text, "bias")) text = text.empty() || text == "none" ? "bias" : "bias+" + text;
    bias_dtype = vbias.kiln_dtype();
  } else if (mentions(text, "bias")) {
    bad(strf("gemm: epilogue '{}' adds a bias but bias is None", text));
  }
  if (!residual.is_none()) {
    vres = view(residual, "residual", device);
    if (vres.ndim != 2 || vres.shape[0] != m || vres.shape[1] != n || (n > 1 && vres.strides[1] != 1)) {
      bad(strf("residual: must be a {}x{} tensor with unit last stride", m, n));
    }
    if (!mentions(text, "residual")) text = text.empty() || text == "none" ? "residual" : text + "+residual";
    res_dtype = vres.kiln_dtype();
  } else if (mentions(text, "residual")) {
    bad(strf("gemm: epilogue '{}' adds a residual but residual is None", text));
  }
  const EpilogueEntry& ep = epilogue_of(text, vd.kiln_dtype(), bias_dtype, res_dtype);

  OpKey key;
  key.op = kGemm;
  key.size = m, key.n = n, key.k = k, key.device = device;
  key.dtype = uint8_t(va.kiln_dtype()), key.dtype_b = uint8_t(vb.kiln_dtype()), key.dtype_out = uint8_t(vd.kiln_dtype());
  key.layout_a = uint8_t(la), key.layout_b = uint8_t(lb), key.epilogue = ep.id;
  key.flags = b_constant ? 1 : 0;  // tuned and cached apart (tuner.cpp's key_of says the same)

  const uintptr_t stream = resolve_stream(stream_arg, va);
  ensure_thread_context(device);
  const runtime::Selection* sel = current_tuner()->find(key);
  if (!sel) {
    runtime::GemmProblem g{.m = m, .n = n, .k = k, .a = va.kiln_dtype(), .b = vb.kiln_dtype(), .a_layout = la,
                           .b_layout = lb, .epilogue = ep.spec, .b_constant = b_constant};
    sel = selection(key, runtime::Problem::gemm(g), stream);
  }
  KilnGemmArgs args{};
  args.a = reinterpret_cast<const void*>(va.ptr);
  args.b = reinterpret_cast<const void*>(vb.ptr);
  args.d = reinterpret_cast<void*>(vd.ptr);
  args.m = int(m), args.n = int(n), args.k = int(k);
  args.split_k = 1, args.k_per_split = int(k);
  args.lda = la == Layout::kRowMajor ? k : m;
  args.ldb = lb == Layout::kRowMajor ? n : k;
  args.ldd = n;
  args.ep.bias = reinterpret_cast<const void*>(vbias.ptr);
  args.ep.residual = reinterpret_cast<const void*>(vres.ptr);
  args.ep.ld_residual = residual.is_none() ? n : vres.strides[0];
  args.ep.alpha = alpha;
  args.ep.beta = beta;
  if (b_constant) args.flags |= KILN_GEMM_B_CONSTANT;
  launch(sel, args, stream);
  return result;
}

// rows x cols of a tensor whose last dimension is contiguous and whose leading dimensions collapse into one
// (e.g. [batch, seq, hidden] -> [batch*seq, hidden]); the row stride in elements.
struct Rows {
  int64_t rows = 1, cols = 0, ld = 0;
};
Rows rows_of(const TensorView& v, const char* what) {
  if (v.ndim < 1) bad(strf("{}: a scalar; kiln normalises rows of a tensor", what));
  Rows r;
  r.cols = v.shape[v.ndim - 1];
  if (r.cols > 1 && v.strides[v.ndim - 1] != 1) bad(strf("{}: the last dimension must be contiguous", what));
  r.ld = v.ndim >= 2 ? v.strides[v.ndim - 2] : r.cols;
  for (int i = v.ndim - 2; i >= 0; --i) {
    if (i < v.ndim - 2 && v.shape[i] > 1 && v.strides[i] != v.strides[i + 1] * v.shape[i + 1]) {
      bad(strf("{}: leading dimensions do not collapse into rows (call .contiguous())", what));
    }
    r.rows *= v.shape[i];
  }
  if (r.rows > 1 && r.ld < r.cols) bad(strf("{}: rows overlap (row stride {} < {})", what, r.ld, r.cols));
  if (r.rows == 1) r.ld = r.cols;
  return r;
}

void same_rows(const Rows& a, const Rows& b, const char* what) {
  if (a.rows != b.rows || a.cols != b.cols) bad(strf("{}: {}x{} rows, expected {}x{}", what, b.rows, b.cols, a.rows, a.cols));
}

nb::object new_like(nb::handle x, const TensorView& v, const char* what, TensorView& out) {
  return new_output(x, v, v.shape, v.ndim, what, out);
}

// `out` when given (checked to be a CUDA tensor on `device`), else a new tensor like x.
nb::object output_of(nb::handle out, nb::handle x, const TensorView& vx, const char* what, int device, TensorView& vy) {
  if (!out.is_none()) {
    vy = view(out, "out", device);
    return nb::borrow(out);
  }
  return new_like(x, vx, what, vy);
}

nb::object rmsnorm(nb::handle x, nb::handle weight, float eps, nb::handle residual, nb::handle out, nb::handle stream_arg) {
  TensorView vx = tensor_view(x, "x");
  const int device = vx.device_index < 0 ? 0 : vx.device_index;
  require_cuda(vx, "x", device);
  Rows r = rows_of(vx, "x");
  TensorView vw = view(weight, "weight", device);
  if (vw.ndim != 1 || vw.shape[0] != r.cols || vw.dtype_code != vx.dtype_code) {
    bad(strf("weight: must be a vector of {} {}", r.cols, vx.dtype_name));
  }
  TensorView vy;
  nb::object result = output_of(out, x, vx, "rmsnorm", device, vy);
  Rows ry = rows_of(vy, "out");
  same_rows(r, ry, "out");
  TensorView vr;
  Rows rr;
  if (!residual.is_none()) {
    vr = view(residual, "residual", device);
    rr = rows_of(vr, "residual");
    same_rows(r, rr, "residual");
  }
  if (vy.dtype_code != vx.dtype_code || (!residual.is_none() && vr.dtype_code != vx.dtype_code)) {
    bad("rmsnorm: x, out and residual must have one dtype");
  }
  OpKey key;
  key.op = kRmsNorm;
  key.size = r.rows, key.n = r.cols, key.device = device;
  key.dtype = key.dtype_out = uint8_t(vx.kiln_dtype());
  key.flags = residual.is_none() ? 0 : 1;
  const uintptr_t stream = resolve_stream(stream_arg, vx);
  ensure_thread_context(device);
  const runtime::Selection* sel = current_tuner()->find(key);
  if (!sel) {
    runtime::NormProblem p{.rows = r.rows, .cols = r.cols, .dtype = vx.kiln_dtype(), .residual = !residual.is_none(), .eps = eps};
    sel = selection(key, runtime::Problem::norm(p), stream);
  }
  KilnNormArgs a{};
  a.x = reinterpret_cast<const void*>(vx.ptr);
  a.weight = reinterpret_cast<const void*>(vw.ptr);
  a.y = reinterpret_cast<void*>(vy.ptr);
  a.rows = int(r.rows), a.cols = int(r.cols);
  a.ld_x = r.ld, a.ld_y = ry.ld;
  if (!residual.is_none()) {
    // vLLM's fused_add_rms_norm: h = x + residual is written back into residual.
    a.residual = reinterpret_cast<const void*>(vr.ptr);
    a.residual_out = reinterpret_cast<void*>(vr.ptr);
    a.ld_residual = a.ld_residual_out = rr.ld;
  }
  a.eps = eps;
  launch(sel, a, stream);
  return result;
}

nb::object softmax(nb::handle x, float scale, nb::handle out, nb::handle stream_arg) {
  TensorView vx = tensor_view(x, "x");
  const int device = vx.device_index < 0 ? 0 : vx.device_index;
  require_cuda(vx, "x", device);
  Rows r = rows_of(vx, "x");
  TensorView vy;
  nb::object result = output_of(out, x, vx, "softmax", device, vy);
  Rows ry = rows_of(vy, "out");
  same_rows(r, ry, "out");
  if (vy.dtype_code != vx.dtype_code) bad("softmax: x and out must have one dtype");
  OpKey key;
  key.op = kSoftmax;
  key.size = r.rows, key.n = r.cols, key.device = device;
  key.dtype = key.dtype_out = uint8_t(vx.kiln_dtype());
  const uintptr_t stream = resolve_stream(stream_arg, vx);
  ensure_thread_context(device);
  const runtime::Selection* sel = current_tuner()->find(key);
  if (!sel) {
    runtime::SoftmaxProblem p{.rows = r.rows, .cols = r.cols, .dtype = vx.kiln_dtype(), .scale = scale};
    sel = selection(key, runtime::Problem::softmax(p), stream);
  }
  KilnSoftmaxArgs a{};
  a.x = reinterpret_cast<const void*>(vx.ptr);
  a.y = reinterpret_cast<void*>(vy.ptr);
  a.rows = int(r.rows), a.cols = int(r.cols);
  a.ld_x = r.ld, a.ld_y = ry.ld;
  a.scale = scale;
  launch(sel, a, stream);
  return result;
}

// What torch's dispatcher calls for torch.ops.kiln.* (kiln/torch.py registers these for the CUDA key): the op
// itself with no Python frame of kiln's in between. A miss inside capture runs kiln.torch's torch composition
// (handed over by _set_torch_fallbacks), except in strict mode, where kiln.CaptureMissError goes to the caller.
struct TorchFallbacks {
  nb::object gemm, rmsnorm, fused_add_rmsnorm, softmax;
};
TorchFallbacks* torch_fallbacks = nullptr;  // set once by kiln.torch; kept for the process

const nb::object& fallback_for(nb::python_error& e, nb::object TorchFallbacks::*which) {
  if (!is_capture_miss(e) || !torch_fallbacks || current_tuner()->mode() == cache::TuneMode::kStrict) throw;
  return torch_fallbacks->*which;
}

nb::object op_gemm(nb::handle a, nb::handle b, nb::handle bias, const std::string& epilogue, nb::handle residual,
                   double alpha, double beta, bool b_constant) {
  try {
    return gemm(a, b, bias, epilogue, nb::none(), residual, float(alpha), float(beta), nb::none(), b_constant);
  } catch (nb::python_error& e) {
    return fallback_for(e, &TorchFallbacks::gemm)(a, b, bias, epilogue, residual, alpha, beta);
  }
}

nb::object op_rmsnorm(nb::handle x, nb::handle weight, double eps) {
  try {
    return rmsnorm(x, weight, float(eps), nb::none(), nb::none(), nb::none());
  } catch (nb::python_error& e) {
    return fallback_for(e, &TorchFallbacks::rmsnorm)(x, weight, eps);
  }
}

nb::object op_fused_add_rmsnorm(nb::handle x, nb::handle residual, nb::handle weight, double eps) {
  try {
    return rmsnorm(x, weight, float(eps), residual, nb::none(), nb::none());
  } catch (nb::python_error& e) {
    return fallback_for(e, &TorchFallbacks::fused_add_rmsnorm)(x, residual, weight, eps);
  }
}

nb::object op_softmax(nb::handle x, double scale) {
  try {
    return softmax(x, float(scale), nb::none(), nb::none());
  } catch (nb::python_error& e) {
    return fallback_for(e, &TorchFallbacks::softmax)(x, scale);
  }
}

}  // namespace

void bind_ops(nb::module_& m) {
  m.def("_set_torch_fallbacks", [](nb::object gemm, nb::object rmsnorm, nb::object fused_add_rmsnorm, nb::object softmax) {
    if (!torch_fallbacks) torch_fallbacks = new TorchFallbacks;
    *torch_fallbacks = {std::move(gemm), std::move(rmsnorm), std::move(fused_add_rmsnorm), std::move(softmax)};
  });
  m.def("_op_gemm", &op_gemm, nb::arg("a"), nb::arg("b"), nb::arg("bias").none() = nb::none(), nb::arg("epilogue") = "",
        nb::arg("residual").none() = nb::none(), nb::arg("alpha") = 1.0, nb::arg("beta") = 1.0,
        nb::arg("b_constant") = false);
  m.def("_op_rmsnorm", &op_rmsnorm, nb::arg("x"), nb::arg("weight"), nb::arg("eps") = 1e-6);
  m.def("_op_fused_add_rmsnorm", &op_fused_add_rmsnorm, nb::arg("x"), nb::arg("residual"), nb::arg("weight"),
        nb::arg("eps") = 1e-6);
  m.def("_op_softmax", &op_softmax, nb::arg("x"), nb::arg("scale") = 1.0);
  m.def("gemm", &gemm, nb::arg("a"), nb::arg("b"), nb::arg("bias").none() = nb::none(), nb::arg("epilogue") = "",
        nb::arg("out").none() = nb::none(), nb::arg("residual").none() = nb::none(), nb::arg("alpha") = 1.0f,
        nb::arg("beta") = 1.0f, nb::arg("stream").none() = nb::none(), nb::arg("b_constant") = false,
        "gemm(a, b, bias=None, epilogue='', out=None, residual=None, alpha=1.0, beta=1.0, stream=None,\n"
        "     b_constant=False)\n\n"
        "out[M,N] = epilogue(a[M,K] @ b[K,N]) with kiln's tuned kernel for the problem.\n\n"
        "a and b are dense row- or column-major (b = weight.t() of a [N,K] weight is column-major: no copy).\n"
        "epilogue: ops joined by '+', from scale (x alpha), bias, residual (+ beta * residual), relu, gelu, silu;\n"
        "a bias or residual tensor adds its op when the text does not name it. out: allocated like a (torch\n"
        "inputs) when None. stream: an int handle or a stream object; default: torch's current stream for torch\n"
        "inputs, else the legacy default stream. The first call of a problem tunes it (see kiln.Tuner).\n"
        "b_constant: a promise that b (a weight) is not written by the kernel before this one on the stream; for\n"
        "decode shapes the tune then also tries kernels that load b before waiting for that kernel (tuned and\n"
        "cached apart from the same problem without it).");
  m.def("rmsnorm", &rmsnorm, nb::arg("x"), nb::arg("weight"), nb::arg("eps") = 1e-6f,
        nb::arg("residual").none() = nb::none(), nb::arg("out").none() = nb::none(),
        nb::arg("stream").none() = nb::none(),
        "rmsnorm(x, weight, eps=1e-6, residual=None, out=None, stream=None)\n\n"
        "y = h / sqrt(mean(h^2) + eps) * weight over the last dimension, h = x (+ residual). With residual,\n"
        "h is written back into residual (vLLM's fused_add_rms_norm). Returns y.");
  m.def("softmax", &softmax, nb::arg("x"), nb::arg("scale") = 1.0f, nb::arg("out").none() = nb::none(),
        nb::arg("stream").none() = nb::none(),
        "softmax(x, scale=1.0, out=None, stream=None)\n\ny = softmax(scale * x) over the last dimension.");
}

}  // namespace kiln::py
