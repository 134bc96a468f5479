#include "kiln/cache/bundle.h"

#include <unistd.h>
#include <xxhash.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <limits>
#include <utility>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "format.h"
#include "kiln/input.h"
#include "kiln/cache/problem_key.h"
#include "kiln/jit/target.h"

namespace kiln::cache {
namespace {

using nlohmann::json;

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64_encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = uint8_t(in[i]) << 16 | uint8_t(in[i + 1]) << 8 | uint8_t(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out.push_back(kB64[(v >> s) & 63]);
  }
  if (size_t rest = in.size() - i; rest > 0) {
    uint32_t v = uint8_t(in[i]) << 16 | (rest == 2 ? uint8_t(in[i + 1]) << 8 : 0);
    out.push_back(kB64[(v >> 18) & 63]);
    out.push_back(kB64[(v >> 12) & 63]);
    out.push_back(rest == 2 ? kB64[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

Result<std::string> base64_decode(std::string_view in) {
  static const auto table = [] {
    std::array<int, 256> t;
    t.fill(-1);
    for (int i = 0; i < 64; ++i) t[uint8_t(kB64[i])] = i;
    return t;
  }();
  if (in.size() % 4 != 0) return make_error(ErrorCode::kCorrupt, "base64 length is not a multiple of 4");
  std::string out;
  out.reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int j = 0; j < 4; ++j) {
      char c = in[i + j];
      if (c == '=' && i + 4 == in.size() && j >= 2) {
        v[j] = 0;
        ++pad;
      } else if (pad > 0 || (v[j] = table[uint8_t(c)]) < 0) {
        return make_error(ErrorCode::kCorrupt, "bad base64 character");
      }
    }
    uint32_t x = uint32_t(v[0]) << 18 | v[1] << 12 | v[2] << 6 | v[3];
    out.push_back(char(x >> 16));
    if (pad < 2) out.push_back(char(x >> 8));
    if (pad < 1) out.push_back(char(x));
  }
  return out;
}

std::string hash_hex(std::string_view stored) { return fmt::format("{:016x}", XXH3_64bits(stored.data(), stored.size())); }

json toolchain_json(const Toolchain& t) {
  return {{"nvrtc", fmt::format("{}.{}", t.nvrtc_major, t.nvrtc_minor)}, {"driver", t.driver}, {"kiln", t.kiln}};
}

// Field readers that refuse a wrong type instead of throwing.
struct Fields {
  const json& j;
  std::string missing;

  template <class T>
  T get(const char* name) {
    auto it = j.find(name);
    if (it == j.end()) {
      missing = name;
      return T{};
    }
    if constexpr (std::is_same_v<T, std::string>) {
      if (!it->is_string()) return missing = name, T{};
    } else if constexpr (std::is_same_v<T, bool>) {
      if (!it->is_boolean()) return missing = name, T{};
    } else if constexpr (std::is_floating_point_v<T>) {
      // Times and durations: finite and not negative (JSON has no NaN, but 1e999 parses as infinity).
      if (!it->is_number() || !(it->get<double>() >= 0) || it->get<double>() > 1e300) return missing = name, T{};
    } else {
      // An integer of the field's type: a value out of its range would wrap on conversion.
      if (!it->is_number_integer()) return missing = name, T{};
      const bool fits = it->is_number_unsigned()
                            ? it->get<uint64_t>() <= uint64_t(std::numeric_limits<T>::max())
                            : std::in_range<T>(it->get<int64_t>());
      if (!fits) return missing = name, T{};
    }
    return it->get<T>();
  }
  Toolchain toolchain() {
    Toolchain t;
    auto it = j.find("toolchain");
    if (it == j.end() || !it->is_object()) return missing = "toolchain", t;
    Fields f{*it, {}};
    std::string nv = f.get<std::string>("nvrtc");
    t.driver = f.get<int>("driver");
    t.kiln = f.get<std::string>("kiln");
    if (std::sscanf(nv.c_str(), "%d.%d", &t.nvrtc_major, &t.nvrtc_minor) != 2) f.missing = "toolchain.nvrtc";
    if (!f.missing.empty()) missing = f.missing;
    return t;
  }
  std::vector<std::pair<std::string, std::string>> pairs(const char* name) {
    std::vector<std::pair<std::string, std::string>> out;
    auto it = j.find(name);
    if (it == j.end() || !it->is_array()) return missing = name, out;
    for (const auto& p : *it) {
      if (!p.is_array() || p.size() != 2 || !p[0].is_string() || !p[1].is_string()) return missing = name, out;
      out.emplace_back(p[0].get<std::string>(), p[1].get<std::string>());
    }
    return out;
  }
};

Status entry_error(std::string what) { return make_error(ErrorCode::kCorrupt, std::move(what)); }

Status check_hash(Fields& f, std::string_view stored) {
  std::string want = f.get<std::string>("xxh3");
  if (!f.missing.empty()) return entry_error(fmt::format("missing or mistyped field '{}'", f.missing));
  if (want != hash_hex(stored)) return entry_error("checksum mismatch (edited or damaged)");
  return Status();
}

// What a decision or timing entry must hold besides its hash: a choice and a canonical problem key.
Status check_record(Fields& f, std::string_view problem, std::string_view choice, std::string_view stored) {
  if (choice.empty()) return entry_error("empty choice");
  KILN_RETURN_IF_ERROR(ProblemKey::parse(problem).status());
  return check_hash(f, stored);
}

Result<Decision> read_decision(const json& j) {
  Fields f{j, {}};
  Decision d;
  d.problem = f.get<std::string>("problem");
  d.choice = f.get<std::string>("choice");
  d.params = f.pairs("params");
  d.median_us = f.get<double>("median_us");
  d.decided_at_ns = f.get<int64_t>("decided_at_ns");
  d.toolchain = f.toolchain();
  if (auto k = j.find("kernel"); k != j.end() && !k->is_null()) {
    if (!k->is_string()) return entry_error("kernel is not a string");
    KILN_ASSIGN_OR_RETURN(KernelKey key, KernelKey::parse(k->get<std::string>()));
    d.kernel = key;
  }
  KILN_RETURN_IF_ERROR(check_record(f, d.problem, d.choice, encode_decision(d)));
  return d;
}

Result<TimingRecord> read_timing(const json& j) {
  Fields f{j, {}};
  TimingRecord t;
  t.problem = f.get<std::string>("problem");
  t.choice = f.get<std::string>("choice");
  t.ok = f.get<bool>("ok");
  t.median_us = f.get<double>("median_us");
  t.min_us = f.get<double>("min_us");
  t.p90_us = f.get<double>("p90_us");
  t.samples = f.get<uint32_t>("samples");
  t.measured_at_ns = f.get<int64_t>("measured_at_ns");
  int code = f.get<int>("error");
  if (code < 0 || code > int(ErrorCode::kWrongResult)) return entry_error("error code out of range");
  t.error = ErrorCode(code);
  t.reason = f.get<std::string>("reason");
  t.toolchain = f.toolchain();
  KILN_RETURN_IF_ERROR(check_record(f, t.problem, t.choice, encode_timing(t)));
  return t;
}

Result<Binary> read_binary(const json& j) {
  Fields f{j, {}};
  Binary b;
  KILN_ASSIGN_OR_RETURN(b.key, KernelKey::parse(f.get<std::string>("key")));
  b.name = f.get<std::string>("name");
  b.entry = f.get<std::string>("entry");
  b.arch = f.get<std::string>("arch");
  std::string nv = f.get<std::string>("nvrtc");
  if (std::sscanf(nv.c_str(), "%d.%d", &b.nvrtc_major, &b.nvrtc_minor) != 2) return entry_error("bad nvrtc version");
  b.compile_seconds = f.get<double>("compile_seconds");
  int64_t created = f.get<int64_t>("created_at_ns");
  b.lowered_names = f.pairs("lowered_names");
  b.log = f.get<std::string>("log");
  KILN_ASSIGN_OR_RETURN(b.cubin, base64_decode(f.get<std::string>("cubin_base64")));
  KILN_RETURN_IF_ERROR(Target::parse(b.arch).status());
  if (b.cubin.size() < 4 || b.cubin.compare(0, 4, "\x7f" "ELF") != 0) return entry_error("the cubin is not an ELF image");
  KILN_RETURN_IF_ERROR(check_hash(f, encode_binary(b, created)));
  return b;
}

// The bundle's outer shape, checked before anything is read from it: an object of the right format and
// version whose sections are lists. (nlohmann's value() throws on a field of another type: never used here.)
Status check_bundle_shape(const json& doc, const std::string& path) {
  if (doc.is_discarded() || !doc.is_object()) {
    return make_error(ErrorCode::kCorrupt, fmt::format("'{}' is not a kiln cache bundle (not a JSON object)", path));
  }
  auto format = doc.find("format");
  if (format == doc.end() || !format->is_string() || format->get<std::string>() != "kiln-cache-bundle") {
    return make_error(ErrorCode::kCorrupt,
                      fmt::format("'{}' is not a kiln cache bundle (\"format\" is not \"kiln-cache-bundle\")", path));
  }
  auto version = doc.find("version");
  if (version == doc.end() || !version->is_number_integer()) {
    return make_error(ErrorCode::kCorrupt, fmt::format("'{}': \"version\" is missing or not an integer", path));
  }
  if (version->get<int64_t>() != kBundleVersion) {
    return make_error(ErrorCode::kCorrupt, fmt::format("'{}' is bundle version {}; this kiln reads version {}", path,
                                                       version->get<int64_t>(), kBundleVersion));
  }
  for (const char* section : {"decisions", "timings", "binaries"}) {
    auto it = doc.find(section);
    if (it != doc.end() && !it->is_array()) {
      return make_error(ErrorCode::kCorrupt, fmt::format("'{}': \"{}\" is not a list", path, section));
    }
  }
  return Status();
}

// A signed bundle's first line: `{` then this, the signature object and a comma, alone on the line.
constexpr std::string_view kSignaturePrefix = "{\n \"signature\": ";

// The bundle's text with its signature line (when signed), over the text `body` (a JSON object, as dump(1)
// writes it: "{\n" first).
std::string signed_text(const std::string& body, const SigningKey& key) {
  json sig = {{"algorithm", "hmac-sha256"}, {"key_id", key.id()}, {"hmac", key.sign(body)}};
  return std::string(kSignaturePrefix) + sig.dump() + ",\n" + body.substr(2);
}

// Which keys a bundle is trusted by, from its text.
void check_signature(const std::string& text, const ImportOptions& o, ImportReport& report) {
  auto unsigned_bundle = [&] {
    report.binaries_trusted = o.trust_unsigned;
    report.signature = o.trust_unsigned ? "unsigned, trusted as told" : "unsigned";
  };
  if (text.compare(0, kSignaturePrefix.size(), kSignaturePrefix) != 0) return unsigned_bundle();
  size_t nl = text.find('\n', kSignaturePrefix.size());
  std::string line = text.substr(kSignaturePrefix.size(), nl == std::string::npos ? 0 : nl - kSignaturePrefix.size());
  json sig = line.size() > 1 && line.back() == ',' ? json::parse(line.substr(0, line.size() - 1), nullptr, false) : json();
  report.signature_valid = false;
  auto text_field = [&](const char* name) {
    auto it = sig.is_object() ? sig.find(name) : sig.end();
    return it != sig.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  if (text_field("algorithm") != "hmac-sha256" || text_field("hmac").empty() || text_field("key_id").empty()) {
    report.signature = "its signature line is malformed";
    return;
  }
  const std::string body = "{\n" + text.substr(nl + 1);
  const std::string key_id = text_field("key_id");
  for (const auto& key : o.trusted_keys) {
    if (key.verify(body, text_field("hmac"))) {
      report.signature_valid = report.binaries_trusted = true;
      report.signature = fmt::format("signed with trusted key {} ({})", key.id(), key.origin());
      return;
    }
  }
  bool known = std::any_of(o.trusted_keys.begin(), o.trusted_keys.end(), [&](const SigningKey& k) { return k.id() == key_id; });
  report.signature_valid = !known;
  report.signature = known ? fmt::format("its signature does not match its content for key {} (edited after signing, or damaged)", key_id)
                           : fmt::format("signed with key {}, which is not a trusted key", key_id);
}

// Whether `path` would land inside the cache folder `dir` (links and ".." resolved as far as they exist).
bool inside(const std::string& path, const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  fs::path d = fs::weakly_canonical(fs::absolute(dir, ec), ec);
  auto [dend, pend] = std::mismatch(d.begin(), d.end(), p.begin(), p.end());
  return dend == d.end();
}

}  // namespace

Result<BundleCounts> export_bundle(Store& store, const std::string& path, const ExportOptions& options) {
  if (inside(path, store.dir())) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("refusing to write the bundle '{}' inside the cache folder '{}': it would overwrite "
                                  "the cache's own files; write it elsewhere", path, store.dir()));
  }
  BundleCounts counts;
  json doc = {{"format", "kiln-cache-bundle"},
              {"version", kBundleVersion},
              {"kiln", store.toolchain().kiln},
              {"created_at_ns", now_ns()},
              {"exported_with", toolchain_json(store.toolchain())}};
  json decisions = json::array(), timings = json::array(), binaries = json::array();
  std::vector<KernelKey> wanted;
  for (const auto& d : store.decisions(options.prefix)) {
    json params = json::array();
    for (const auto& [k, v] : d->params) params.push_back({k, v});
    decisions.push_back({{"problem", d->problem},
                         {"choice", d->choice},
                         {"params", params},
                         {"kernel", d->kernel ? json(d->kernel->hex()) : json(nullptr)},
                         {"median_us", d->median_us},
                         {"decided_at_ns", d->decided_at_ns},
                         {"toolchain", toolchain_json(d->toolchain)},
                         {"xxh3", hash_hex(encode_decision(*d))}});
    if (d->kernel) wanted.push_back(*d->kernel);
  }
  for (const auto& t : store.all_timings()) {
    if (t.problem.compare(0, options.prefix.size(), options.prefix) != 0) continue;
    timings.push_back({{"problem", t.problem},
                       {"choice", t.choice},
                       {"ok", t.ok},
                       {"median_us", t.median_us},
                       {"min_us", t.min_us},
                       {"p90_us", t.p90_us},
                       {"samples", t.samples},
                       {"measured_at_ns", t.measured_at_ns},
                       {"error", int(t.error)},
                       {"reason", t.reason},
                       {"toolchain", toolchain_json(t.toolchain)},
                       {"xxh3", hash_hex(encode_timing(t))}});
  }
  if (options.binaries) {
    std::map<KernelKey, int64_t> created;
    KILN_RETURN_IF_ERROR(store.for_each_binary([&](const BinaryInfo& info) {
      created[info.key] = info.created_at_ns;
      return true;
    }).status());
    std::vector<KernelKey> keys;
    if (options.prefix.empty()) {
      for (const auto& [k, c] : created) keys.push_back(k);
    } else {
      keys = wanted;
    }
    for (const auto& k : keys) {
      auto b = store.get_binary(k, {}, false);
      if (!b.ok() || !created.count(k)) continue;  // absent or not for this toolchain: not exported
      json lowered = json::array();
      for (const auto& [e, l] : (*b)->lowered_names) lowered.push_back({e, l});
      binaries.push_back({{"key", k.hex()},
                          {"name", (*b)->name},
                          {"entry", (*b)->entry},
                          {"arch", (*b)->arch},
                          {"nvrtc", fmt::format("{}.{}", (*b)->nvrtc_major, (*b)->nvrtc_minor)},
                          {"compile_seconds", (*b)->compile_seconds},
                          {"created_at_ns", created[k]},
                          {"lowered_names", lowered},
                          {"log", (*b)->log},
                          {"cubin_base64", base64_encode((*b)->cubin)},
                          {"xxh3", hash_hex(encode_binary(**b, created[k]))}});
    }
  }
  counts = {decisions.size(), timings.size(), binaries.size()};
  doc["decisions"] = std::move(decisions);
  doc["timings"] = std::move(timings);
  doc["binaries"] = std::move(binaries);
  // Invalid UTF-8 in a log or name is replaced rather than thrown about.
  std::string text = doc.dump(1, ' ', false, json::error_handler_t::replace);
  if (options.sign_with) text = signed_text(text, *options.sign_with);
  std::string tmp = fmt::format("{}.tmp-{}", path, ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary);
    out << text;
    if (!out.flush()) return make_error(ErrorCode::kIoError, fmt::format("cannot write '{}'", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return make_error(ErrorCode::kIoError, fmt::format("cannot write '{}': {}", path, ec.message()));
  return counts;
}

Result<ImportReport> import_bundle(Store& store, const std::string& path, const ImportOptions& options) {
  KILN_ASSIGN_OR_RETURN(const std::string text, read_file_limited(path, kBundleBytesLimit));
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  KILN_RETURN_IF_ERROR(check_bundle_shape(doc, path));
  ImportReport report;
  check_signature(text, options, report);
  auto reject = [&](const char* kind, size_t i, const Status& why) {
    report.rejected++;
    if (report.errors.size() < 20) report.errors.push_back(fmt::format("{} #{}: {}", kind, i, why.to_string()));
  };
  std::vector<TimingRecord> timings;
  std::vector<Decision> decisions;
  std::vector<Binary> binaries;
  size_t pending_bytes = 0;
  auto flush = [&]() -> Status {
    report.imported.timings += timings.size();
    report.imported.decisions += decisions.size();
    report.imported.binaries += binaries.size();
    Status s = store.put_all(std::move(timings), std::move(decisions), binaries);
    timings.clear();
    decisions.clear();
    binaries.clear();
    pending_bytes = 0;
    return s;
  };
  const Toolchain& here = store.toolchain();
  // Reads one section entry by entry: an entry that fails is counted and skipped, `keep` takes each one that
  // passes (and may flush).
  auto read_section = [&]<class T>(const char* name, const char* kind, Result<T> (*read)(const json&),
                                   auto&& keep) -> Status {
    auto it = doc.find(name);
    if (it == doc.end() || !it->is_array()) return Status();
    for (size_t i = 0; i < it->size(); ++i) {
      const json& j = (*it)[i];
      Result<T> entry = j.is_object() ? read(j) : Result<T>(entry_error("not an object"));
      if (!entry.ok()) {
        reject(kind, i, entry.status());
        continue;
      }
      KILN_RETURN_IF_ERROR(keep(std::move(entry).value()));
    }
    return Status();
  };
  KILN_RETURN_IF_ERROR(read_section("decisions", "decision", read_decision, [&](Decision d) {
    report.other_toolchain += d.toolchain != here;
    decisions.push_back(std::move(d));
    return Status();
  }));
  KILN_RETURN_IF_ERROR(read_section("timings", "timing", read_timing, [&](TimingRecord t) {
    report.other_toolchain += t.toolchain != here;
    timings.push_back(std::move(t));
    return timings.size() >= 4096 ? flush() : Status();
  }));
  if (!report.binaries_trusted) {
    if (auto it = doc.find("binaries"); it != doc.end() && it->is_array()) report.binaries_skipped = it->size();
    doc.erase("binaries");
  }
  KILN_RETURN_IF_ERROR(read_section("binaries", "binary", read_binary, [&](Binary b) {
    report.other_toolchain += b.nvrtc_major != here.nvrtc_major || b.nvrtc_minor != here.nvrtc_minor;
    pending_bytes += b.cubin.size();
    binaries.push_back(std::move(b));
    // Batches of bounded size: one write (or one staged batch) each.
    return pending_bytes > (32u << 20) ? flush() : Status();
  }));
  KILN_RETURN_IF_ERROR(flush());
  return report;
}

}  // namespace kiln::cache
