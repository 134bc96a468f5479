// kiln's JIT core in one include: status, targets, sources, keys, NVRTC compile, driver objects, modules.
#pragma once

#include "kiln/jit/compiler.h"
#include "kiln/jit/device.h"
#include "kiln/jit/driver.h"
#include "kiln/jit/kernel_source.h"
#include "kiln/jit/key.h"
#include "kiln/jit/lazy_kernel.h"
#include "kiln/jit/module.h"
#include "kiln/jit/target.h"
#include "kiln/status.h"
