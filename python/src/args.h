// Kernel arguments from Python, packed by the kernel's own parameter sizes (cuFuncGetParamInfo): an int goes
// to an `int` as 4 bytes and to a `long long` as 8; tensors pass their device pointer, NumPy/ctypes scalars
// their bytes, None a null pointer. Shared by Kernel.launch and kiln.tune's variants.
#pragma once

#include <cuda.h>
#include <nanobind/nanobind.h>

#include <string>
#include <vector>

#include "kiln/jit/module.h"

namespace kiln::py {

/// The sizes of `f`'s parameters; raises kiln.InvalidArgumentError when it does not take `count` of them.
/// Entries are 0 where the driver cannot tell (before 12.4): ints and floats are then 8 bytes.
std::vector<size_t> param_sizes(CUfunction f, size_t count, const std::string& name);

/// An int or 1 to 3 ints as a launch dimension (kiln.InvalidArgumentError naming `what` otherwise).
Dim3 dim3_of(nanobind::handle h, const char* what);

/// Every argument's bytes at its parameter's offset in one buffer, and a pointer to each (what
/// cuLaunchKernel takes). Raises kiln.InvalidArgumentError naming an argument that does not fit.
struct PackedArgs {
  PackedArgs(nanobind::sequence args, const std::vector<size_t>& sizes);
  std::vector<unsigned char> storage;
  std::vector<void*> pointers;  // null-terminated
};

}  // namespace kiln::py
