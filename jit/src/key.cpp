#include "kiln/jit/key.h"

#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <sstream>
#include <unordered_map>

#include <fmt/format.h>

#include "kiln/jit/compiler.h"
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

namespace {

// One `#include` directive: its spelling and whether it was "quoted" (searched next to the includer first).
struct Directive {
  std::string name;
  bool quoted;
};

// Every #include directive in `text`, taken or not: a superset of what the preprocessor will read, so that
// no header that can change the binary is missed (an extra one only costs a possible spurious miss).
std::vector<Directive> scan_includes(std::string_view text) {
  std::vector<Directive> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    size_t i = line.find_first_not_of(" \t");
    if (i == std::string_view::npos || line[i] != '#') continue;
    i = line.find_first_not_of(" \t", i + 1);
    if (i == std::string_view::npos || line.compare(i, 7, "include") != 0) continue;
    i = line.find_first_not_of(" \t", i + 7);
    if (i == std::string_view::npos) continue;
    char open = line[i];
    char close = open == '"' ? '"' : open == '<' ? '>' : 0;
    if (close == 0) continue;  // a computed #include: its target shows up through other directives or not at all
    size_t end = line.find(close, i + 1);
    if (end == std::string_view::npos) continue;
    out.push_back({std::string(line.substr(i + 1, end - i - 1)), open == '"'});
  }
  return out;
}

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
    std::stringstream buffer;
    buffer << in.rdbuf();
    std::string text = buffer.str();
    auto facts = std::make_shared<FileFacts>();
    facts->size = st.st_size;
    facts->mtime_ns = mtime;
    facts->hash = XXH3_128bits(text.data(), text.size());
    facts->includes = scan_includes(text);
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

}  // namespace

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
  std::vector<std::string> dirs = detail::include_dirs_of(source);
  for (const auto& d : cuda_include_dirs()) dirs.push_back(d);
  std::set<std::pair<std::string, std::string>> found;  // (spelling, content hash hex | "?")
  std::set<std::string> visited_paths;
  std::vector<std::pair<Directive, std::string>> work;  // directive, directory of the includer ("" = memory)
  for (const auto& d : scan_includes(source.source)) work.push_back({d, ""});
  for (const auto& [name, content] : memory) {
    for (const auto& d : scan_includes(*content)) work.push_back({d, ""});
  }
  while (!work.empty()) {
    auto [dir, from] = std::move(work.back());
    work.pop_back();
    if (memory.count(dir.name)) continue;  // an in-memory header: already hashed
    std::vector<std::string> candidates;
    if (dir.quoted && !from.empty()) candidates.push_back(from + "/" + dir.name);
    for (const auto& d : dirs) candidates.push_back(d + "/" + dir.name);
    std::shared_ptr<const FileFacts> facts;
    std::string path;
    for (const auto& c : candidates) {
      if ((facts = header_facts().get(c))) {
        path = c;
        break;
      }
    }
    if (!facts) {
      // Not on disk: one of NVRTC's built-in headers (covered by its version) or skipped code. The
      // spelling still counts.
      found.insert({dir.name, "?"});
      continue;
    }
    found.insert({dir.name, fmt::format("{:016x}{:016x}", facts->hash.high64, facts->hash.low64)});
    if (!visited_paths.insert(path).second) continue;
    std::string here = dirname_of(path);
    for (const auto& d : facts->includes) work.push_back({d, here});
  }
  h.add(uint64_t{found.size()});
  for (const auto& [spelling, hash] : found) {
    h.add(spelling);
    h.add(hash);
  }
  return h.finish();
}

}  // namespace kiln
