// kiln._C: the extension behind the `kiln` package (python/kiln/__init__.py re-exports it).
#include <nanobind/nanobind.h>

#include "errors.h"
#include "kiln/jit/compiler.h"
#include "kiln/jit/device.h"
#include "kiln/version.h"
#include "tensor.h"

namespace nb = nanobind;

namespace kiln::py {
void bind_ops(nb::module_& m);
void bind_api(nb::module_& m);
void bind_compile(nb::module_& m);
void bind_variants(nb::module_& m);
void bind_collective(nb::module_& m);  // collective.cpp: kiln.distributed
}  // namespace kiln::py

NB_MODULE(_C, m) {
  m.doc() = "kiln's C++ core (use the `kiln` package)";
  kiln::py::bind_errors(m);
  kiln::py::bind_tensor(m);
  kiln::py::bind_ops(m);
  kiln::py::bind_api(m);
  kiln::py::bind_compile(m);
  kiln::py::bind_variants(m);
  kiln::py::bind_collective(m);
  m.def("device_count", [] {
    auto n = kiln::device_count();
    return n.ok() ? *n : 0;
  }, "CUDA devices kiln can use (0 without a driver or a GPU).");
  auto nvrtc = kiln::nvrtc_version();
  m.attr("__version__") = kiln::kKilnVersion;
  m.attr("nvrtc_version") = nb::make_tuple(nvrtc.major, nvrtc.minor);
}
