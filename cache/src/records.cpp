#include "kiln/cache/records.h"

#include <fmt/format.h>

#include <chrono>

#include "kiln/jit/compiler.h"
#include "kiln/jit/driver.h"
#include "kiln/version.h"
#include "stamp.h"

namespace kiln::cache {
namespace {

template <class Record>
Status stamp(Record& record, int64_t& stamp_ns, const char* what, const Toolchain& toolchain) {
  if (record.problem.empty() || record.choice.empty()) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("{} needs a problem and a choice name", what));
  }
  if (stamp_ns == 0) stamp_ns = now_ns();
  if (record.toolchain.kiln.empty()) record.toolchain = toolchain;
  return Status();
}

}  // namespace

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

Status stamp_record(TimingRecord& t, const Toolchain& toolchain) {
  return stamp(t, t.measured_at_ns, "a timing", toolchain);
}

Status stamp_record(Decision& d, const Toolchain& toolchain) {
  return stamp(d, d.decided_at_ns, "a decision", toolchain);
}

}  // namespace kiln::cache
