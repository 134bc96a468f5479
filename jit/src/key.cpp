#include "kiln/jit/key.h"

#include <sys/stat.h>
#include <xxhash.h>

#include <limits.h>
#include <stdlib.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <charconv>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <sstream>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "kiln/jit/compiler.h"
#include "includes.h"
#include "options.h"

namespace kiln {

std::string KernelKey::hex() const { return fmt::format("{:016x}{:016x}", high, low); }

Result<KernelKey> KernelKey::parse(std::string_view hex) {
  auto bad = [&] {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("'{}' is not a kernel key (32 hex characters)", hex));
  };
  if (hex.size() != 32) return bad();
  KernelKey k;
  for (auto [part, out] : {std::pair{hex.substr(0, 16), &k.high}, std::pair{hex.substr(16), &k.low}}) {
    auto r = std::from_chars(part.data(), part.data() + part.size(), *out, 16);
    if (r.ec != std::errc() || r.ptr != part.data() + part.size()) return bad();
  }
  return k;
}

std::vector<std::string> canonical_options(const std::vector<std::string>& options) {
  std::vector<std::string> out;
  for (const auto& o : options) {
    if (detail::is_include_path_option(o) || detail::is_pch_option(o)) continue;
    out.push_back(o);
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace detail {

// The text as the preprocessor's directive parser sees it: backslash-newlines spliced and comments replaced
// by a space (newlines kept), so that `#inc\\<newline>lude` or `#/**/include` cannot hide a directive.
// A state machine over characters; runs of characters that change nothing in the current state (most of
// a header) are copied or skipped whole: the first key of a process walks ~3.6 MB of CUDA headers, which a
// character-at-a-time copy took 15 ms for.
std::string directive_view(std::string_view text) {
  enum State { kCode, kLine, kBlock, kString, kChar, kStates };
  // stop[state][c]: c may do something other than being copied (code, strings) or skipped (comments).
  static const auto stop = [] {
    std::array<std::array<bool, 256>, kStates> t{};
    auto mark = [&](State st, std::string_view chars) {
      for (char c : chars) t[st][static_cast<unsigned char>(c)] = true;
    };
    mark(kCode, "/\"'\\");
    mark(kLine, "\n\\");
    mark(kBlock, "*\n\\");
    mark(kString, "\"\n\\");
    mark(kChar, "'\n\\");
    return t;
  }();
  std::string out;
  out.reserve(text.size());
  State state = kCode;
  const size_t n = text.size();
  for (size_t i = 0; i < n; ++i) {
    const auto& stops = stop[state];
    size_t run = i;
    while (run < n && !stops[static_cast<unsigned char>(text[run])]) ++run;
    if (run > i) {
      if (state != kLine && state != kBlock) out.append(text.substr(i, run - i));
      i = run;
      if (i == n) break;
    }
    if (text[i] == '\\' && i + 1 < n && (text[i + 1] == '\n' || (text[i + 1] == '\r' && i + 2 < n && text[i + 2] == '\n'))) {
      i += text[i + 1] == '\r' ? 2 : 1;  // a line splice: as if the two lines were one
      continue;
    }
    const char c = text[i];
    const char next = i + 1 < n ? text[i + 1] : '\0';
    switch (state) {
      case kCode:
        if (c == '/' && next == '/') state = kLine, out.push_back(' '), ++i;
        else if (c == '/' && next == '*') state = kBlock, out.push_back(' '), ++i;
        else {
          if (c == '"') state = kString;
          else if (c == '\'') state = kChar;
          out.push_back(c);
        }
        break;
      case kLine:
        if (c == '\n') state = kCode, out.push_back(c);
        break;
      case kBlock:
        if (c == '*' && next == '/') state = kCode, ++i;
        else if (c == '\n') out.push_back(c);
        break;
      case kString:
      case kChar:
        out.push_back(c);
        if (c == '\\' && next != '\0' && next != '\n') out.push_back(next), ++i;
        else if (c == (state == kString ? '"' : '\'') || c == '\n') state = kCode;
        break;
      case kStates:
        break;
    }
  }
  return out;
}

// Every #include (and #include_next) directive in `text`, taken or not: a superset of what the preprocessor
// will read, so that no header that can change the binary is missed (an extra one only costs a possible
// spurious miss). `#` may be spelled `%:`.
std::vector<IncludeDirective> scan_includes(std::string_view raw) {
  const std::string text = directive_view(raw);
  std::vector<IncludeDirective> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string_view line = std::string_view(text).substr(pos, eol - pos);
    pos = eol + 1;
    size_t i = line.find_first_not_of(" \t\r\f\v");
    if (i == std::string_view::npos) continue;
    if (line[i] == '#') i += 1;
    else if (line.compare(i, 2, "%:") == 0) i += 2;
    else continue;
    i = line.find_first_not_of(" \t\r\f\v", i);
    if (i == std::string_view::npos) continue;
    size_t word = 0;
    if (line.compare(i, 12, "include_next") == 0) word = 12;
    else if (line.compare(i, 7, "include") == 0) word = 7;
    else if (line.compare(i, 6, "import") == 0) word = 6;
    if (word == 0) continue;
    const char after = i + word < line.size() ? line[i + word] : ' ';
    if (std::isalnum(static_cast<unsigned char>(after)) || after == '_') continue;  // #includex: another word
    i = line.find_first_not_of(" \t\r\f\v", i + word);
    if (i == std::string_view::npos) continue;
    char open = line[i];
    char close = open == '"' ? '"' : open == '<' ? '>' : 0;
    size_t end = close ? line.find(close, i + 1) : std::string_view::npos;
    if (end == std::string_view::npos) {
      // A computed #include (#include MACRO): which file it reads is known only after macro expansion.
      out.push_back({std::string(line.substr(i)), false, true});
      continue;
    }
    out.push_back({std::string(line.substr(i + 1, end - i - 1)), open == '"', false});
  }
  return out;
}

}  // namespace detail

namespace {

using Directive = detail::IncludeDirective;
using detail::scan_includes;

// What the key needs of a header file on disk, memoised per path and refreshed when size or mtime change.
struct FileFacts {
  int64_t size = -1;
  int64_t mtime_ns = 0;
  XXH128_hash_t hash{};
  std::vector<Directive> includes;
};

class HeaderFacts {
 public:
  // Facts for `path`, or nullptr when it is not a readable regular file.
  std::shared_ptr<const FileFacts> get(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return nullptr;
    int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    {
      std::shared_lock lock(mu_);
      auto it = files_.find(path);
      if (it != files_.end() && it->second->size == st.st_size && it->second->mtime_ns == mtime) return it->second;
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) return nullptr;
    auto facts = std::make_shared<FileFacts>();
    facts->size = st.st_size;
    facts->mtime_ns = mtime;
    if (static_cast<uint64_t>(st.st_size) > detail::kHeaderScanBytes) {
      // No real header is this large (NVRTC would be reading it too): its content still makes the key, read in
      // pieces, but the lines it includes are not looked for.
      std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), &XXH3_freeState);
      XXH3_128bits_reset(state.get());
      std::vector<char> piece(size_t{1} << 20);
      while (in.read(piece.data(), static_cast<std::streamsize>(piece.size())) || in.gcount() > 0) {
        XXH3_128bits_update(state.get(), piece.data(), static_cast<size_t>(in.gcount()));
      }
      facts->hash = XXH3_128bits_digest(state.get());
    } else {
      // Read at its size in one go (a stringstream copy of the CUDA headers doubled the first key's reads).
      std::string text(static_cast<size_t>(st.st_size), '\0');
      in.read(text.data(), static_cast<std::streamsize>(text.size()));
      text.resize(static_cast<size_t>(in.gcount()));
      facts->hash = XXH3_128bits(text.data(), text.size());
      facts->includes = scan_includes(text);
    }
    std::unique_lock lock(mu_);
    files_[path] = facts;
    return facts;
  }

 private:
  std::shared_mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const FileFacts>> files_;
};

