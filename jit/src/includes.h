// How kiln follows a kernel source's #include directives: for its content key (key.cpp) and for the check
// that a compile reads nothing outside its include folders (compiler.cpp). Internal.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kiln/jit/kernel_source.h"
#include "kiln/status.h"

namespace kiln::detail {

struct IncludeDirective {
  std::string name;       // the spelling between the quotes or brackets; for a computed one, the macro text
  bool quoted = false;    // "name": searched next to the includer first
  bool computed = false;  // #include MACRO
};

/// Every #include directive of `text`, taken or not (see key.cpp).
std::vector<IncludeDirective> scan_includes(std::string_view text);
/// A header on disk larger than this is hashed in pieces and its own #include lines are not followed: the key
/// never holds a whole file in memory (a 40 GB file named by an include would otherwise be read at once).
inline constexpr size_t kHeaderScanBytes = size_t{64} << 20;
/// `text` with line splices joined and comments replaced by a space (newlines kept): what scan_includes reads.
std::string directive_view(std::string_view text);

/// One directive met while following a source's includes.
struct IncludeUse {
  IncludeDirective directive;
  std::string includer;  // the file that holds it; empty for the source itself or an in-memory header
  std::string path;      // where it resolved on disk; empty: in memory, built into NVRTC, or computed
  std::string hash;      // the file's content hash (hex), "?" when not on disk
};

/// Every directive reachable from `source` (the source, its in-memory headers, and each file found on disk
/// through the source's include dirs, its -I options and `cuda_dirs`), each file followed once.
std::vector<IncludeUse> walk_includes(const KernelSource& source, const std::vector<std::string>& cuda_dirs);

/// kInvalidArgument naming the directive and the file that holds it when a directive of `source` reads a
/// file outside every include folder (an absolute path, `..`, a symbolic link out) or cannot be checked (a
/// computed #include in the source or an in-memory header; in a header of the include folders it is the
/// folder's own); its content is never read into a message. OK when every one stays inside.
Status check_includes(const KernelSource& source, const std::vector<std::string>& cuda_dirs);

/// True when $KILN_ALLOW_OUTSIDE_INCLUDES is 1: the opt-in that lets compiles read includes anywhere.
bool outside_includes_allowed_by_env();

}  // namespace kiln::detail
