// Moving a loaded shared library's code onto transparent huge pages, for the compile worker.
//
// NVRTC's libnvrtc.so carries ~72 MB of machine code (its front end, NVVM and ptxas). A compile walks through
// much of it; on 4 KiB pages that is thousands of instruction-TLB entries, and in a virtual machine every TLB
// miss is a two-level page walk. The same technique is used for other large binaries (HHVM, MySQL, Intel's
// iodlr "large page remap"); no Debian package offers it as a library, so it is written here: copy the code's
// 2 MiB-aligned interior into anonymous memory advised onto huge pages, make it read+execute, and move it over
// the original addresses with mremap, so every pointer into the library stays valid.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kiln/status.h"

namespace kiln::pool_detail {

struct HugeText {
  std::string path;             // the library's file
  std::uintptr_t address = 0;   // where the moved code starts (2 MiB-aligned)
  std::uint64_t file_offset = 0;  // where those bytes are in the file
  std::size_t bytes_moved = 0;  // the code moved (2 MiB-aligned interior of the executable segment)
  std::size_t huge_bytes = 0;   // of which the kernel backed with huge pages (AnonHugePages of the mapping)
};

/// Moves the executable segment of the loaded object whose file name contains `library` (e.g. "libnvrtc.so")
/// onto transparent huge pages. Call it while no other thread can run that library's code. Errors:
/// kNotFound (no such object loaded), kUnavailable (transparent huge pages off, or a segment too small to
/// hold one huge page), kIoError (a system call refused; the library is left as it was).
Result<HugeText> move_text_to_huge_pages(std::string_view library);

}  // namespace kiln::pool_detail
