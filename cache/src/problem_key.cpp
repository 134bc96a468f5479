#include "kiln/cache/problem_key.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

#include "kiln/jit/compiler.h"
#include "kiln/jit/driver.h"
#include "kiln/version.h"

namespace kiln::cache {
namespace {

constexpr std::string_view kPrefix = "p1";

bool reserved(unsigned char c) { return c < 0x20 || c == 0x7f || c == '%' || c == ';' || c == ',' || c == '=' || c == '/'; }

void append_escaped(std::string& out, std::string_view s) {
  for (unsigned char c : s) {
    if (reserved(c)) {
      out += fmt::format("%{:02X}", c);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
}

Result<std::string> unescape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out.push_back(s[i]);
      continue;
    }
    unsigned v = 0;
    if (i + 2 >= s.size()) {
      return make_error(ErrorCode::kInvalidArgument, "truncated %-escape in a problem key");
    }
    auto [p, ec] = std::from_chars(s.data() + i + 1, s.data() + i + 3, v, 16);
    if (ec != std::errc() || p != s.data() + i + 3) {
      return make_error(ErrorCode::kInvalidArgument, "bad %-escape in a problem key");
    }
    out.push_back(static_cast<char>(v));
    i += 2;
  }
  return out;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    size_t p = s.find(sep, start);
    parts.push_back(s.substr(start, p == std::string_view::npos ? std::string_view::npos : p - start));
    if (p == std::string_view::npos) break;
    start = p + 1;
  }
  return parts;
}

template <class T>
Result<T> parse_number(std::string_view s, std::string_view what) {
  T v{};
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size()) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("bad {} '{}' in a problem key", what, s));
  }
  return v;
}

Status bad(std::string_view why) { return make_error(ErrorCode::kInvalidArgument, fmt::format("malformed problem key: {}", why)); }

}  // namespace

DeviceFingerprint DeviceFingerprint::from(const DeviceInfo& info) {
  return DeviceFingerprint{info.name, info.sm_count, info.cc_major, info.cc_minor};
}

Result<DeviceFingerprint> DeviceFingerprint::of_device(int ordinal) {
  KILN_ASSIGN_OR_RETURN(DeviceInfo info, device_info(ordinal));
  return from(info);
}

VersionStamp VersionStamp::current(std::string cublas) {
  VersionStamp v;
  auto d = ::kiln::driver();
  v.driver = d.ok() ? (*d)->driver_version : 0;
  NvrtcVersion nv = nvrtc_version();
  v.cuda = fmt::format("{}.{}", nv.major, nv.minor);
  v.cublas = std::move(cublas);
  v.kiln = kKilnVersion;
  return v;
}

std::string environment_prefix(const DeviceFingerprint& device, const VersionStamp& versions) {
  std::string s(kPrefix);
  s += ";dev=";
  append_escaped(s, device.name);
  s += fmt::format(",{},{}.{};drv={};cuda=", device.sm_count, device.cc_major, device.cc_minor, versions.driver);
  append_escaped(s, versions.cuda);
  s += ";kiln=";
  append_escaped(s, versions.kiln);
  s += ';';
  return s;
}

std::string ProblemKey::canonical() const {
  std::string s = environment_prefix(device, versions);
  s.reserve(s.size() + 64 + operands.size() * 24);
  s += "cublas=";
  append_escaped(s, versions.cublas);
  s += ";op=";
  append_escaped(s, op);
  s += ";t=";
  for (size_t i = 0; i < operands.size(); ++i) {
    if (i) s += ',';
    append_escaped(s, operands[i].dtype);
    s += '/';
    append_escaped(s, operands[i].layout);
    s += '/';
    for (size_t j = 0; j < operands[i].shape.size(); ++j) {
      if (j) s += 'x';
      char buf[24];
      auto r = std::to_chars(buf, buf + sizeof buf, operands[i].shape[j]);
      s.append(buf, r.ptr);
    }
  }
  s += ";epi=";
  append_escaped(s, epilogue);
  s += ";a=";
  // Attributes in name order, so the caller's order never splits one problem into two keys.
  std::vector<const std::pair<std::string, std::string>*> attrs;
  attrs.reserve(attributes.size());
  for (const auto& a : attributes) attrs.push_back(&a);
  std::sort(attrs.begin(), attrs.end(), [](auto* x, auto* y) { return *x < *y; });
  for (size_t i = 0; i < attrs.size(); ++i) {
    if (i) s += ',';
    append_escaped(s, attrs[i]->first);
    s += '=';
    append_escaped(s, attrs[i]->second);
  }
  return s;
}

