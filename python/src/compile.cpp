// kiln.compile(source, ...) -> Kernel: NVRTC through kiln's JIT core (no GPU needed to compile), loaded into
// the current context at the first launch; Kernel.launch packs its arguments as args.h says.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <mutex>
#include <optional>
#include <regex>

#include "args.h"
#include "errors.h"
#include "kiln/jit/compiler.h"
#include "kiln/jit/device.h"
#include "kiln/jit/module.h"
#include "tensor.h"
#include "text.h"

namespace nb = nanobind;

namespace kiln::py {
namespace {

[[noreturn]] void bad(const std::string& message) { raise(make_error(ErrorCode::kInvalidArgument, message)); }

class PyKernel {
 public:
  PyKernel(std::shared_ptr<const Binary> binary, std::string entry) : binary_(std::move(binary)), entry_(std::move(entry)) {}

  const Binary& binary() const { return *binary_; }
  const std::string& entry() const { return entry_; }

  std::shared_ptr<PyKernel> get(const std::string& name_expression) const {
    bool known = name_expression == binary_->entry;
    for (const auto& [expr, lowered] : binary_->lowered_names) known = known || expr == name_expression;
    if (!known) bad(strf("'{}' is not a kernel of this program (its name expressions and entry)", name_expression));
    return std::make_shared<PyKernel>(binary_, name_expression);
  }

  void launch(nb::handle grid, nb::handle block, nb::sequence args, nb::handle stream_arg, unsigned shared_mem) {
    const Kernel& k = loaded();
    LaunchConfig cfg;
    cfg.grid = dim3_of(grid, "grid");
    cfg.block = dim3_of(block, "block");
    cfg.shared_bytes = shared_mem;
    cfg.stream = reinterpret_cast<CUstream>(resolve_stream(stream_arg, TensorView{}));
    PackedArgs packed(args, param_sizes(k.get(), nb::len(args), k.name()));
    Status s;
    {
      nb::gil_scoped_release release;
      s = k.launch(cfg, packed.pointers.data());
    }
    check(s);
  }

 private:
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