HeaderFacts& header_facts() {
  static HeaderFacts* facts = new HeaderFacts();  // never destroyed: used by threads until exit
  return *facts;
}

std::string dirname_of(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

// Appends length-prefixed fields, so that no two different field sequences hash the same bytes.
class KeyHasher {
 public:
  KeyHasher() { XXH3_128bits_reset(state_.get()); }
  void add(std::string_view s) {
    uint64_t n = s.size();
    XXH3_128bits_update(state_.get(), &n, sizeof n);
    XXH3_128bits_update(state_.get(), s.data(), s.size());
  }
  void add(uint64_t v) { XXH3_128bits_update(state_.get(), &v, sizeof v); }
  void add(const XXH128_hash_t& h) { add(h.high64); add(h.low64); }
  KernelKey finish() {
    XXH128_hash_t h = XXH3_128bits_digest(state_.get());
    return KernelKey{h.high64, h.low64};
  }

 private:
  struct Free {
    void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
  };
  std::unique_ptr<XXH3_state_t, Free> state_{XXH3_createState()};
};

// The directives of in-memory text (a source, its headers), by the text's hash. A template's headers are the
// same for every configuration and a choice's source is keyed more than once (planned, then tuned): scanning
// them again was most of a kernel key's cost (~0.3 ms for a wgmma source and its headers).
class TextDirectives {
 public:
  std::shared_ptr<const std::vector<Directive>> get(std::string_view text) {
    const XXH128_hash_t h = XXH3_128bits(text.data(), text.size());
    const std::pair<uint64_t, uint64_t> key{h.high64, h.low64 ^ text.size()};
    {
      std::lock_guard lock(mu_);
      if (auto it = scans_.find(key); it != scans_.end()) return it->second;
    }
    auto scanned = std::make_shared<const std::vector<Directive>>(scan_includes(text));
    std::lock_guard lock(mu_);
    if (scans_.size() >= kMaxEntries) scans_.clear();  // bounded; a rescan only costs time
    return scans_.emplace(key, std::move(scanned)).first->second;  // another thread's scan if it stored first
  }

 private:
  static constexpr size_t kMaxEntries = 4096;
  std::mutex mu_;
  std::map<std::pair<uint64_t, uint64_t>, std::shared_ptr<const std::vector<Directive>>> scans_;
};

TextDirectives& text_directives() {
  static TextDirectives* scans = new TextDirectives();  // never destroyed: used by threads until exit
  return *scans;
}

}  // namespace

