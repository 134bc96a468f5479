// Values, parameter declarations, device limits and the Template class.
#include "kiln/templates/template.h"

#include <cmath>
#include <cstring>

#include <algorithm>
#include <array>
#include <cassert>
#include <set>

#include <fmt/format.h>

#include "kiln/enum_names.h"
#include "kiln/jit/device.h"
#include "memo.h"
#include "text.h"

namespace kiln::templates {

// ------------------------------------------------------------------------------------------------ values

namespace {
constexpr std::array<EnumName<DType>, 3> kDTypeNames{
    {{DType::kF16, "f16"}, {DType::kBF16, "bf16"}, {DType::kF32, "f32"}}};
constexpr std::array<EnumName<DType>, 3> kDTypeCppNames{
    {{DType::kF16, "__half"}, {DType::kBF16, "__nv_bfloat16"}, {DType::kF32, "float"}}};
}  // namespace

std::string_view dtype_name(DType t) { return name_in(kDTypeNames, t, "?"); }
std::string_view dtype_cpp(DType t) { return name_in(kDTypeCppNames, t, "?"); }
int dtype_bytes(DType t) { return t == DType::kF32 ? 4 : 2; }

namespace {
// Round to nearest even; NaN stays NaN; f16 overflows to infinity and keeps its subnormals.
uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float bf16_to_f32(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to inf
  if (abs < 0x38800000u) {                                                // subnormal or zero
    const float scaled = std::fabs(f) * 16777216.0f;                      // 2^24: units of the smallest subnormal
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
  }
  const uint32_t m = abs + 0xfffu + ((abs >> 13) & 1u);  // round to nearest even at bit 13
  return static_cast<uint16_t>(sign | ((m - 0x38000000u) >> 13));
}
float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0) {
    const float f = std::ldexp(static_cast<float>(man), -24);
    return sign ? -f : f;
  }
  const uint32_t u = exp == 31 ? (sign | 0x7f800000u | (man << 13)) : (sign | ((exp + 112) << 23) | (man << 13));
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace

float load_element(DType t, const void* p) {
  if (t == DType::kF32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return t == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

void store_element(DType t, float v, void* p) {
  if (t == DType::kF32) {
    std::memcpy(p, &v, 4);
    return;
  }
  const uint16_t h = t == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
  std::memcpy(p, &h, 2);
}

Result<DType> parse_dtype(std::string_view s) {
  if (auto t = value_in(kDTypeNames, s)) return *t;
  if (s == "fp16" || s == "half") return DType::kF16;
  if (s == "fp32" || s == "float") return DType::kF32;
  return make_error(ErrorCode::kInvalidArgument, fmt::format("unknown dtype '{}' (f16, bf16, f32)", s));
}

std::string_view layout_name(Layout l) { return l == Layout::kRowMajor ? "row" : "col"; }

std::string_view kind_name(ParamKind k) {
  switch (k) {
    case ParamKind::kInt: return "int";
    case ParamKind::kBool: return "bool";
    case ParamKind::kDType: return "dtype";
    case ParamKind::kLayout: return "layout";
    case ParamKind::kEnum: return "enum";
    case ParamKind::kCode: return "code";
  }
  return "?";
}

Value Value::integer(int64_t v) {
  Value x;
  x.kind_ = ParamKind::kInt;
  x.i_ = v;
  return x;
}
Value Value::boolean(bool v) {
  Value x;
  x.kind_ = ParamKind::kBool;
  x.i_ = v ? 1 : 0;
  return x;
}
Value Value::dtype(DType t) {
  Value x;
  x.kind_ = ParamKind::kDType;
  x.i_ = static_cast<int64_t>(t);
  return x;
}
Value Value::layout(Layout l) {
  Value x;
  x.kind_ = ParamKind::kLayout;
  x.i_ = static_cast<int64_t>(l);
  return x;
}
Value Value::enumeration(std::string choice) {
  Value x;
  x.kind_ = ParamKind::kEnum;
  x.s_ = std::move(choice);
  return x;
}
Value Value::code(std::string text, std::string tag) {
  Value x;
  x.kind_ = ParamKind::kCode;
  x.code_ = std::make_shared<const std::string>(std::move(text));
  x.s_ = std::move(tag);
  return x;
}

int64_t Value::as_int() const {
  assert(kind_ == ParamKind::kInt);
  return kind_ == ParamKind::kInt ? i_ : 0;
}
bool Value::as_bool() const {
  assert(kind_ == ParamKind::kBool);
  return kind_ == ParamKind::kBool && i_ != 0;
}
DType Value::as_dtype() const {
  assert(kind_ == ParamKind::kDType);
  return kind_ == ParamKind::kDType ? static_cast<DType>(i_) : DType::kF32;
}
Layout Value::as_layout() const {
  assert(kind_ == ParamKind::kLayout);
  return kind_ == ParamKind::kLayout ? static_cast<Layout>(i_) : Layout::kRowMajor;
}
const std::string& Value::as_enum() const {
  assert(kind_ == ParamKind::kEnum);
  return s_;
}
const std::string& Value::as_code() const {
  assert(kind_ == ParamKind::kCode);
  static const std::string kEmpty;
  return code_ ? *code_ : kEmpty;
}
const std::string& Value::code_tag() const {
  static const std::string kEmpty;
  return kind_ == ParamKind::kCode ? s_ : kEmpty;
}

bool Value::operator==(const Value& o) const {
  if (kind_ != o.kind_ || i_ != o.i_ || s_ != o.s_) return false;
  if (code_ == o.code_) return true;
  return code_ && o.code_ && *code_ == *o.code_;
}

std::string Value::short_text() const {
  switch (kind_) {
    case ParamKind::kInt: return std::to_string(i_);
    case ParamKind::kBool: return i_ ? "true" : "false";
    case ParamKind::kDType: return std::string(dtype_name(as_dtype()));
    case ParamKind::kLayout: return std::string(layout_name(as_layout()));
    case ParamKind::kEnum: return s_;
    case ParamKind::kCode: return s_;
  }
  return "?";
}

std::string to_string(const Params& p) {
  std::string out;
  for (const auto& [k, v] : p) {
    if (!out.empty()) out += ' ';
    out += k + '=' + v.short_text();
  }
  return out;
}

// ------------------------------------------------------------------------------------------------ limits

Result<DeviceLimits> DeviceLimits::for_target(const Target& target) {
  DeviceLimits l;
  l.arch = target.arch;
  l.cc = target.compute_capability();
  l.arch_specific = target.arch_specific();
  constexpr int kKiB = 1024;
  switch (l.cc) {
    case 80: l.sm_count = 108; l.smem_per_block_optin = 163 * kKiB; l.smem_per_sm = 164 * kKiB; break;
    case 86: l.sm_count = 84; l.smem_per_block_optin = 99 * kKiB; l.smem_per_sm = 100 * kKiB; l.max_threads_per_block = 1024; break;
    case 87: l.sm_count = 16; l.smem_per_block_optin = 163 * kKiB; l.smem_per_sm = 164 * kKiB; break;
    case 89: l.sm_count = 128; l.smem_per_block_optin = 99 * kKiB; l.smem_per_sm = 100 * kKiB; break;
    case 90: l.sm_count = 132; l.smem_per_block_optin = 227 * kKiB; l.smem_per_sm = 228 * kKiB; break;
    case 100:
    case 103: l.sm_count = 148; l.smem_per_block_optin = 227 * kKiB; l.smem_per_sm = 228 * kKiB; break;
    case 120: l.sm_count = 170; l.smem_per_block_optin = 99 * kKiB; l.smem_per_sm = 100 * kKiB; break;
    default:
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("no known device limits for {}; take them from a device (DeviceLimits::from_device)",
                                    target.arch));
  }
  return l;
}

DeviceLimits DeviceLimits::from_device(const DeviceInfo& info, const Target& target) {
  DeviceLimits l;
  l.arch = target.arch;
  l.cc = target.compute_capability();
  l.arch_specific = target.arch_specific();
  l.sm_count = info.sm_count;
  l.smem_per_block_optin = info.max_shared_per_block_optin;
  l.smem_per_sm = info.max_shared_per_sm;
  if (info.max_threads_per_block > 0) l.max_threads_per_block = info.max_threads_per_block;
  l.measured = true;
  return l;
}

// ------------------------------------------------------------------------------------------------ specs

ParamSpec int_param(std::string name, ParamRole role, std::vector<int64_t> values, std::string abbrev, std::string doc) {
  ParamSpec s{std::move(name), ParamKind::kInt, role, {}, std::move(abbrev), std::move(doc)};
  for (int64_t v : values) s.values.push_back(Value::integer(v));
  return s;
}
ParamSpec bool_param(std::string name, ParamRole role, std::string abbrev, std::string doc) {
  return ParamSpec{std::move(name), ParamKind::kBool, role, {Value::boolean(false), Value::boolean(true)},
                   std::move(abbrev), std::move(doc)};
}
ParamSpec dtype_param(std::string name, ParamRole role, std::vector<DType> values, std::string abbrev, std::string doc) {
  ParamSpec s{std::move(name), ParamKind::kDType, role, {}, std::move(abbrev), std::move(doc)};
  for (DType v : values) s.values.push_back(Value::dtype(v));
  return s;
}
ParamSpec layout_param(std::string name, ParamRole role, std::string abbrev, std::string doc) {
  return ParamSpec{std::move(name), ParamKind::kLayout, role,
                   {Value::layout(Layout::kRowMajor), Value::layout(Layout::kColMajor)}, std::move(abbrev), std::move(doc)};
}
ParamSpec enum_param(std::string name, ParamRole role, std::vector<std::string> choices, std::string abbrev,
                     std::string doc) {
  ParamSpec s{std::move(name), ParamKind::kEnum, role, {}, std::move(abbrev), std::move(doc)};
  for (auto& c : choices) s.values.push_back(Value::enumeration(std::move(c)));
  return s;
}
ParamSpec code_param(std::string name, ParamRole role, std::vector<Value> samples, std::string abbrev, std::string doc) {
  return ParamSpec{std::move(name), ParamKind::kCode, role, std::move(samples), std::move(abbrev), std::move(doc)};
}
ParamSpec derived_param(std::string name, ParamKind kind, std::string doc) {
  return ParamSpec{std::move(name), kind, ParamRole::kDerived, {}, "", std::move(doc)};
}

namespace {
const Value& get(const Params& p, std::string_view name, ParamKind kind) {
  auto it = p.find(name);
  assert(it != p.end() && it->second.kind() == kind);
  static const Value kZero[] = {Value::integer(0), Value::boolean(false), Value::dtype(DType::kF32),
                                Value::layout(Layout::kRowMajor), Value::enumeration(""), Value::code("", "")};
  if (it == p.end() || it->second.kind() != kind) return kZero[static_cast<int>(kind)];
  return it->second;
}

bool is_ident(std::string_view s) {
  if (s.empty() || !(std::islower(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '_';
  });
}
bool is_tag(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '_';
  });
}

Status invalid(const std::string& tmpl, const std::string& msg) {
  return make_error(ErrorCode::kInvalidArgument, fmt::format("template '{}': {}", tmpl, msg));
}
}  // namespace

int64_t get_int(const Params& p, std::string_view name) { return get(p, name, ParamKind::kInt).as_int(); }
bool get_bool(const Params& p, std::string_view name) { return get(p, name, ParamKind::kBool).as_bool(); }
DType get_dtype(const Params& p, std::string_view name) { return get(p, name, ParamKind::kDType).as_dtype(); }
Layout get_layout(const Params& p, std::string_view name) { return get(p, name, ParamKind::kLayout).as_layout(); }
const std::string& get_enum(const Params& p, std::string_view name) { return get(p, name, ParamKind::kEnum).as_enum(); }

// ------------------------------------------------------------------------------------------------ Template

Result<std::shared_ptr<const Template>> Template::create(TemplateDef def, std::string_view text,
                                                         std::vector<Header> headers) {
  const std::string& n = def.name;
  if (!is_ident(n)) return invalid(n, "the name must match [a-z_][a-z0-9_]*");
  if (def.problem.empty()) return invalid(n, "no problem declared");
  if (def.entry.empty()) return invalid(n, "no entry declared");
  if (!def.geometry) return invalid(n, "no launch geometry function");
  std::set<std::string, std::less<>> seen;
  for (const ParamSpec& s : def.params) {
    if (!is_ident(s.name)) return invalid(n, fmt::format("parameter name '{}' must match [a-z_][a-z0-9_]*", s.name));
    if (!seen.insert(s.name).second) return invalid(n, fmt::format("parameter '{}' declared twice", s.name));
    if (s.role == ParamRole::kDerived) {
      if (!s.values.empty()) return invalid(n, fmt::format("derived parameter '{}' lists values", s.name));
      continue;
    }
    if (s.values.empty()) return invalid(n, fmt::format("parameter '{}' has no values", s.name));
    if (s.default_value) {
      if (s.role != ParamRole::kTunable) return invalid(n, fmt::format("parameter '{}': only tunables have defaults", s.name));
      if (std::find(s.values.begin(), s.values.end(), *s.default_value) == s.values.end()) {
        return invalid(n, fmt::format("parameter '{}': default '{}' is not one of its values", s.name,
                                      s.default_value->short_text()));
      }
    }
    for (const Value& v : s.values) {
      if (v.kind() != s.kind) {
        return invalid(n, fmt::format("parameter '{}' is {} but lists a {} value", s.name, kind_name(s.kind),
                                      kind_name(v.kind())));
      }
      if (s.kind == ParamKind::kEnum && !is_ident(v.as_enum())) {
        return invalid(n, fmt::format("enum parameter '{}': choice '{}' is not an identifier", s.name, v.as_enum()));
      }
      if (s.kind == ParamKind::kCode && !is_tag(v.code_tag())) {
        return invalid(n, fmt::format("code parameter '{}': tag '{}' must match [a-z0-9_]+", s.name, v.code_tag()));
      }
    }
  }
  bool any_derived = std::any_of(def.params.begin(), def.params.end(),
                                 [](const ParamSpec& s) { return s.role == ParamRole::kDerived; });
  if (any_derived && !def.derive) return invalid(n, "declares derived parameters but no derive function");

  std::string what = fmt::format("template '{}' ({})", n, def.file.empty() ? "text" : def.file);
  KILN_ASSIGN_OR_RETURN(auto parsed, detail::parse_text(text, what));
  KILN_RETURN_IF_ERROR(detail::check_names(*parsed, def.params));
  KILN_ASSIGN_OR_RETURN(auto entry, detail::parse_text(def.entry, fmt::format("template '{}' entry", n)));
  KILN_RETURN_IF_ERROR(detail::check_names(*entry, def.params));

  std::shared_ptr<Template> t(new Template());
  t->def_ = std::move(def);
  t->text_ = std::move(parsed);
  t->entry_ = std::move(entry);
  t->headers_ = std::move(headers);
  t->memo_ = std::make_shared<detail::GenerationMemo>();
  return std::shared_ptr<const Template>(std::move(t));
}

const ParamSpec* Template::param(std::string_view name) const {
  for (const ParamSpec& s : def_.params) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

Status Template::validate_given(const Params& p) const {
  for (const auto& [name, value] : p) {
    const ParamSpec* s = param(name);
    if (!s) {
      std::string known;
      for (const ParamSpec& d : def_.params) {
        if (d.role != ParamRole::kDerived) known += (known.empty() ? "" : ", ") + d.name;
      }
      return invalid(def_.name, fmt::format("unknown parameter '{}' (parameters: {})", name, known));
    }
    if (s->role == ParamRole::kDerived) {
      return invalid(def_.name, fmt::format("parameter '{}' is derived from the others; do not give it", name));
    }
    if (value.kind() != s->kind) {
      return invalid(def_.name, fmt::format("parameter '{}' must be {}, got {} '{}'", name, kind_name(s->kind),
                                            kind_name(value.kind()), value.short_text()));
    }
    if (s->kind == ParamKind::kEnum &&
        // Captured by name: clang before 16 cannot capture a structured binding (the fuzz build uses clang).
        std::none_of(s->values.begin(), s->values.end(), [&given = value](const Value& v) { return v == given; })) {
      std::string choices;
      for (const Value& v : s->values) choices += (choices.empty() ? "" : "|") + v.as_enum();
      return invalid(def_.name, fmt::format("parameter '{}': '{}' is not one of {}", name, value.as_enum(), choices));
    }
    if (s->kind == ParamKind::kCode && !is_tag(value.code_tag())) {
      return invalid(def_.name, fmt::format("code parameter '{}': tag '{}' must match [a-z0-9_]+", name, value.code_tag()));
    }
  }
  for (const ParamSpec& s : def_.params) {
    if (s.role != ParamRole::kDerived && !s.default_value && !p.contains(s.name)) {
      return invalid(def_.name, fmt::format("missing parameter '{}' ({} {})", s.name, kind_name(s.kind), s.doc));
    }
  }
  return Status();
}

Result<Params> Template::complete(const Params& given) const {
  // Accept an already-complete set too (given + derived), as render() results carry.
  Params base;
  for (const auto& [k, v] : given) {
    const ParamSpec* s = param(k);
    if (s && s->role == ParamRole::kDerived) continue;
    base.emplace(k, v);
  }
  bool had_derived = base.size() != given.size();
  KILN_RETURN_IF_ERROR(validate_given(base));
  for (const ParamSpec& s : def_.params) {
    if (s.default_value) base.emplace(s.name, *s.default_value);  // no-op when given
  }
  if (!def_.derive) return base;
  KILN_ASSIGN_OR_RETURN(Params derived, def_.derive(base));
  Params out = base;
  for (const ParamSpec& s : def_.params) {
    if (s.role != ParamRole::kDerived) continue;
    auto it = derived.find(s.name);
    if (it == derived.end()) return invalid(def_.name, fmt::format("derive() gave no value for '{}'", s.name));
    if (it->second.kind() != s.kind) {
      return invalid(def_.name, fmt::format("derive() gave '{}' as {}, declared {}", s.name, kind_name(it->second.kind()),
                                            kind_name(s.kind)));
    }
    if (had_derived) {
      auto g = given.find(s.name);
      if (g != given.end() && !(g->second == it->second)) {
        return invalid(def_.name, fmt::format("parameter '{}' is derived from the others; do not give it", s.name));
      }
    }
    out.emplace(s.name, it->second);
  }
  for (const auto& [k, v] : derived) {
    const ParamSpec* s = param(k);
    if (!s || s->role != ParamRole::kDerived) {
      return invalid(def_.name, fmt::format("derive() gave undeclared parameter '{}'", k));
    }
  }
  return out;
}

Result<std::string> Template::config_name(const Params& params) const {
  KILN_ASSIGN_OR_RETURN(Params p, complete(params));
  if (def_.config_name) return def_.config_name(p);
  std::string out = def_.name;
  for (const ParamSpec& s : def_.params) {
    if (s.role == ParamRole::kDerived) continue;
    const Value& v = p.at(s.name);
    if (v.kind() == ParamKind::kBool) {
      if (v.as_bool()) out += "_" + (s.abbrev.empty() ? s.name : s.abbrev);
      continue;
    }
    out += "_" + s.abbrev + v.short_text();
  }
  return out;
}

namespace {
Status supports_arch(const TemplateDef& def, int cc, bool arch_specific, const std::string& arch) {
  if (cc < def.min_cc) {
    return make_error(ErrorCode::kFailedPrecondition, fmt::format("needs sm_{} or newer; target is {}", def.min_cc, arch));
  }
  if (def.needs_arch_specific && !arch_specific) {
    return make_error(ErrorCode::kFailedPrecondition,
                      fmt::format("needs an arch-specific target (e.g. sm_{}a); target is {}", cc, arch));
  }
  return Status();
}
}  // namespace

Status Template::supports(const DeviceLimits& limits) const {
  return supports_arch(def_, limits.cc, limits.arch_specific, limits.arch);
}

Status Template::supports(const Target& target) const {
  return supports_arch(def_, target.compute_capability(), target.arch_specific(), target.arch);
}

Status Template::check(const Params& params, const DeviceLimits& limits) const {
  KILN_RETURN_IF_ERROR(supports(limits));
  KILN_ASSIGN_OR_RETURN(Params p, complete(params));
  // Tunables are tile sizes, warp counts, stages and widths: far below this bound. Refusing anything above it
  // here keeps every family's constraint arithmetic (products of a few parameters) clear of int64 overflow.
  constexpr int64_t kParamBound = int64_t{1} << 20;
  for (const auto& [name, value] : p) {
    if (value.kind() == ParamKind::kInt && (value.as_int() > kParamBound || value.as_int() < -kParamBound)) {
      return make_error(ErrorCode::kOutOfRange,
                        fmt::format("parameter '{}' = {} is out of range (|value| <= {})", name, value.as_int(), kParamBound));
    }
  }
  if (def_.constraints) return def_.constraints(p, limits);
  return Status();
}

Status Template::check_problem(const Params& params, const Shape& shape) const {
  KILN_ASSIGN_OR_RETURN(Params p, complete(params));
  if (shape.m < 0 || shape.n < 0 || shape.k < 0 || shape.batch < 1 || shape.splits < 1) {
    return make_error(ErrorCode::kInvalidArgument, "shape sizes must be >= 0 (batch and splits >= 1)");
  }
  constexpr int64_t kMax = (int64_t{1} << 31) - 1;
  if (shape.m > kMax || shape.n > kMax || shape.k > kMax) {
    return make_error(ErrorCode::kOutOfRange, "kiln kernels index with 32-bit ints: sizes must be < 2^31");
  }
  if (def_.problem_constraints) return def_.problem_constraints(p, shape);
  return Status();
}

Result<Launch> Template::geometry(const Params& params, const Shape& shape) const {
  KILN_RETURN_IF_ERROR(check_problem(params, shape));
  KILN_ASSIGN_OR_RETURN(Params p, complete(params));
  return def_.geometry(p, shape);
}

Result<Rendered> Template::render(const Params& params) const {
  // Memoised by the exact parameters given (complete or not: both name one configuration); errors are not
  // kept, so a bad parameter set is refused afresh with its message every time.
  const bool memo_on = generation_cache_enabled();
  std::string key;
  if (memo_on) {
    key = detail::params_key(params);
    if (auto hit = detail::memo_find(*memo_, &detail::GenerationMemo::renders, key)) {
      detail::count_render(true);
      return *hit;
    }
  }
  detail::count_render(false);
  KILN_ASSIGN_OR_RETURN(Rendered r, render_uncached(params));
  if (memo_on) {
    detail::memo_store(*memo_, &detail::GenerationMemo::renders, detail::kMaxMemoRenders, key,
                       std::make_shared<const Rendered>(r));
  }
  return r;
}

Result<Rendered> Template::render_uncached(const Params& params) const {
  KILN_ASSIGN_OR_RETURN(Params p, complete(params));
  Rendered r;
  KILN_ASSIGN_OR_RETURN(r.config_name, config_name(p));
  KILN_ASSIGN_OR_RETURN(r.source.source, detail::render_parsed(*text_, p));
  KILN_ASSIGN_OR_RETURN(r.source.entry, detail::render_parsed(*entry_, p));
  r.source.name = r.config_name;
  r.source.options.push_back("-std=c++17");
  for (const auto& o : def_.options) r.source.options.push_back(o);
  r.source.headers = headers_;
  if (def_.compile_cost) r.compile_cost = std::max(0.0, def_.compile_cost(p));
  r.params = std::move(p);
  return r;
}

// ------------------------------------------------------------------------------------------------ free text

Result<std::string> render_text(std::string_view text, const Params& values, std::string_view what) {
  KILN_ASSIGN_OR_RETURN(auto parsed, detail::parse_text(text, std::string(what)));
  return detail::render_parsed(*parsed, values);
}

Result<std::vector<std::string>> placeholders(std::string_view text, std::string_view what) {
  KILN_ASSIGN_OR_RETURN(auto parsed, detail::parse_text(text, std::string(what)));
  std::vector<std::string> names;
  detail::collect_names(parsed->nodes, names);
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

}  // namespace kiln::templates
