// The templates' process-wide switches read from the environment.
#pragma once

#include <cstdlib>
#include <cstring>

namespace kiln::templates::detail {

/// A switch that is on unless the variable `name` is "0" or "off" (unset: on).
inline bool env_switch_on(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || (std::strcmp(v, "0") != 0 && std::strcmp(v, "off") != 0);
}

}  // namespace kiln::templates::detail