namespace detail {

std::vector<IncludeUse> walk_includes(const KernelSource& source, const std::vector<std::string>& cuda_dirs) {
  std::set<std::string> memory;
  for (const auto& hd : source.headers) memory.insert(hd.name);
  std::vector<std::string> dirs = include_dirs_of(source);
  for (const auto& d : cuda_dirs) dirs.push_back(d);
  std::vector<IncludeUse> out;
  std::set<std::string> visited_paths;
  std::vector<std::pair<Directive, std::string>> work;  // directive, path of the includer ("" = memory)
  // (Each scan held in a local: a range-for over *get() would not keep get()'s shared pointer alive, and the
  // vector it returns may have no other owner when another thread stored the same text first.)
  const auto source_directives = text_directives().get(source.source);
  for (const auto& d : *source_directives) work.push_back({d, ""});
  for (const auto& hd : source.headers) {
    const auto header_directives = text_directives().get(hd.content);
    for (const auto& d : *header_directives) work.push_back({d, ""});
  }
  while (!work.empty()) {
    auto [dir, from] = std::move(work.back());
    work.pop_back();
    IncludeUse use{dir, from, {}, "?"};
    if (dir.computed || memory.count(dir.name)) {  // in memory: hashed with the source
      out.push_back(std::move(use));
      continue;
    }
    std::vector<std::string> candidates;
    if (!dir.name.empty() && dir.name.front() == '/') {
      candidates.push_back(dir.name);  // an absolute path is read as it is, never searched for
    } else {
      if (dir.quoted && !from.empty()) candidates.push_back(dirname_of(from) + "/" + dir.name);
      for (const auto& d : dirs) candidates.push_back(d + "/" + dir.name);
    }
    std::shared_ptr<const FileFacts> facts;
    for (const auto& c : candidates) {
      if ((facts = header_facts().get(c))) {
        use.path = c;
        break;
      }
    }
    // Not on disk: one of NVRTC's built-in headers (covered by its version) or skipped code; the spelling
    // still counts.
    if (facts) use.hash = fmt::format("{:016x}{:016x}", facts->hash.high64, facts->hash.low64);
    const std::string path = use.path;
    out.push_back(std::move(use));
    if (!facts || !visited_paths.insert(path).second) continue;
    for (const auto& d : facts->includes) work.push_back({d, path});
  }
  return out;
}

namespace {

// The canonical form of an existing path (symbolic links and `..` resolved); empty when it has none.
std::string real_path(const std::string& path) {
  char buf[PATH_MAX];
  return ::realpath(path.c_str(), buf) ? std::string(buf) : std::string();
}

bool inside(const std::string& path, const std::string& dir) {
  return path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 && (dir == "/" || path[dir.size()] == '/');
}

}  // namespace

bool outside_includes_allowed_by_env() {
  const char* v = std::getenv("KILN_ALLOW_OUTSIDE_INCLUDES");
  return v && std::string_view(v) == "1";
}

Status check_includes(const KernelSource& source, const std::vector<std::string>& cuda_dirs) {
  std::vector<std::string> roots;
  for (const auto& d : include_dirs_of(source)) roots.push_back(real_path(d));
  for (const auto& d : cuda_dirs) roots.push_back(real_path(d));
  auto where = [&](const IncludeUse& u) {
    return fmt::format("#include {}{}{} in {}", u.directive.computed ? "" : u.directive.quoted ? "\"" : "<",
                       u.directive.name, u.directive.computed ? "" : u.directive.quoted ? "\"" : ">",
                       u.includer.empty() ? fmt::format("'{}'", source.name) : fmt::format("'{}'", u.includer));
  };
  const std::string hint = "(include folders: the source's -I folders and the CUDA toolkit's; "
                           "KILN_ALLOW_OUTSIDE_INCLUDES=1 or --allow-outside-includes lifts this)";
  for (const auto& use : walk_includes(source, cuda_dirs)) {
    // A computed include in a header of the include folders (Thrust has dozens) is the folder's own business;
    // in the source or its in-memory headers it is refused: only expansion would tell what it reads.
    if (use.directive.computed && !use.includer.empty()) continue;
    if (use.directive.computed) {
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("kernel '{}': {} is a computed include, which cannot be checked against the "
                                    "include folders {}", source.name, where(use), hint));
    }
    if (use.path.empty()) continue;
    const std::string real = real_path(use.path);
    bool ok = false;
    for (const auto& r : roots) ok = ok || (!r.empty() && inside(real, r));
    if (!ok) {
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("kernel '{}': {} reads a file outside the include folders {}", source.name,
                                    where(use), hint));
    }
  }
  return Status();
}

}  // namespace detail

