// kiln.compile(source, ...) -> Kernel: NVRTC through kiln's JIT core (no GPU needed to compile), loaded into
// the current context at the first launch. Kernel.launch packs Python arguments by the kernel's own parameter
// sizes (cuFuncGetParamInfo), so an int goes to an `int` as 4 bytes and to a `long long` as 8.
#include <dlfcn.h>
#include <fmt/format.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <mutex>
#include <optional>
#include <regex>

#include "errors.h"
#include "kiln/jit/compiler.h"
#include "kiln/jit/device.h"
#include "kiln/jit/driver.h"
#include "kiln/jit/module.h"
#include "tensor.h"

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

class PyKernel {
 public:
  PyKernel(std::shared_ptr<const Binary> binary, std::string entry) : binary_(std::move(binary)), entry_(std::move(entry)) {}

  const Binary& binary() const { return *binary_; }
  const std::string& entry() const { return entry_; }

  std::shared_ptr<PyKernel> get(const std::string& name_expression) const {
    bool known = name_expression == binary_->entry;
    for (const auto& [expr, lowered] : binary_->lowered_names) known = known || expr == name_expression;
    if (!known) bad(fmt::format("'{}' is not a kernel of this program (its name expressions and entry)", name_expression));
    return std::make_shared<PyKernel>(binary_, name_expression);
  }

  void launch(nb::handle grid, nb::handle block, nb::sequence args, nb::handle stream_arg, unsigned shared_mem) {
    const Kernel& k = loaded();
    LaunchConfig cfg;
    cfg.grid = dim3(grid, "grid");
    cfg.block = dim3(block, "block");
    cfg.shared_bytes = shared_mem;
    cfg.stream = reinterpret_cast<CUstream>(resolve_stream(stream_arg, TensorView{}));
    // Every argument's bytes at its parameter's offset in one buffer; cuLaunchKernel takes a pointer to each.
    const size_t count = nb::len(args);
    std::vector<size_t> sizes = param_sizes(k, count);
    std::vector<size_t> offsets(count);
    size_t total = 0;
    for (size_t i = 0; i < count; ++i) offsets[i] = (total = (total + 7) / 8 * 8), total += sizes[i] ? sizes[i] : 8;
    std::vector<unsigned char> storage(total + 8);
    std::vector<void*> pointers(count + 1, nullptr);
    for (size_t i = 0; i < count; ++i) {
      pack(args[i], sizes[i], storage.data() + offsets[i], i);
      pointers[i] = storage.data() + offsets[i];
    }
    Status s;
    {
      nb::gil_scoped_release release;
      s = k.launch(cfg, pointers.data());
    }
    check(s);
  }

 private:
  static Dim3 dim3(nb::handle h, const char* what) {
    Dim3 d;
    if (PyLong_Check(h.ptr())) {
      d.x = nb::cast<unsigned>(h);
      return d;
    }
    auto v = nb::cast<std::vector<unsigned>>(h);
    if (v.empty() || v.size() > 3) bad(fmt::format("{}: an int or 1 to 3 ints", what));
    d.x = v[0];
    if (v.size() > 1) d.y = v[1];
    if (v.size() > 2) d.z = v[2];
    return d;
  }

  // Parameter sizes from the driver; 0 where unknown (then ints and floats are 8 bytes: pass a sized
  // NumPy/ctypes scalar for a 4-byte parameter).
  static std::vector<size_t> param_sizes(const Kernel& k, size_t count) {
    std::vector<size_t> sizes(count, 0);
    ParamInfoFn fn = param_info_fn();
    if (!fn) return sizes;
    size_t i = 0;
    for (; i < count; ++i) {
      size_t offset = 0, size = 0;
      if (fn(k.get(), i, &offset, &size) != CUDA_SUCCESS) break;
      sizes[i] = size;
    }
    if (i != count || fn(k.get(), count, nullptr, nullptr) == CUDA_SUCCESS) {
      size_t actual = i;
      while (fn(k.get(), actual, nullptr, nullptr) == CUDA_SUCCESS) ++actual;
      bad(fmt::format("kernel '{}' takes {} arguments, {} given", k.name(), actual, count));
    }
    return sizes;
  }