Result<ProblemKey> ProblemKey::parse(std::string_view text) {
  auto fields = split(text, ';');
  static constexpr std::string_view kNames[] = {"dev", "drv", "cuda", "kiln", "cublas", "op", "t", "epi", "a"};
  if (fields.size() != 1 + std::size(kNames) || fields[0] != kPrefix) return bad("wrong number of fields or version");
  std::string_view values[std::size(kNames)];
  for (size_t i = 0; i < std::size(kNames); ++i) {
    std::string_view f = fields[i + 1];
    size_t eq = f.find('=');
    if (eq == std::string_view::npos || f.substr(0, eq) != kNames[i]) {
      return bad(fmt::format("field {} should be '{}='", i + 1, kNames[i]));
    }
    values[i] = f.substr(eq + 1);
  }
  ProblemKey k;
  auto dev = split(values[0], ',');
  if (dev.size() != 3) return bad("dev needs name,sms,cc");
  KILN_ASSIGN_OR_RETURN(k.device.name, unescape(dev[0]));
  KILN_ASSIGN_OR_RETURN(k.device.sm_count, parse_number<int>(dev[1], "SM count"));
  auto cc = split(dev[2], '.');
  if (cc.size() != 2) return bad("compute capability needs major.minor");
  KILN_ASSIGN_OR_RETURN(k.device.cc_major, parse_number<int>(cc[0], "compute capability"));
  KILN_ASSIGN_OR_RETURN(k.device.cc_minor, parse_number<int>(cc[1], "compute capability"));
  KILN_ASSIGN_OR_RETURN(k.versions.driver, parse_number<int>(values[1], "driver version"));
  KILN_ASSIGN_OR_RETURN(k.versions.cuda, unescape(values[2]));
  KILN_ASSIGN_OR_RETURN(k.versions.kiln, unescape(values[3]));
  KILN_ASSIGN_OR_RETURN(k.versions.cublas, unescape(values[4]));
  KILN_ASSIGN_OR_RETURN(k.op, unescape(values[5]));
  if (!values[6].empty()) {
    for (std::string_view t : split(values[6], ',')) {
      auto parts = split(t, '/');
      if (parts.size() != 3) return bad("an operand needs dtype/layout/shape");
      Operand o;
      KILN_ASSIGN_OR_RETURN(o.dtype, unescape(parts[0]));
      KILN_ASSIGN_OR_RETURN(o.layout, unescape(parts[1]));
      if (!parts[2].empty()) {
        for (std::string_view d : split(parts[2], 'x')) {
          KILN_ASSIGN_OR_RETURN(int64_t dim, parse_number<int64_t>(d, "dimension"));
          o.shape.push_back(dim);
        }
      }
      k.operands.push_back(std::move(o));
    }
  }
  KILN_ASSIGN_OR_RETURN(k.epilogue, unescape(values[7]));
  if (!values[8].empty()) {
    for (std::string_view a : split(values[8], ',')) {
      size_t eq = a.find('=');
      if (eq == std::string_view::npos) return bad("an attribute needs name=value");
      KILN_ASSIGN_OR_RETURN(std::string name, unescape(a.substr(0, eq)));
      KILN_ASSIGN_OR_RETURN(std::string value, unescape(a.substr(eq + 1)));
      k.attributes.emplace_back(std::move(name), std::move(value));
    }
  }
  // One problem has one spelling: a string that parses but is not what canonical() writes (unsorted
  // attributes, needless escapes) would name the same problem under a second key.
  if (k.canonical() != text) return bad("not in canonical form");
  return k;
}

}  // namespace kiln::cache