KernelKey make_key(const KernelSource& source, const Target& target) {
  KeyHasher h;
  h.add("kiln-kernel-key");
  h.add(uint64_t{kKeyFormatVersion});
  NvrtcVersion v = nvrtc_version();
  h.add(uint64_t(v.major) << 32 | uint64_t(v.minor));
  h.add(target.arch);
  h.add(source.name);
  h.add(source.source);
  auto options = canonical_options(source.options);
  h.add(uint64_t{options.size()});
  for (const auto& o : options) h.add(o);
  h.add(uint64_t{source.name_expressions.size()});
  for (const auto& e : source.name_expressions) h.add(e);

  // In-memory headers by name; a name given twice keeps the first, as NVRTC does.
  std::map<std::string, const std::string*> memory;
  for (const auto& hd : source.headers) memory.emplace(hd.name, &hd.content);
  h.add(uint64_t{memory.size()});
  for (const auto& [name, content] : memory) {
    h.add(name);
    h.add(*content);
  }

  // Headers on disk reachable from the source and the in-memory headers, keyed by their include spelling.
  std::set<std::pair<std::string, std::string>> found;  // (spelling, content hash hex | "?")
  for (const auto& use : detail::walk_includes(source, cuda_include_dirs())) {
    if (use.directive.computed) continue;  // only refused (compiler.cpp), never followed
    found.insert({use.directive.name, use.hash});
  }
  h.add(uint64_t{found.size()});
  for (const auto& [spelling, hash] : found) {
    h.add(spelling);
    h.add(hash);
  }
  return h.finish();
}

}  // namespace kiln
