// A text file built into a kiln library (templates, sample kernels), so the runtime never reads the source tree.
#pragma once

#include <span>
#include <string_view>

namespace kiln {

struct EmbeddedFile {
  std::string_view name;      // path relative to its folder, e.g. "gemm/mma_sm80.cu"
  std::string_view contents;
};

}  // namespace kiln
