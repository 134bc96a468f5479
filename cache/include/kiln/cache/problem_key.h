// ProblemKey: the canonical name of one tuning problem (what is computed, on which device, with which
// versions), under which the cache stores per-choice timings and the decision.
//
// Everything that can change which choice is fastest goes in: the op, its operands (dtype, layout, shape),
// the epilogue, any other attribute the op names, the device (name, SM count, compute capability) and the
// versions that can change a timing (driver, CUDA, cuBLAS, kiln). The canonical form is a printable,
// parseable string; two keys are the same problem exactly when their canonical strings are equal.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/jit/device.h"
#include "kiln/status.h"

namespace kiln::cache {

/// One input or output of the op.
struct Operand {
  std::string dtype;            // "f16", "bf16", "f32", "e4m3", ...
  std::string layout;           // "row", "col", "nhwc", ...; may be empty
  std::vector<int64_t> shape;   // {16, 4096}; empty for a scalar

  bool operator==(const Operand&) const = default;
};

/// The device a problem was measured on: the properties that change timings, never the ordinal.
struct DeviceFingerprint {
  std::string name;   // "NVIDIA H200"
  int sm_count = 0;   // 132
  int cc_major = 0;   // 9
  int cc_minor = 0;   // 0

  /// The fingerprint of `info` (no driver call).
  static DeviceFingerprint from(const DeviceInfo& info);
  /// The fingerprint of device `ordinal`. Errors: kNoDriver / kNoDevice.
  static Result<DeviceFingerprint> of_device(int ordinal = 0);

  bool operator==(const DeviceFingerprint&) const = default;
};

/// The versions that can change a timing.
struct VersionStamp {
  int driver = 0;       // cuDriverGetVersion, e.g. 13000; 0 where no driver could be loaded
  std::string cuda;     // the CUDA toolkit (NVRTC) version, "13.0"
  std::string cublas;   // cuBLAS's version, e.g. "130100"; filled by the runtime, empty when unknown
  std::string kiln;     // kiln's version, "0.1.0"

  /// This process's driver (0 when none loads), NVRTC and kiln versions, with `cublas` as given.
  /// Thread-safe; the driver is loaded once per process.
  static VersionStamp current(std::string cublas = {});

  bool operator==(const VersionStamp&) const = default;
};

struct ProblemKey {
  std::string op;                                            // "gemm", "rmsnorm", "allreduce"
  std::vector<Operand> operands;                             // inputs, then outputs, in the op's order
  std::string epilogue;                                      // "bias_gelu"; empty for none
  /// Anything else that changes the choice (split-k allowed, TP size, ...). Order does not matter: the
  /// canonical form sorts them by name.
  std::vector<std::pair<std::string, std::string>> attributes;
  DeviceFingerprint device;
  VersionStamp versions;

  /// The canonical string, e.g.
  /// `p1;dev=NVIDIA H200,132,9.0;drv=13000;cuda=13.0;kiln=0.1.0;cublas=;op=gemm;t=f16/row/16x4096,...;epi=;a=`.
  /// Reserved characters inside names (`% ; , = /`, control characters) are percent-encoded, so any
  /// string round-trips through parse(). Deterministic: the same key gives the same bytes in every
  /// process and on every machine. Costs a few hundred nanoseconds: callers on a hot path keep the string.
  std::string canonical() const;

  /// The inverse of canonical(). Errors: kInvalidArgument naming what is malformed.
  static Result<ProblemKey> parse(std::string_view canonical);

  bool operator==(const ProblemKey& other) const { return canonical() == other.canonical(); }
};

/// The leading part of canonical() that names the device and versions but no problem: every problem
/// measured on `device` with `versions` starts with it (used to list one device's decisions).
std::string environment_prefix(const DeviceFingerprint& device, const VersionStamp& versions);

}  // namespace kiln::cache
