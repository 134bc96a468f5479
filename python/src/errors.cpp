#include "errors.h"

#include <nanobind/stl/string.h>

#include <array>

namespace nb = nanobind;

namespace kiln::py {
namespace {

// kiln.errors' classes by ErrorCode, handed over by kiln/__init__.py (the hierarchy is plain Python so that
// it can be documented, subclassed and pickled like any exception).
std::array<PyObject*, 32> error_classes{};
PyObject* base_class = nullptr;
PyObject* capture_miss_class = nullptr;

}  // namespace

void raise(const Status& status) {
  auto index = static_cast<size_t>(status.code());
  PyObject* cls = index < error_classes.size() && error_classes[index] ? error_classes[index] : base_class;
  // A miss inside CUDA-graph capture (tuner.cpp marks it) has its own class: kiln.torch falls back on it.
  if (status.detail() == "capture-miss" && capture_miss_class) cls = capture_miss_class;
  if (!cls) throw std::runtime_error(status.to_string());
  nb::list context;
  for (const auto& c : status.context()) context.append(nb::str(c.c_str(), c.size()));
  nb::object err = nb::borrow(cls)(nb::str(status.to_string().c_str()));
  err.attr("code") = nb::str(std::string(code_name(status.code())).c_str());
  err.attr("message") = nb::str(status.message().c_str(), status.message().size());
  err.attr("detail") = nb::str(status.detail().c_str(), status.detail().size());
  err.attr("context") = context;
  PyErr_SetObject(cls, err.ptr());
  throw nb::python_error();
}

bool is_capture_miss(nb::python_error& e) { return capture_miss_class && e.matches(capture_miss_class); }

void bind_errors(nb::module_& m) {
  m.def("_set_error_classes", [](nb::handle base, nb::dict by_code, nb::handle capture_miss) {
    base_class = base.inc_ref().ptr();
    capture_miss_class = capture_miss.inc_ref().ptr();
    for (auto [k, v] : by_code) {
      auto code = nb::cast<size_t>(k);
      if (code < error_classes.size()) error_classes[code] = v.inc_ref().ptr();
    }
  });
  nb::dict codes;
  for (int c = 0; c <= static_cast<int>(ErrorCode::kWrongResult); ++c) {
    codes[nb::str(std::string(code_name(static_cast<ErrorCode>(c))).c_str())] = c;
  }
  m.attr("error_codes") = codes;
  // Tests raise every code through the same path as a failing call.
  m.def("_raise_status", [](int code, std::string message, std::string detail) {
    raise(Status(static_cast<ErrorCode>(code), std::move(message), std::move(detail)).with_context("in a test"));
  });
}

}  // namespace kiln::py
