// Sync points for kiln's own deterministic tests (internal: not installed). Not for production use.
#pragma once

#include <functional>

namespace kiln::testing {

/// Installs `hook` to run each time NVRTC calls kiln's flow callback during a compile that has a stop token
/// (before the token is checked), so a test can request cancellation at a known point mid-compile. Pass an
/// empty function to remove it. Not thread-safe with respect to compiles in flight: set it before starting them.
void set_nvrtc_flow_hook(std::function<void()> hook);

}  // namespace kiln::testing
