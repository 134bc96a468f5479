// Target: the GPU architecture a kernel is compiled for ("sm_80", "sm_90", "sm_90a").
#pragma once

#include <string>
#include <string_view>

#include "kiln/status.h"

namespace kiln {

struct Target {
  std::string arch;  // "sm_90"; an "a" suffix selects arch-specific features (wgmma, setmaxnreg)

  /// Validates "sm_<major><minor>[a|f]", e.g. "sm_90a". kInvalidArgument otherwise.
  static Result<Target> parse(std::string_view arch);
  /// The real architecture of device `ordinal` ("sm_90" on an H100/H200). Needs a driver and a device.
  static Result<Target> from_device(int ordinal = 0);

  /// 90 for "sm_90" and "sm_90a".
  int compute_capability() const;
  /// True for arch-specific targets ("sm_90a").
  bool arch_specific() const;

  bool operator==(const Target&) const = default;
};

}  // namespace kiln
