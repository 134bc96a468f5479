#include "tensor.h"

#include "dlpack.h"

#include "text.h"
#include <nanobind/stl/string.h>

#include "errors.h"

namespace nb = nanobind;

namespace kiln::py {
namespace {

[[noreturn]] void bad(const std::string& message) { raise(make_error(ErrorCode::kInvalidArgument, message)); }

void set_dtype(TensorView& v, char code, int itemsize, std::string name) {
  v.dtype_code = code;
  v.itemsize = itemsize;
  v.dtype_name = std::move(name);
}

void set_dl_dtype(TensorView& v, DLDataType t) {
  if (t.lanes != 1) return set_dtype(v, '?', t.bits / 8, strf("vector{}x{}", int(t.lanes), int(t.bits)));
  if (t.code == kDLFloat && t.bits == 16) return set_dtype(v, 'h', 2, "float16");
  if (t.code == kDLFloat && t.bits == 32) return set_dtype(v, 'f', 4, "float32");
  if (t.code == kDLBfloat && t.bits == 16) return set_dtype(v, 'b', 2, "bfloat16");
  const char* kind = t.code == kDLFloat ? "float" : t.code == kDLInt ? "int" : t.code == kDLUInt ? "uint" : "type";
  set_dtype(v, '?', t.bits / 8, strf("{}{}", kind, int(t.bits)));
}

void from_dltensor(TensorView& v, const DLTensor& t, const char* what) {
  if (t.ndim > 8) bad(strf("{}: {} dimensions; kiln takes at most 8", what, t.ndim));
  v.ndim = t.ndim;
  v.ptr = reinterpret_cast<uintptr_t>(t.data) + t.byte_offset;
  set_dl_dtype(v, t.dtype);
  int64_t expected = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    v.shape[i] = t.shape[i];
    v.strides[i] = t.strides ? t.strides[i] : expected;  // null strides: compact row-major
    expected *= t.shape[i];
  }
  v.device = t.device.device_type == kDLCUDA || t.device.device_type == kDLCUDAManaged ? DeviceKind::kCuda
             : t.device.device_type == kDLCPU || t.device.device_type == kDLCUDAHost  ? DeviceKind::kCpu
                                                                                     : DeviceKind::kOther;
  v.device_index = t.device.device_id;
}

// The consumer owns a capsule's tensor once read: rename it (so the capsule's destructor leaves it alone)
// and call its deleter. The producer object stays alive in the caller, so the memory does too.
TensorView from_dlpack(nb::handle obj, const char* what, intptr_t stream) {
  nb::object capsule;
  try {
    if (stream >= 0) {
      capsule = obj.attr("__dlpack__")(nb::arg("stream") = stream == 0 ? 1 : stream);
    } else {
      capsule = obj.attr("__dlpack__")();
    }
  } catch (nb::python_error& e) {
    bad(strf("{}: __dlpack__ failed: {}", what, e.what()));
  }
  TensorView v;
  PyObject* c = capsule.ptr();
  if (PyCapsule_IsValid(c, "dltensor_versioned")) {
    auto* m = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(c, "dltensor_versioned"));
    from_dltensor(v, m->dl_tensor, what);
    PyCapsule_SetName(c, "used_dltensor_versioned");
    if (m->deleter) m->deleter(m);
  } else if (PyCapsule_IsValid(c, "dltensor")) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(c, "dltensor"));
    from_dltensor(v, m->dl_tensor, what);
    PyCapsule_SetName(c, "used_dltensor");
    if (m->deleter) m->deleter(m);
  } else {
    bad(strf("{}: __dlpack__ returned something that is not a DLPack capsule", what));
  }
  return v;
}

