// Reading what comes from outside the process (workload files, bundles, environment limits) with a bound.
//
// Every input kiln reads from a path is read through read_file_limited, so a huge file, /dev/zero or a FIFO that
// never ends costs at most the limit and gives an error naming the path, the limit and how to raise it. The
// limits themselves come from the environment (limit_from_env), with documented defaults (docs/reliability.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kiln/status.h"

namespace kiln {

/// A bound on an input: its default, and the environment variable that overrides it.
struct InputLimit {
  std::string_view what;  // "workload file", "bundle file", "problems per workload"
  std::string_view env;   // "KILN_MAX_WORKLOAD_BYTES"
  uint64_t fallback;
};

/// The limit's value: $env when set (a positive integer, optionally with a K, M or G suffix, powers of 1024),
/// else its default. kInvalidArgument naming the variable when it is set to anything else.
Result<uint64_t> limit_value(const InputLimit& limit);

/// The whole content of the file at `path`, which must be at most `max_bytes` long. kNotFound or kIoError
/// naming the path and the cause; kOutOfRange naming the path, the limit and how to raise it. Reads at most
/// max_bytes + 1 bytes, whatever the file is (a device, a FIFO that ends, a file that grows meanwhile).
Result<std::string> read_file_limited(const std::string& path, const InputLimit& limit);

}  // namespace kiln
