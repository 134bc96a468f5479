// Internal: what every timing and decision gets before it is kept, in the store and in tune mode `off`
// (which keeps results only in memory) alike, so both accept and stamp the same records.
#pragma once

#include "kiln/cache/records.h"
#include "kiln/status.h"

namespace kiln::cache {

/// Checks that the record names a problem and a choice (kInvalidArgument otherwise), then fills its stamp
/// (measured_at_ns / decided_at_ns) with now when 0 and its toolchain with `toolchain` when its kiln field is
/// empty.
Status stamp_record(TimingRecord& timing, const Toolchain& toolchain);
Status stamp_record(Decision& decision, const Toolchain& toolchain);

}  // namespace kiln::cache