void set_typestr(TensorView& v, const std::string& typestr, const char* what) {
  if (typestr.size() < 3) bad(strf("{}: bad __cuda_array_interface__ typestr '{}'", what, typestr));
  char kind = typestr[1];
  int bytes = std::atoi(typestr.c_str() + 2);
  if (kind == 'f' && bytes == 2) return set_dtype(v, 'h', 2, "float16");
  if (kind == 'f' && bytes == 4) return set_dtype(v, 'f', 4, "float32");
  // NumPy has no bfloat16; ml_dtypes writes it as an opaque 2-byte void ("|V2"), which CuPy and JAX use.
  if (kind == 'V' && bytes == 2) return set_dtype(v, 'b', 2, "bfloat16");
  const char* name = kind == 'f' ? "float" : kind == 'i' ? "int" : kind == 'u' ? "uint" : kind == 'b' ? "bool" : "type";
  set_dtype(v, '?', bytes, strf("{}{}", name, bytes * 8));
}

TensorView from_cai(nb::handle obj, const char* what) {
  nb::dict cai = nb::cast<nb::dict>(obj.attr("__cuda_array_interface__"));
  TensorView v;
  v.device = DeviceKind::kCuda;
  nb::tuple shape = nb::cast<nb::tuple>(cai["shape"]);
  if (shape.size() > 8) bad(strf("{}: {} dimensions; kiln takes at most 8", what, shape.size()));
  v.ndim = static_cast<int>(shape.size());
  for (int i = 0; i < v.ndim; ++i) v.shape[i] = nb::cast<int64_t>(shape[i]);
  set_typestr(v, nb::cast<std::string>(cai["typestr"]), what);
  v.ptr = nb::cast<uintptr_t>(nb::cast<nb::tuple>(cai["data"])[0]);
  nb::object strides = cai.contains("strides") ? nb::borrow(cai["strides"]) : nb::none();
  int64_t expected = 1;
  for (int i = v.ndim - 1; i >= 0; --i) {
    if (strides.is_none()) {
      v.strides[i] = expected;
    } else {
      int64_t bytes = nb::cast<int64_t>(nb::cast<nb::tuple>(strides)[i]);
      if (bytes % v.itemsize) bad(strf("{}: stride of {} bytes is not a whole number of elements", what, bytes));
      v.strides[i] = bytes / v.itemsize;
    }
    expected *= v.shape[i];
  }
  // The device of a CAI pointer is not part of the protocol: it is the current context's, which the caller
  // already made current (kiln checks the launch, not the pointer).
  v.device_index = -1;
  return v;
}

TorchHandles torch_state;
bool torch_ready = false;

TensorView from_torch(nb::handle obj, const TorchHandles& t) {
  TensorView v;
  v.torch = true;
  v.ptr = nb::cast<uintptr_t>(obj.attr("data_ptr")());
  nb::tuple shape = nb::borrow<nb::tuple>(obj.attr("shape"));
  nb::tuple strides = nb::borrow<nb::tuple>(obj.attr("stride")());
  v.ndim = static_cast<int>(shape.size());
  if (v.ndim > 8) bad(strf("tensor has {} dimensions; kiln takes at most 8", v.ndim));
  for (int i = 0; i < v.ndim; ++i) {
    v.shape[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape.ptr(), i));
    v.strides[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(strides.ptr(), i));
  }
  nb::object dtype = obj.attr("dtype");
  if (dtype.ptr() == t.bf16) set_dtype(v, 'b', 2, "bfloat16");
  else if (dtype.ptr() == t.f16) set_dtype(v, 'h', 2, "float16");
  else if (dtype.ptr() == t.f32) set_dtype(v, 'f', 4, "float32");
  else set_dtype(v, '?', nb::cast<int>(obj.attr("element_size")()), nb::cast<std::string>(nb::str(dtype)));
  int index = nb::cast<int>(obj.attr("get_device")());
  v.device = index >= 0 ? DeviceKind::kCuda : DeviceKind::kCpu;
  v.device_index = index < 0 ? 0 : index;
  return v;
}

}  // namespace

