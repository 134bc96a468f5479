// KILN_CHECK support for NVRTC results (Driver API results are declared in kiln/jit/driver.h).
#pragma once

#include <nvrtc.h>

#include "kiln/jit/driver.h"
#include "kiln/status.h"

namespace kiln {

/// Converts an NVRTC result into a Status naming the call and NVRTC's error string.
Status to_status(nvrtcResult result, const char* expr, const char* file, int line);

}  // namespace kiln
