#include "huge_text.h"

#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#include <fmt/format.h>

namespace kiln::pool_detail {
namespace {

constexpr std::uintptr_t kHugePage = std::uintptr_t{2} << 20;

struct Segment {
  std::string_view want;
  std::string path;
  std::uintptr_t start = 0;
  std::uintptr_t end = 0;
  std::uint64_t file_offset = 0;
};

int find_segment(dl_phdr_info* info, std::size_t, void* data) {
  auto* seg = static_cast<Segment*>(data);
  if (info->dlpi_name == nullptr) return 0;
  std::string_view name = info->dlpi_name;
  const auto slash = name.rfind('/');
  if ((slash == std::string_view::npos ? name : name.substr(slash + 1)).find(seg->want) == std::string_view::npos) {
    return 0;
  }
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& p = info->dlpi_phdr[i];
    if (p.p_type != PT_LOAD || (p.p_flags & PF_X) == 0) continue;
    seg->path = name;
    seg->start = info->dlpi_addr + p.p_vaddr;
    seg->end = seg->start + p.p_memsz;
    seg->file_offset = p.p_offset;
    return 1;
  }
  return 0;
}

std::string thp_mode() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(f, line);
  const auto open = line.find('['), close = line.find(']');
  return open == std::string::npos || close == std::string::npos ? std::string() : line.substr(open + 1, close - open - 1);
}

// AnonHugePages of the mapping that starts at `start`, in bytes (0 if /proc is not readable).
std::size_t huge_bytes_at(std::uintptr_t start) {
  std::ifstream f("/proc/self/smaps");
  std::string line;
  bool in = false;
  while (std::getline(f, line)) {
    const auto dash = line.find('-');
    if (dash != std::string::npos && dash > 0 && line.find(' ') > dash) {
      // A mapping's header line: "start-end perms ...".
      in = std::strtoull(line.substr(0, dash).c_str(), nullptr, 16) == start;
      continue;
    }
    if (in && line.rfind("AnonHugePages:", 0) == 0) {
      return static_cast<std::size_t>(std::strtoull(line.c_str() + 14, nullptr, 10)) * 1024;
    }
  }
  return 0;
}

Status errno_error(const char* call, const std::string& path) {
  return Status(ErrorCode::kIoError,
                fmt::format("moving the code of {} onto huge pages: {} failed: {}", path, call, std::strerror(errno)));
}

}  // namespace

Result<HugeText> move_text_to_huge_pages(std::string_view library) {
  Segment seg;
  seg.want = library;
  if (library.empty() || ::dl_iterate_phdr(find_segment, &seg) == 0) {
    return make_error(ErrorCode::kNotFound, fmt::format("no loaded library named like '{}'", library));
  }
  const std::string mode = thp_mode();
  if (mode == "never" || mode.empty()) {
    return make_error(ErrorCode::kUnavailable,
                      fmt::format("transparent huge pages are {} on this machine (/sys/kernel/mm/transparent_hugepage)",
                                  mode.empty() ? "not available" : "'never'"));
  }
  // Only the 2 MiB-aligned interior can live on huge pages; the ends stay where they are, file-backed.
  const std::uintptr_t begin = (seg.start + kHugePage - 1) & ~(kHugePage - 1);
  const std::uintptr_t end = seg.end & ~(kHugePage - 1);
  if (end <= begin) {
    return make_error(ErrorCode::kUnavailable,
                      fmt::format("the code of {} ({} bytes) holds no whole huge page", seg.path, seg.end - seg.start));
  }
  const std::size_t len = end - begin;
  // Aligned like the destination, so that mremap moves whole huge pages rather than splitting them.
  void* raw = ::mmap(nullptr, len + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return errno_error("mmap", seg.path);
  const auto raw_at = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t copy = (raw_at + kHugePage - 1) & ~(kHugePage - 1);
  if (copy > raw_at) ::munmap(raw, copy - raw_at);
  if (raw_at + len + kHugePage > copy + len) {
    ::munmap(reinterpret_cast<void*>(copy + len), raw_at + len + kHugePage - (copy + len));
  }
  void* dst = reinterpret_cast<void*>(copy);
  auto undo = [&](const char* call) {
    Status s = errno_error(call, seg.path);
    ::munmap(dst, len);
    return s;
  };
  if (::madvise(dst, len, MADV_HUGEPAGE) != 0) return undo("madvise(MADV_HUGEPAGE)");
  std::memcpy(dst, reinterpret_cast<const void*>(begin), len);
  if (::mprotect(dst, len, PROT_READ | PROT_EXEC) != 0) return undo("mprotect(PROT_READ|PROT_EXEC)");
  // Replaces the file-backed pages at `begin` in one step; on failure the original mapping is untouched.
  if (::mremap(dst, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, reinterpret_cast<void*>(begin)) == MAP_FAILED) {
    return undo("mremap");
  }
  return HugeText{seg.path, begin, seg.file_offset + (begin - seg.start), len, huge_bytes_at(begin)};
}

}  // namespace kiln::pool_detail