const TorchHandles* torch_handles() {
  if (torch_ready) return &torch_state;
  // torch is never imported by kiln: its handles are taken once the program has imported it.
  PyObject* modules = PyImport_GetModuleDict();
  PyObject* torch = PyDict_GetItemString(modules, "torch");
  if (!torch) return nullptr;
  nb::handle tm(torch);
  if (!nb::hasattr(tm, "Tensor") || !nb::hasattr(tm, "bfloat16")) return nullptr;  // torch still importing
  torch_state.tensor = reinterpret_cast<PyTypeObject*>(tm.attr("Tensor").ptr());
  Py_INCREF(torch_state.tensor);
  torch_state.f16 = tm.attr("float16").inc_ref().ptr();
  torch_state.bf16 = tm.attr("bfloat16").inc_ref().ptr();
  torch_state.f32 = tm.attr("float32").inc_ref().ptr();
  nb::object c = tm.attr("_C");
  if (nb::hasattr(c, "_cuda_getCurrentRawStream")) {
    torch_state.current_raw_stream = c.attr("_cuda_getCurrentRawStream").inc_ref().ptr();
  }
  torch_ready = true;
  return &torch_state;
}

templates::DType TensorView::kiln_dtype() const {
  return dtype_code == 'h' ? templates::DType::kF16 : dtype_code == 'b' ? templates::DType::kBF16 : templates::DType::kF32;
}

bool TensorView::contiguous() const {
  int64_t expected = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

TensorView tensor_view(nb::handle obj, const char* what, intptr_t stream) {
  const TorchHandles* t = torch_handles();
  if (t && PyObject_TypeCheck(obj.ptr(), t->tensor)) return from_torch(obj, *t);
  if (nb::hasattr(obj, "__cuda_array_interface__")) return from_cai(obj, what);
  if (nb::hasattr(obj, "__dlpack__")) return from_dlpack(obj, what, stream);
  bad(strf("{}: expected a tensor (torch, __cuda_array_interface__ or __dlpack__), got {}", what,
                  nb::cast<std::string>(nb::str(obj.type().attr("__name__")))));
}

uintptr_t resolve_stream(nb::handle stream, const TensorView& t) {
  if (stream.is_valid() && !stream.is_none()) {
    if (PyLong_Check(stream.ptr())) return nb::cast<uintptr_t>(stream);
    if (nb::hasattr(stream, "__cuda_stream__")) return nb::cast<uintptr_t>(nb::cast<nb::tuple>(stream.attr("__cuda_stream__")())[1]);
    if (nb::hasattr(stream, "cuda_stream")) return nb::cast<uintptr_t>(stream.attr("cuda_stream"));  // torch.cuda.Stream
    if (nb::hasattr(stream, "ptr")) return nb::cast<uintptr_t>(stream.attr("ptr"));                  // cupy.cuda.Stream
    bad(strf("stream: expected an int handle or a stream object, got {}",
                    nb::cast<std::string>(nb::str(stream.type().attr("__name__")))));
  }
  if (t.torch) {
    const TorchHandles* th = torch_handles();
    if (th && th->current_raw_stream) return nb::cast<uintptr_t>(nb::handle(th->current_raw_stream)(t.device_index));
  }
  return 0;
}

void bind_tensor(nb::module_& m) {
  // What kiln reads from a tensor, for tests and for debugging an interop problem.
  m.def("_tensor_info", [](nb::handle obj) {
    TensorView v = tensor_view(obj, "tensor");
    nb::dict d;
    d["ptr"] = v.ptr;
    nb::list shape, strides;
    for (int i = 0; i < v.ndim; ++i) shape.append(v.shape[i]), strides.append(v.strides[i]);
    d["shape"] = nb::tuple(shape);
    d["strides"] = nb::tuple(strides);
    d["dtype"] = v.dtype_name;
    d["device"] = v.device == DeviceKind::kCuda ? "cuda" : v.device == DeviceKind::kCpu ? "cpu" : "other";
    d["device_index"] = v.device_index;
    d["torch"] = v.torch;
    return d;
  });
  m.def("_resolve_stream", [](nb::handle obj, nb::handle stream) {
    return resolve_stream(stream, obj.is_none() ? TensorView{} : tensor_view(obj, "tensor"));
  }, nb::arg("tensor").none(), nb::arg("stream").none());
}

}  // namespace kiln::py
