// Tensors in without copies: torch tensors (read directly), anything with __cuda_array_interface__ (CuPy,
// Numba, ...) and anything with __dlpack__ (JAX, CuPy, NumPy, torch). A TensorView only borrows: the Python
// object it came from must stay alive for as long as the view is used (the call that made it).
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <string>

#include "kiln/templates/template.h"

namespace kiln::py {

enum class DeviceKind : uint8_t { kCpu, kCuda, kOther };

struct TensorView {
  uintptr_t ptr = 0;
  int ndim = 0;
  int64_t shape[8] = {};
  int64_t strides[8] = {};  // in elements
  char dtype_code = '?';    // 'h' f16, 'b' bf16, 'f' f32, '?' anything else
  int itemsize = 0;
  std::string dtype_name;   // for errors: "float64", "int32", ...
  DeviceKind device = DeviceKind::kOther;
  int device_index = 0;
  bool torch = false;       // a torch.Tensor (its current stream is the default)

  bool has_kiln_dtype() const { return dtype_code != '?'; }
  templates::DType kiln_dtype() const;
  bool contiguous() const;
};

/// Reads `obj` (torch tensor, __cuda_array_interface__, __dlpack__). `stream` is handed to __dlpack__ so the
/// producer orders its work before ours (-1: unknown). Raises kiln.InvalidArgument naming `what` for anything
/// else.
TensorView tensor_view(nanobind::handle obj, const char* what, intptr_t stream = -1);

/// The stream to launch on: `stream` if given (an int handle, an object with .cuda_stream / .ptr, or
/// __cuda_stream__), else torch's current stream when `t` is a torch tensor, else the legacy default stream.
uintptr_t resolve_stream(nanobind::handle stream, const TensorView& t);

/// The torch module's handles the fast path uses, once torch is imported (null before). Strong references,
/// never released: a static's destructor would drop them after the interpreter is gone (a crash at exit).
struct TorchHandles {
  PyTypeObject* tensor = nullptr;
  PyObject* current_raw_stream = nullptr;  // torch._C._cuda_getCurrentRawStream (absent in CPU-only torch)
  PyObject* f16 = nullptr;
  PyObject* bf16 = nullptr;
  PyObject* f32 = nullptr;
};
const TorchHandles* torch_handles();

void bind_tensor(nanobind::module_& m);

}  // namespace kiln::py