  static void pack(nb::handle a, size_t size, unsigned char* out, size_t index) {
    auto wrong = [&](const std::string& why) { bad(fmt::format("argument {}: {}", index, why)); };
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
        wrong(fmt::format("an int for a {}-byte parameter", n));
      }
    } else if (PyFloat_Check(a.ptr())) {
      const size_t n = size ? size : 8;
      double v = nb::cast<double>(a);
      if (n == 8) std::memcpy(out, &v, 8);
      else if (n == 4) { float f = float(v); std::memcpy(out, &f, 4); }
      else wrong(fmt::format("a float for a {}-byte parameter", n));
    } else if (nb::hasattr(a, "__cuda_array_interface__") || nb::hasattr(a, "__dlpack__") ||
               (torch_handles() && PyObject_TypeCheck(a.ptr(), torch_handles()->tensor))) {
      TensorView v = tensor_view(a, "argument");
      if (v.device != DeviceKind::kCuda) wrong("a tensor on the CPU");
      if (size && size != 8) wrong(fmt::format("a tensor (pointer) for a {}-byte parameter", size));
      std::memcpy(out, &v.ptr, 8);
    } else if (PyObject_CheckBuffer(a.ptr())) {
      // NumPy scalars, ctypes values, bytes: their raw bytes (e.g. np.float16(1) for a __half).
      Py_buffer view;
      if (PyObject_GetBuffer(a.ptr(), &view, PyBUF_SIMPLE) != 0) throw nb::python_error();
      size_t n = static_cast<size_t>(view.len);
      bool fits = !size || n == size;
      if (fits) std::memcpy(out, view.buf, n);
      PyBuffer_Release(&view);
      if (!fits) wrong(fmt::format("{} bytes for a {}-byte parameter", n, size));
    } else if (nb::hasattr(a, "dtype") && nb::hasattr(a, "tobytes")) {
      nb::bytes b = nb::cast<nb::bytes>(a.attr("tobytes")());  // NumPy scalars without the buffer protocol
      if (size && b.size() != size) wrong(fmt::format("{} bytes for a {}-byte parameter", b.size(), size));
      std::memcpy(out, b.c_str(), b.size());
    } else {
      wrong(fmt::format("cannot pass a {} to a kernel", nb::cast<std::string>(nb::str(a.type().attr("__name__")))));
    }
  }

  const Kernel& loaded() {
    std::lock_guard lock(mu_);
    if (!kernel_) {
      Result<Kernel> k = make_error(ErrorCode::kInternal, "unset");
      {
        nb::gil_scoped_release release;
        auto ctx = current_context();
        if (ctx.ok() && !*ctx) ctx = ensure_context(0);
        if (!ctx.ok()) {
          k = ctx.status();
        } else {
          auto module = Module::load(*binary_);
          k = module.ok() ? module->kernel(entry_) : Result<Kernel>(module.status());
        }
      }
      if (!k.ok()) raise(k.status());
      kernel_.emplace(std::move(*k));
    }
    return *kernel_;
  }

  std::shared_ptr<const Binary> binary_;
  std::string entry_;
  std::mutex mu_;
  std::optional<Kernel> kernel_;
};

std::string detect_entry(const std::string& source) {
  static const std::regex global(R"(extern\s+"C"\s+__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(\w+))");
  std::smatch m;
  if (std::regex_search(source, m, global)) return m[1];
  bad("no entry: pass entry= or name_expressions= (no extern \"C\" __global__ function found)");
}

