// kiln::Status -> a kiln.KilnError subclass carrying kiln's message, detail (e.g. NVRTC's log) and context.
#pragma once

#include <nanobind/nanobind.h>

#include "kiln/status.h"

namespace kiln::py {

/// Raises the Python exception for `status` (never returns). Must hold the GIL.
[[noreturn]] void raise(const Status& status);

/// The value of `r`, or raises its error.
template <class T>
T unwrap(Result<T>&& r) {
  if (!r.ok()) raise(r.status());
  return std::move(r).value();
}
inline void check(const Status& s) {
  if (!s.ok()) raise(s);
}

/// True when `e` is kiln.CaptureMissError (a miss inside CUDA-graph capture with nothing to run).
bool is_capture_miss(nanobind::python_error& e);

void bind_errors(nanobind::module_& m);

}  // namespace kiln::py
