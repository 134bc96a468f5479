// Any bytes as a workload: parse_workload answers with problems or an error, never a crash, and never
// expands past its limit.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kiln/runtime/workload.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto w = kiln::runtime::parse_workload(std::string(reinterpret_cast<const char*>(data), size));
  if (w.ok() && w->problems.size() > kiln::runtime::kWorkloadProblemsLimit.fallback) std::abort();
  if (w.ok() && w->problems.size() != w->labels.size()) std::abort();
  return 0;
}
