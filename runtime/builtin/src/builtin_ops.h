// The built-in op definitions default_ops() starts with.
#pragma once

#include <vector>

#include "kiln/runtime/ops.h"

namespace kiln::runtime::detail {

std::vector<OpDef> builtin_ops();

}  // namespace kiln::runtime::detail
