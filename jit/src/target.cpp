#include "kiln/jit/target.h"

#include <cctype>

#include <fmt/format.h>

#include "kiln/jit/device.h"

namespace kiln {

Result<Target> Target::parse(std::string_view arch) {
  auto bad = [&] {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("'{}' is not a GPU architecture: expected sm_<major><minor>[a|f], e.g. sm_90 "
                                  "or sm_90a",
                                  arch));
  };
  if (arch.substr(0, 3) != "sm_") return bad();
  std::string_view rest = arch.substr(3);
  if (!rest.empty() && (rest.back() == 'a' || rest.back() == 'f')) rest.remove_suffix(1);
  if (rest.size() < 2 || rest.size() > 3) return bad();
  for (char c : rest) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return bad();
  }
  return Target{std::string(arch)};
}

Result<Target> Target::from_device(int ordinal) {
  KILN_ASSIGN_OR_RETURN(DeviceInfo info, device_info(ordinal));
  return Target{info.arch()};
}

int Target::compute_capability() const {
  int cc = 0;
  for (char c : arch.substr(3)) {
    if (std::isdigit(static_cast<unsigned char>(c))) cc = cc * 10 + (c - '0');
  }
  return cc;
}

bool Target::arch_specific() const { return !arch.empty() && (arch.back() == 'a' || arch.back() == 'f'); }

}  // namespace kiln
