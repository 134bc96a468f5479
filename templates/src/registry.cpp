// The registry of built-in templates, and grid enumeration, pruning and sampling.
#include "kiln/templates/registry.h"

#include <algorithm>
#include <mutex>
#include <set>

#include <fmt/format.h>

#include "families.h"
#include "memo.h"
#include "kiln/embedded.h"

namespace kiln::templates_text {
std::span<const kiln::EmbeddedFile> embedded_files();  // templates/**/*.cu, *.cuh (kiln_embed)
}
namespace kiln::templates_abi {
std::span<const kiln::EmbeddedFile> embedded_files();  // kiln/templates/kernel_args.h
}

namespace kiln::templates {
namespace {

struct Registry {
  std::vector<TemplatePtr> templates;
  std::vector<Status> errors;
};

std::string_view find_embedded(std::string_view name, bool* found) {
  for (const auto& f : templates_text::embedded_files()) {
    if (f.name == name) {
      *found = true;
      return f.contents;
    }
  }
  for (const auto& f : templates_abi::embedded_files()) {
    if (f.name == name) {
      *found = true;
      return f.contents;
    }
  }
  *found = false;
  return {};
}

const Registry& registry() {
  static const Registry r = [] {
    Registry reg;
    std::vector<TemplateDef> defs;
    detail::add_norm_templates(defs);
    detail::add_softmax_templates(defs);
    detail::add_splitk_templates(defs);
    detail::add_allreduce_templates(defs);
#ifdef KILN_HAVE_GEMM_TEMPLATES
    detail::add_gemm_templates(defs);
#endif
    std::set<std::string> names;
    for (TemplateDef& def : defs) {
      std::string name = def.name;
      if (!names.insert(name).second) {
        reg.errors.push_back(make_error(ErrorCode::kInternal, fmt::format("template '{}' registered twice", name)));
        continue;
      }
      bool found = false;
      std::string_view text = find_embedded(def.file, &found);
      if (!found) {
        reg.errors.push_back(make_error(ErrorCode::kInternal,
                                        fmt::format("template '{}': no embedded file '{}'", name, def.file)));
        continue;
      }
      std::vector<Header> headers;
      std::vector<std::string> header_names = def.headers;
      if (std::find(header_names.begin(), header_names.end(), "kiln/templates/kernel_args.h") == header_names.end()) {
        header_names.push_back("kiln/templates/kernel_args.h");
      }
      bool ok = true;
      for (const std::string& h : header_names) {
        std::string_view content = find_embedded(h, &found);
        if (!found) {
          reg.errors.push_back(make_error(ErrorCode::kInternal,
                                          fmt::format("template '{}': no embedded header '{}'", name, h)));
          ok = false;
          break;
        }
        headers.push_back(Header{h, std::string(content)});
      }
      if (!ok) continue;
      auto t = Template::create(std::move(def), text, std::move(headers));
      if (!t.ok()) {
        reg.errors.push_back(std::move(t).status());
        continue;
      }
      reg.templates.push_back(*t);
    }
    std::sort(reg.templates.begin(), reg.templates.end(),
              [](const TemplatePtr& a, const TemplatePtr& b) { return a->name() < b->name(); });
    return reg;
  }();
  return r;
}

}  // namespace

std::span<const TemplatePtr> all_templates() { return registry().templates; }
std::span<const Status> registry_errors() { return registry().errors; }

Result<TemplatePtr> find_template(std::string_view name) {
  std::string known;
  for (const TemplatePtr& t : all_templates()) {
    if (t->name() == name) return t;
    known += (known.empty() ? "" : ", ") + t->name();
  }
  return make_error(ErrorCode::kNotFound, fmt::format("no template '{}' (templates: {})", name, known));
}

TemplatePtr superseded_on(const Template& t, const Target& arch_target) {
  if (t.def().superseded_by.empty()) return nullptr;
  auto by = find_template(t.def().superseded_by);
  if (!by.ok() || !(*by)->supports(arch_target).ok()) return nullptr;
  return *by;
}

std::vector<TemplatePtr> templates_for(std::string_view problem) {
  std::vector<TemplatePtr> out;
  for (const TemplatePtr& t : all_templates()) {
    if (t->problem() == problem) out.push_back(t);
  }
  return out;
}

// ------------------------------------------------------------------------------------------------ Grid

Result<Grid> Grid::create(TemplatePtr t, Params fixed) {
  Grid g;
  for (const auto& [name, v] : fixed) {
    const ParamSpec* s = t->param(name);
    if (!s) return make_error(ErrorCode::kInvalidArgument, fmt::format("template '{}': unknown parameter '{}'", t->name(), name));
    if (s->role == ParamRole::kDerived) {
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("template '{}': parameter '{}' is derived; it cannot be fixed", t->name(), name));
    }
    if (v.kind() != s->kind) {
      return make_error(ErrorCode::kInvalidArgument, fmt::format("template '{}': parameter '{}' must be {}, got {}",
                                                                 t->name(), name, kind_name(s->kind), kind_name(v.kind())));
    }
  }
  for (const ParamSpec& s : t->params()) {
    if (s.role == ParamRole::kDerived || fixed.contains(s.name)) continue;
    if (s.values.empty()) {
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("template '{}': parameter '{}' has no values to enumerate", t->name(), s.name));
    }
    g.axes_.push_back(&s);
    g.size_ *= s.values.size();
  }
  g.t_ = std::move(t);
  g.fixed_ = std::move(fixed);
  return g;
}