std::shared_ptr<PyKernel> compile(const std::string& source, std::vector<std::string> name_expressions,
                                  std::optional<std::string> arch, std::optional<std::string> entry,
                                  std::string name, std::vector<std::string> options,
                                  std::vector<std::string> include_dirs, std::map<std::string, std::string> headers) {
  KernelSource src;
  src.name = std::move(name);
  src.source = source;
  src.name_expressions = std::move(name_expressions);
  src.entry = entry ? *entry : !src.name_expressions.empty() ? src.name_expressions[0] : detect_entry(source);
  src.options = std::move(options);
  src.include_dirs = std::move(include_dirs);
  for (auto& [n, c] : headers) src.headers.push_back({n, c});
  auto binary = [&]() -> Result<Binary> {
    nb::gil_scoped_release release;
    std::string a;
    if (arch) {
      a = *arch;
    } else {
      auto info = device_info(0);
      if (!info.ok()) return std::move(info).status().with_context("no arch= given, so it is the GPU's");
      a = info->arch();
    }
    KILN_ASSIGN_OR_RETURN(Target t, Target::parse(a));
    return kiln::compile(src, t);
  }();
  if (!binary.ok()) raise(binary.status());
  return std::make_shared<PyKernel>(std::make_shared<const Binary>(std::move(*binary)), src.entry);
}

}  // namespace

void bind_compile(nb::module_& m) {
  nb::class_<PyKernel>(m, "Kernel", "A compiled kernel: kiln.compile's result. Loaded at its first launch.")
      .def_prop_ro("entry", &PyKernel::entry)
      .def_prop_ro("name", [](const PyKernel& k) { return k.binary().name; })
      .def_prop_ro("arch", [](const PyKernel& k) { return k.binary().arch; })
      .def_prop_ro("key", [](const PyKernel& k) { return k.binary().key.hex(); }, "The content key (hex).")
      .def_prop_ro("cubin", [](const PyKernel& k) { return nb::bytes(k.binary().cubin.data(), k.binary().cubin.size()); })
      .def_prop_ro("log", [](const PyKernel& k) { return k.binary().log; })
      .def_prop_ro("compile_seconds", [](const PyKernel& k) { return k.binary().compile_seconds; })
      .def_prop_ro("lowered_names", [](const PyKernel& k) {
        std::map<std::string, std::string> out(k.binary().lowered_names.begin(), k.binary().lowered_names.end());
        return out;
      })
      .def("get", &PyKernel::get, nb::arg("name_expression"),
           "The kernel of another name expression of the same program.")
      .def("launch", &PyKernel::launch, nb::arg("grid"), nb::arg("block"), nb::arg("args"),
           nb::arg("stream").none() = nb::none(), nb::arg("shared_mem") = 0u,
           "launch(grid, block, args, stream=None, shared_mem=0)\n\n"
           "grid, block: an int or up to 3 ints. args: tensors (passed as device pointers), ints and floats\n"
           "(sized by the kernel's parameters), NumPy/ctypes scalars (their bytes), None (a null pointer).\n"
           "stream: an int handle or a stream object; default the legacy default stream. Without the GIL.");
  m.def("compile", &compile, nb::arg("source"), nb::arg("name_expressions") = std::vector<std::string>{},
        nb::arg("arch").none() = nb::none(), nb::arg("entry").none() = nb::none(), nb::arg("name") = "kernel",
        nb::arg("options") = std::vector<std::string>{}, nb::arg("include_dirs") = std::vector<std::string>{},
        nb::arg("headers") = std::map<std::string, std::string>{},
        "compile(source, name_expressions=(), arch=None, entry=None, name='kernel', options=(), include_dirs=(),\n"
        "        headers={}) -> Kernel\n\n"
        "Compiles CUDA C++ with NVRTC (no GPU needed when arch is given, e.g. 'sm_90a'; default: GPU 0's).\n"
        "entry: the kernel to launch (default: the first name expression, else the first extern \"C\"\n"
        "__global__ function). options: NVRTC options ('-DN=4'). headers: {include name: text}.\n"
        "A compile error raises kiln.CompileError with NVRTC's log in .detail. Without the GIL.");
}

}  // namespace kiln::py
