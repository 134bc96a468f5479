#include "kiln/cache/records.h"

#include <fmt/format.h>

#include <chrono>

#include "kiln/jit/compiler.h"
#include "kiln/jit/driver.h"
#include "kiln/version.h"

namespace kiln::cache {

const Toolchain& Toolchain::current() {
  static const Toolchain t = [] {
    Toolchain t;
    NvrtcVersion nv = nvrtc_version();
    t.nvrtc_major = nv.major;
    t.nvrtc_minor = nv.minor;
    auto d = ::kiln::driver();
    t.driver = d.ok() ? (*d)->driver_version : 0;
    t.kiln = kKilnVersion;
    return t;
  }();
  return t;
}

std::string Toolchain::str() const {
  return fmt::format("NVRTC {}.{}, driver {}, kiln {}", nvrtc_major, nvrtc_minor, driver, kiln);
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace kiln::cache
