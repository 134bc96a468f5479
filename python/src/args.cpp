#include "args.h"

#include <dlfcn.h>

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>

#include "errors.h"
#include "kiln/jit/driver.h"
#include "tensor.h"
#include "text.h"

namespace nb = nanobind;

namespace kiln::py {
namespace {

[[noreturn]] void bad(const std::string& message) { raise(make_error(ErrorCode::kInvalidArgument, message)); }

// cuFuncGetParamInfo (driver 12.4+) is not among the entry points kiln's driver table resolves: take it from
// the same library kiln loaded.
using ParamInfoFn = CUresult (*)(CUfunction, size_t, size_t*, size_t*);
ParamInfoFn param_info_fn() {
  static ParamInfoFn fn = [] () -> ParamInfoFn {
    auto d = driver();
    if (!d.ok()) return nullptr;
    void* lib = dlopen((*d)->library.c_str(), RTLD_NOW | RTLD_NOLOAD);
    return lib ? reinterpret_cast<ParamInfoFn>(dlsym(lib, "cuFuncGetParamInfo")) : nullptr;
  }();
  return fn;
}

}  // namespace

// Parameter sizes from the driver; 0 where unknown (then ints and floats are 8 bytes: pass a sized
// NumPy/ctypes scalar for a 4-byte parameter).
std::vector<size_t> param_sizes(CUfunction f, size_t count, const std::string& name) {
  std::vector<size_t> sizes(count, 0);
  ParamInfoFn fn = param_info_fn();
  if (!fn) return sizes;
  size_t i = 0;
  for (; i < count; ++i) {
    size_t offset = 0, size = 0;
    if (fn(f, i, &offset, &size) != CUDA_SUCCESS) break;
    sizes[i] = size;
  }
  auto exists = [&](size_t index) {
    size_t offset = 0, size = 0;
    return fn(f, index, &offset, &size) == CUDA_SUCCESS;
  };
  if (i != count || exists(count)) {
    size_t actual = i;
    while (exists(actual)) ++actual;
    bad(strf("kernel '{}' takes {} arguments, {} given", name, actual, count));
  }
  return sizes;
}

void pack(nb::handle a, size_t size, unsigned char* out, size_t index) {
  auto wrong = [&](const std::string& why) { bad(strf("argument {}: {}", index, why)); };
  if (a.is_none()) {
    std::memset(out, 0, 8);
  } else if (PyBool_Check(a.ptr())) {
    out[0] = a.ptr() == Py_True;
  } else if (PyLong_Check(a.ptr())) {
    const size_t n = size ? size : 8;
    if (n == 8) {
      int64_t v = nb::cast<int64_t>(a);
      std::memcpy(out, &v, 8);
    } else if (n == 4) {
      int32_t v = nb::cast<int32_t>(a);
      std::memcpy(out, &v, 4);
    } else if (n == 2 || n == 1) {
      int64_t v = nb::cast<int64_t>(a);
      std::memcpy(out, &v, n);
    } else {
      wrong(strf("an int for a {}-byte parameter", n));
    }
  } else if (PyFloat_Check(a.ptr())) {
    const size_t n = size ? size : 8;
    double v = nb::cast<double>(a);
    if (n == 8) std::memcpy(out, &v, 8);
    else if (n == 4) { float f = float(v); std::memcpy(out, &f, 4); }
    else wrong(strf("a float for a {}-byte parameter", n));
  } else if (nb::hasattr(a, "__cuda_array_interface__") || nb::hasattr(a, "__dlpack__") ||
             (torch_handles() && PyObject_TypeCheck(a.ptr(), torch_handles()->tensor))) {
    TensorView v = tensor_view(a, "argument");
    if (v.device != DeviceKind::kCuda) wrong("a tensor on the CPU");
    if (size && size != 8) wrong(strf("a tensor (pointer) for a {}-byte parameter", size));
    std::memcpy(out, &v.ptr, 8);
  } else if (PyObject_CheckBuffer(a.ptr())) {
    // NumPy scalars, ctypes values, bytes: their raw bytes (e.g. np.float16(1) for a __half).
    Py_buffer view;
    if (PyObject_GetBuffer(a.ptr(), &view, PyBUF_SIMPLE) != 0) throw nb::python_error();
    size_t n = static_cast<size_t>(view.len);
    bool fits = !size || n == size;
    if (fits) std::memcpy(out, view.buf, n);
    PyBuffer_Release(&view);
    if (!fits) wrong(strf("{} bytes for a {}-byte parameter", n, size));
  } else if (nb::hasattr(a, "dtype") && nb::hasattr(a, "tobytes")) {
    nb::bytes b = nb::cast<nb::bytes>(a.attr("tobytes")());  // NumPy scalars without the buffer protocol
    if (size && b.size() != size) wrong(strf("{} bytes for a {}-byte parameter", b.size(), size));
    std::memcpy(out, b.c_str(), b.size());
  } else {
    wrong(strf("cannot pass a {} to a kernel", nb::cast<std::string>(nb::str(a.type().attr("__name__")))));
  }
}

Dim3 dim3_of(nb::handle h, const char* what) {
  Dim3 d;
  if (PyLong_Check(h.ptr())) {
    d.x = nb::cast<unsigned>(h);
    return d;
  }
  auto v = nb::cast<std::vector<unsigned>>(h);
  if (v.empty() || v.size() > 3) bad(strf("{}: an int or 1 to 3 ints", what));
  d.x = v[0];
  if (v.size() > 1) d.y = v[1];
  if (v.size() > 2) d.z = v[2];
  return d;
}

PackedArgs::PackedArgs(nb::sequence args, const std::vector<size_t>& sizes) {
  const size_t count = sizes.size();
  std::vector<size_t> offsets(count);
  size_t total = 0;
  for (size_t i = 0; i < count; ++i) offsets[i] = (total = (total + 7) / 8 * 8), total += sizes[i] ? sizes[i] : 8;
  storage.assign(total + 8, 0);
  pointers.assign(count + 1, nullptr);
  for (size_t i = 0; i < count; ++i) {
    pack(args[i], sizes[i], storage.data() + offsets[i], i);
    pointers[i] = storage.data() + offsets[i];
  }
}

}  // namespace kiln::py