Params Grid::at(uint64_t index) const {
  Params p = fixed_;
  for (size_t i = axes_.size(); i-- > 0;) {
    const ParamSpec* s = axes_[i];
    uint64_t n = s->values.size();
    p.insert_or_assign(s->name, s->values[index % n]);
    index /= n;
  }
  return p;
}

std::vector<Params> pruned(const Grid& grid, const DeviceLimits& limits) {
  std::vector<Params> out;
  // check() refuses every configuration of a template the arch cannot run: no walk (the wgmma grid is ~1M).
  if (!grid.tmpl().supports(limits).ok()) return out;
  for (uint64_t i = 0; i < grid.size(); ++i) {
    Params p = grid.at(i);
    if (grid.tmpl().check(p, limits).ok()) out.push_back(std::move(p));
  }
  return out;
}

uint64_t pruned_count(const Grid& grid, const DeviceLimits& limits) {
  uint64_t n = 0;
  if (!grid.tmpl().supports(limits).ok()) return n;  // as pruned()
  for (uint64_t i = 0; i < grid.size(); ++i) {
    if (grid.tmpl().check(grid.at(i), limits).ok()) ++n;
  }
  return n;
}

namespace {
std::vector<Params> sample_uncached(const Grid& grid, const DeviceLimits& limits, size_t n, uint64_t seed);

uint64_t mix(uint64_t x) {  // splitmix64's finaliser: a fixed, platform-independent permutation
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

std::vector<Params> sample(const Grid& grid, const DeviceLimits& limits, size_t n, uint64_t seed) {
  // Walking the grid checks every configuration's constraints (thousands for the wgmma family): the same
  // grid, limits and size give the same sample, so it is memoised with the template.
  const bool memo_on = generation_cache_enabled();
  std::string key;
  if (memo_on) {
    key = fmt::format("{}\x1d{}\x1d{}\x1d{}", detail::params_key(grid.fixed()), detail::limits_key(limits), n, seed);
    if (auto hit = detail::memo_find(grid.tmpl().memo(), &detail::GenerationMemo::samples, key)) {
      detail::count_sample(true);
      return *hit;
    }
  }
  detail::count_sample(false);
  std::vector<Params> out = sample_uncached(grid, limits, n, seed);
  if (memo_on) {
    detail::memo_store(grid.tmpl().memo(), &detail::GenerationMemo::samples, detail::kMaxMemoSamples, key,
                       std::make_shared<const std::vector<Params>>(out));
  }
  return out;
}

namespace {
std::vector<Params> sample_uncached(const Grid& grid, const DeviceLimits& limits, size_t n, uint64_t seed) {
  // A template the target cannot run fails every check: no walk of its grid (967,680 wgmma configurations for
  // an sm_80 target, found slow by the fuzzer).
  if (!grid.tmpl().supports(limits).ok()) return {};
  // Every index in a fixed pseudo-random order; a configuration's constraints are checked only when the walk
  // reaches it. The sample is the same as checking the whole grid first (passing configurations in this
  // order: those adding an uncovered axis value, then the rest up to n), but the walk stops once every value
  // is covered and n are picked: a grid of 30,000 wgmma configurations is not checked whole for a sample of 64.
  std::vector<std::pair<uint64_t, uint64_t>> order;  // (hash, index)
  order.reserve(grid.size());
  for (uint64_t i = 0; i < grid.size(); ++i) order.emplace_back(mix(i ^ mix(seed)), i);
  std::sort(order.begin(), order.end());
  enum : uint8_t { kUnchecked, kPasses, kFails };
  std::vector<uint8_t> state(order.size(), kUnchecked);
  uint64_t checks = 0;
  auto passes = [&](size_t j) {
    if (state[j] == kUnchecked) {
      state[j] = grid.tmpl().check(grid.at(order[j].second), limits).ok() ? kPasses : kFails;
      ++checks;
    }
    return state[j] == kPasses;
  };
  const auto& axes = grid.axes();
  std::vector<std::vector<bool>> covered(axes.size());
  size_t uncovered = 0;
  for (size_t a = 0; a < axes.size(); ++a) {
    covered[a].assign(axes[a]->values.size(), false);
    uncovered += axes[a]->values.size();
  }
  auto value_index = [&](size_t a, uint64_t index) {
    uint64_t div = 1;
    for (size_t b = axes.size(); b-- > a + 1;) div *= axes[b]->values.size();
    return static_cast<size_t>((index / div) % axes[a]->values.size());
  };
  std::vector<bool> chosen(order.size(), false);
  std::vector<uint64_t> picked;
  // Each phase stops after kMaxMisses failed checks in a row: a value no passing configuration has, or fixed
  // parameters no configuration passes with, would otherwise walk the whole grid (a quarter of a million
  // checks for a wgmma grid with one impossible value fixed: seconds here, a minute under the sanitizers).
  // Values that pass at all pass far more often than one in kMaxMisses.
  constexpr int kMaxMisses = 8192;
  int misses = 0;
  // Coverage: configurations that add a value not yet covered.
  for (size_t j = 0; j < order.size() && uncovered > 0 && misses < kMaxMisses; ++j) {
    bool adds = false;
    for (size_t a = 0; a < axes.size() && !adds; ++a) adds = !covered[a][value_index(a, order[j].second)];
    if (!adds) continue;
    if (!passes(j)) {
      ++misses;
      continue;
    }
    misses = 0;
    for (size_t a = 0; a < axes.size(); ++a) {
      auto ref = covered[a][value_index(a, order[j].second)];
      if (!ref) --uncovered;
      ref = true;
    }
    chosen[j] = true;
    picked.push_back(order[j].second);
  }
  misses = 0;
  for (size_t j = 0; j < order.size() && picked.size() < n && misses < kMaxMisses; ++j) {
    if (chosen[j]) continue;
    const bool checked = state[j] != kUnchecked;
    if (passes(j)) {
      picked.push_back(order[j].second);
      misses = 0;
    } else if (!checked) {
      ++misses;
    }
  }
  detail::count_sample_checks(checks);
  std::vector<Params> out;
  out.reserve(picked.size());
  for (uint64_t i : picked) out.push_back(grid.at(i));
  return out;
}

}  // namespace

}  // namespace kiln::templates
