// The template engine without a GPU: syntax, parameter errors, determinism, pruning, grids and samples,
// geometry, epilogues, split-K subgraphs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "kiln/jit/key.h"
#include "kiln_test.h"
#include "kiln/templates/gemm.h"
#include "kiln/templates/templates.h"

namespace kiln::templates {
namespace {

using ::testing::HasSubstr;

DeviceLimits limits(const char* arch) { return *DeviceLimits::for_target(Target{arch}); }

// KernelSource's defaulted == needs Header ==, which kiln/jit does not declare: compare what rendering sets.
void expect_same_source(const KernelSource& a, const KernelSource& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.entry, b.entry);
  EXPECT_EQ(a.source, b.source);
  EXPECT_EQ(a.options, b.options);
  ASSERT_EQ(a.headers.size(), b.headers.size());
  for (size_t i = 0; i < a.headers.size(); ++i) {
    EXPECT_EQ(a.headers[i].name, b.headers[i].name);
    EXPECT_EQ(a.headers[i].content, b.headers[i].content);
  }
}

// The grid the whole-grid tests walk: the full grid, or for the big GEMM grids (tens of thousands of
// configurations, slow under ASan) the grid with problem parameters after the first fixed to their first
// value until it has at most 8192 configurations. The properties tested do not depend on the grid's size.
Grid test_grid(const TemplatePtr& t) {
  Params fixed;
  bool first = true;
  for (const ParamSpec& s : t->params()) {
    auto g = Grid::create(t, fixed);
    EXPECT_TRUE(g.ok());
    if (g->size() <= 8192) return *g;
    if (s.role != ParamRole::kProblem) continue;
    if (first) {
      first = false;
      continue;
    }
    fixed.emplace(s.name, s.values.front());
  }
  return *Grid::create(t, fixed);
}

// A small template for engine tests: an smem parameter whose constraint is the device's opt-in limit.
TemplateDef toy_def() {
  TemplateDef d{.name = "toy", .problem = "toy", .file = "toy.cu", .entry = "toy_${tile}"};
  d.params = {
      int_param("tile", ParamRole::kTunable, {32, 64}, "t", "tile"),
      int_param("smem_kib", ParamRole::kTunable, {16, 100, 200}, "s", "shared memory KiB"),
      bool_param("fast", ParamRole::kTunable, "fast", "fast path"),
      dtype_param("dtype", ParamRole::kProblem, {DType::kBF16, DType::kF16}, "", "dtype"),
      layout_param("layout_a", ParamRole::kProblem, "a", "A layout"),
      enum_param("swizzle", ParamRole::kTunable, {"none", "xor2"}, "", "swizzle"),
      derived_param("smem_bytes", ParamKind::kInt, "bytes"),
  };
  d.derive = [](const Params& p) -> Result<Params> {
    return Params{{"smem_bytes", Value::integer(get_int(p, "smem_kib") * 1024)}};
  };
  d.constraints = [](const Params& p, const DeviceLimits& l) {
    return require(get_int(p, "smem_bytes") <= l.smem_per_block_optin, ErrorCode::kOutOfRange,
                   "shared memory over the opt-in limit");
  };
  d.geometry = [](const Params& p, const Shape& s) -> Result<Launch> {
    Launch l;
    l.grid.x = static_cast<unsigned>((s.m + get_int(p, "tile") - 1) / get_int(p, "tile"));
    l.shared_bytes = static_cast<unsigned>(get_int(p, "smem_bytes"));
    return l;
  };
  return d;
}
constexpr const char* kToyText =
    "typedef ${dtype} T; // ${dtype.name} ${dtype.bytes}\n"
    "constexpr int kTile = ${tile}, kSmem = ${smem_bytes}; constexpr bool kRowA = ${layout_a.row};\n"
    "${if fast}\n#define FAST 1\n${else}\n#define FAST 0\n${endif}\n"
    "${if !fast}slow${endif} $$ ${swizzle} ${layout_a}\n"
    "extern \"C\" __global__ void toy_${tile}() {}\n";

Params toy_params() {
  return {{"tile", Value::integer(32)},        {"smem_kib", Value::integer(16)},
          {"fast", Value::boolean(true)},      {"dtype", Value::dtype(DType::kBF16)},
          {"layout_a", Value::layout(Layout::kColMajor)}, {"swizzle", Value::enumeration("xor2")}};
}

TemplatePtr toy() {
  auto t = Template::create(toy_def(), kToyText, {});
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return *t;
}

TEST(Registry, HasTheBuiltInTemplatesAndNoErrors) {
  for (const Status& s : registry_errors()) ADD_FAILURE() << s.to_string();
  std::set<std::string> names;
  for (const TemplatePtr& t : all_templates()) names.insert(t->name());
  for (const char* n : {"rmsnorm", "layernorm", "softmax", "splitk_reduce"}) EXPECT_TRUE(names.contains(n)) << n;
  KILN_ASSERT_OK_AND_ASSIGN(TemplatePtr rms, find_template("rmsnorm"));
  EXPECT_EQ(rms->problem(), "rmsnorm");
  EXPECT_EQ(templates_for("softmax").size(), 2u);  // softmax, softmax_cluster (long rows)
  auto missing = find_template("nope");
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("rmsnorm"));
}

TEST(Syntax, RendersEveryKindAndBlock) {
  KILN_ASSERT_OK_AND_ASSIGN(Rendered r, toy()->render(toy_params()));
  EXPECT_EQ(r.source.source,
            "typedef __nv_bfloat16 T; // bf16 2\n"
            "constexpr int kTile = 32, kSmem = 16384; constexpr bool kRowA = false;\n"
            "#define FAST 1\n"
            " $ xor2 1\n"
            "extern \"C\" __global__ void toy_32() {}\n");
  EXPECT_EQ(r.source.entry, "toy_32");
  EXPECT_EQ(r.config_name, "toy_t32_s16_fast_bf16_acol_xor2");
  EXPECT_EQ(r.source.name, r.config_name);
  EXPECT_THAT(r.source.options, ::testing::Contains("-std=c++17"));
  Params slow = toy_params();
  slow["fast"] = Value::boolean(false);
  KILN_ASSERT_OK_AND_ASSIGN(Rendered s, toy()->render(slow));
  EXPECT_THAT(s.source.source, HasSubstr("#define FAST 0\nslow $"));
  EXPECT_EQ(s.config_name, "toy_t32_s16_bf16_acol_xor2");
}

TEST(Syntax, DirectiveLines) {
  Params v{{"b", Value::boolean(true)}};
  // Alone on their lines (indented or not), directives leave no lines behind.
  EXPECT_EQ(*render_text("a\n  ${if b}\n  x\n  ${else}\n  y\n  ${endif}\nz", v), "a\n  x\nz");
  // Inside a line, the newline after one stays.
  EXPECT_EQ(*render_text("a ${if b}x${endif}\nz", v), "a x\nz");
  EXPECT_EQ(*render_text("${if b}\nx\n${endif}", v), "x\n");
}

TEST(Syntax, FreeTextAndPlaceholders) {
  Params v{{"n", Value::integer(3)}, {"c", Value::code("x+1", "inc")}, {"b", Value::boolean(false)}};
  KILN_ASSERT_OK_AND_ASSIGN(std::string out, render_text("${n}:${c}:${c.tag}${if b}B${else}!B${endif}", v));
  EXPECT_EQ(out, "3:x+1:inc!B");
  KILN_ASSERT_OK_AND_ASSIGN(auto names, placeholders("${b} ${a.name} ${if c}${b}${endif}"));
  EXPECT_EQ(names, (std::vector<std::string>{"a", "b", "c"}));
}

struct BadText {
  const char* text;
  const char* error;
};

TEST(Syntax, MalformedTextsAreNamedErrors) {
  for (const BadText& b : std::vector<BadText>{
           {"x ${tile", "without a closing '}'"},
           {"${if fast} x", "'${if}' without '${endif}'"},
           {"x ${endif}", "'${endif}' without '${if}'"},
           {"${else}", "outside"},
           {"${if fast}a${else}b${else}c${endif}", "a second '${else}'"},
           {"${Tile}", "not a parameter name"},
           {"${nope}", "placeholder 'nope' is not a declared parameter"},
           {"${if tile}x${endif}", "needs a bool parameter; 'tile' is int"},
           {"${tile.bytes}", "'.bytes' is not an attribute of int parameter 'tile'"},
       }) {
    auto t = Template::create(toy_def(), b.text, {});
    ASSERT_FALSE(t.ok()) << b.text;
    EXPECT_EQ(t.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(t.status().message(), HasSubstr(b.error)) << b.text;
  }
  // The line of the problem is named too.
  auto t = Template::create(toy_def(), "line one\nline two ${nope}\n", {});
  EXPECT_THAT(t.status().message(), HasSubstr("line 2"));
}

TEST(Params, EachBadParameterIsANamedError) {
  auto t = toy();
  struct Case {
    std::function<void(Params&)> edit;
    const char* error;
  };
  for (const Case& c : std::vector<Case>{
           {[](Params& p) { p["colour"] = Value::integer(1); }, "unknown parameter 'colour'"},
           {[](Params& p) { p.erase("tile"); }, "missing parameter 'tile'"},
           {[](Params& p) { p["tile"] = Value::boolean(true); }, "parameter 'tile' must be int, got bool"},
           {[](Params& p) { p["dtype"] = Value::integer(2); }, "parameter 'dtype' must be dtype, got int"},
           {[](Params& p) { p["swizzle"] = Value::enumeration("xor9"); }, "'xor9' is not one of none|xor2"},
           {[](Params& p) { p["smem_bytes"] = Value::integer(1); }, "'smem_bytes' is derived"},
           {[](Params& p) { p["layout_a"] = Value::enumeration("row"); }, "parameter 'layout_a' must be layout"},
       }) {
    Params p = toy_params();
    c.edit(p);
    auto r = t->render(p);
    ASSERT_FALSE(r.ok()) << c.error;
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr(c.error));
    EXPECT_THAT(r.status().message(), HasSubstr("template 'toy'"));
    // The same errors stop constraint checks and geometry: nothing works on a bad parameter set.
    EXPECT_FALSE(t->check(p, limits("sm_90")).ok());
    EXPECT_FALSE(t->geometry(p, Shape{}).ok());
  }
}

TEST(Params, DeclarationsAreValidated) {
  TemplateDef d = toy_def();
  d.params.push_back(int_param("tile", ParamRole::kTunable, {1}, "", ""));
  EXPECT_THAT(Template::create(d, kToyText, {}).status().message(), HasSubstr("'tile' declared twice"));
  d = toy_def();
  d.params[0].values.push_back(Value::boolean(true));
  EXPECT_THAT(Template::create(d, kToyText, {}).status().message(), HasSubstr("lists a bool value"));
  d = toy_def();
  d.derive = nullptr;
  EXPECT_THAT(Template::create(d, kToyText, {}).status().message(), HasSubstr("no derive function"));
  d = toy_def();
  d.geometry = nullptr;
  EXPECT_THAT(Template::create(d, kToyText, {}).status().message(), HasSubstr("no launch geometry"));
  d = toy_def();
  d.entry = "toy_${size}";
  EXPECT_THAT(Template::create(d, kToyText, {}).status().message(), HasSubstr("'size' is not a declared parameter"));
  // A code value's tag must be usable in a name.
  d = toy_def();
  d.params.push_back(code_param("epi", ParamRole::kProblem, {Value::code("x", "Bad Tag")}, "", ""));
  EXPECT_THAT(Template::create(d, kToyText, {}).status().message(), HasSubstr("tag 'Bad Tag'"));
}

// A tunable added to a template later declares a default: parameter sets written before it (without it) stay
// valid and complete to the default; only tunables may have one, and it must be one of the values.
TEST(Params, DefaultsFillOmittedTunables) {
  TemplateDef d = toy_def();
  for (ParamSpec& s : d.params) {
    if (s.name == "swizzle") s.default_value = Value::enumeration("none");
  }
  auto t = Template::create(d, kToyText, {});
  KILN_ASSERT_OK(t);
  Params old = toy_params();
  old.erase("swizzle");
  KILN_ASSERT_OK_AND_ASSIGN(Params full, (*t)->complete(old));
  EXPECT_EQ(full.at("swizzle"), Value::enumeration("none"));
  KILN_ASSERT_OK_AND_ASSIGN(Rendered a, (*t)->render(old));
  Params explicit_none = toy_params();
  explicit_none.insert_or_assign("swizzle", Value::enumeration("none"));
  KILN_ASSERT_OK_AND_ASSIGN(Rendered b, (*t)->render(explicit_none));
  EXPECT_EQ(a.source.source, b.source.source);
  EXPECT_EQ(a.config_name, b.config_name);
  // A given value wins over the default, and is still checked.
  KILN_ASSERT_OK_AND_ASSIGN(full, (*t)->complete(toy_params()));
  EXPECT_EQ(full.at("swizzle"), Value::enumeration("xor2"));
  Params bad = toy_params();
  bad.insert_or_assign("swizzle", Value::enumeration("xor9"));
  EXPECT_FALSE((*t)->complete(bad).ok());
  // Without a default the parameter is still required.
  Params no_tile = toy_params();
  no_tile.erase("tile");
  EXPECT_THAT((*t)->complete(no_tile).status().message(), HasSubstr("missing parameter 'tile'"));

  TemplateDef e = toy_def();
  for (ParamSpec& s : e.params) {
    if (s.name == "swizzle") s.default_value = Value::enumeration("xor9");
  }
  EXPECT_THAT(Template::create(e, kToyText, {}).status().message(), HasSubstr("default 'xor9' is not one of its values"));
  e = toy_def();
  for (ParamSpec& s : e.params) {
    if (s.name == "dtype") s.default_value = Value::dtype(DType::kBF16);
  }
  EXPECT_THAT(Template::create(e, kToyText, {}).status().message(), HasSubstr("only tunables have defaults"));
}

TEST(Determinism, SameParamsSameTextAndKey) {
  for (const TemplatePtr& t : all_templates()) {
    Grid g = test_grid(t);
    auto picks = sample(g, limits("sm_90a"), 3);
    ASSERT_FALSE(picks.empty()) << t->name();
    for (const Params& p : picks) {
      KILN_ASSERT_OK_AND_ASSIGN(Rendered a, t->render(p));
      // A copy built in another insertion order, and a re-render of the complete parameters.
      Params reversed;
      for (auto it = p.rbegin(); it != p.rend(); ++it) reversed.insert(*it);
      KILN_ASSERT_OK_AND_ASSIGN(Rendered b, t->render(reversed));
      KILN_ASSERT_OK_AND_ASSIGN(Rendered c, t->render(a.params));
      expect_same_source(a.source, b.source);
      expect_same_source(a.source, c.source);
      EXPECT_EQ(make_key(a.source, Target{"sm_90"}), make_key(b.source, Target{"sm_90"}));
    }
    // Distinct configurations have distinct names and texts.
    std::set<std::string> names, texts;
    for (const Params& p : picks) {
      KILN_ASSERT_OK_AND_ASSIGN(Rendered r, t->render(p));
      names.insert(r.config_name);
      texts.insert(r.source.source);
    }
    EXPECT_EQ(names.size(), picks.size()) << t->name();
    EXPECT_EQ(texts.size(), picks.size()) << t->name();
  }
}

TEST(Render, EveryPrunedConfigurationOfEveryTemplateRenders) {
  for (const TemplatePtr& t : all_templates()) {
    Grid g = test_grid(t);
    std::vector<Params> configs = g.size() <= 4096 ? pruned(g, limits("sm_90a")) : sample(g, limits("sm_90a"), 256);
    EXPECT_FALSE(configs.empty()) << t->name();
    std::set<std::string> names;
    for (const Params& p : configs) {
      auto r = t->render(p);
      ASSERT_TRUE(r.ok()) << t->name() << " " << to_string(p) << ": " << r.status().to_string();
      EXPECT_FALSE(r->source.source.empty());
      EXPECT_EQ(r->source.source.find("${"), std::string::npos) << r->config_name;
      names.insert(r->config_name);
    }
    EXPECT_EQ(names.size(), configs.size()) << t->name() << ": configuration names are not unique";
  }
}

TEST(Limits, KnownDefaultsAndDevices) {
  EXPECT_EQ(limits("sm_80").smem_per_block_optin, 163 * 1024);
  EXPECT_EQ(limits("sm_90").smem_per_block_optin, 227 * 1024);
  EXPECT_EQ(limits("sm_90").sm_count, 132);
  EXPECT_TRUE(limits("sm_90a").arch_specific);
  EXPECT_FALSE(limits("sm_90").measured);
  EXPECT_EQ(DeviceLimits::for_target(Target{"sm_75"}).status().code(), ErrorCode::kInvalidArgument);
  DeviceInfo info;
  info.sm_count = 7;
  info.max_shared_per_block_optin = 1000;
  info.max_threads_per_block = 512;
  DeviceLimits l = DeviceLimits::from_device(info, Target{"sm_90a"});
  EXPECT_EQ(l.sm_count, 7);
  EXPECT_EQ(l.smem_per_block_optin, 1000);
  EXPECT_EQ(l.cc, 90);
  EXPECT_TRUE(l.measured);
}

TEST(Pruning, SharedMemoryAgainstTheArchLimit) {
  auto t = toy();
  Params p = toy_params();
  p["smem_kib"] = Value::integer(200);
  Status s80 = t->check(p, limits("sm_80"));
  EXPECT_EQ(s80.code(), ErrorCode::kOutOfRange);
  EXPECT_THAT(s80.message(), HasSubstr("opt-in"));
  KILN_EXPECT_OK(t->check(p, limits("sm_90")));
  KILN_ASSERT_OK_AND_ASSIGN(Grid g, Grid::create(t));
  EXPECT_EQ(g.size(), 2u * 3 * 2 * 2 * 2 * 2);
  EXPECT_EQ(pruned_count(g, limits("sm_90")), g.size());
  EXPECT_EQ(pruned_count(g, limits("sm_80")), g.size() / 3 * 2);
}

TEST(Pruning, ArchRequirements) {
  TemplateDef d = toy_def();
  d.needs_arch_specific = true;
  d.min_cc = 90;
  KILN_ASSERT_OK_AND_ASSIGN(TemplatePtr t, Template::create(d, kToyText, {}));
  EXPECT_THAT(t->check(toy_params(), limits("sm_80")).message(), HasSubstr("needs sm_90"));
  EXPECT_THAT(t->check(toy_params(), limits("sm_90")).message(), HasSubstr("arch-specific"));
  KILN_EXPECT_OK(t->check(toy_params(), limits("sm_90a")));
  // The same rule for a compile target alone (choice generation and supersession decide by it).
  EXPECT_THAT(t->supports(Target{"sm_80"}).message(), HasSubstr("needs sm_90"));
  EXPECT_THAT(t->supports(Target{"sm_90"}).message(), HasSubstr("arch-specific"));
  KILN_EXPECT_OK(t->supports(Target{"sm_90a"}));
  KILN_EXPECT_OK(t->supports(Target{"sm_100a"}));
  // Pruning for an arch the template cannot run leaves nothing (without walking the grid), for one it can every
  // configuration its constraints allow.
  KILN_ASSERT_OK_AND_ASSIGN(Grid g, Grid::create(t));
  EXPECT_EQ(pruned_count(g, limits("sm_80")), 0u);
  EXPECT_TRUE(pruned(g, limits("sm_90")).empty());
  EXPECT_EQ(pruned_count(g, limits("sm_90a")), g.size());
  EXPECT_EQ(pruned(g, limits("sm_90a")).size(), g.size());
}

TEST(Pruning, RowTemplates) {
  KILN_ASSERT_OK_AND_ASSIGN(TemplatePtr rms, find_template("rmsnorm"));
  Params p{{"dtype", Value::dtype(DType::kF32)}, {"residual", Value::boolean(false)}, {"threads", Value::integer(256)},
           {"rows_per_block", Value::integer(1)}, {"vec", Value::integer(4)},          {"items", Value::integer(2)}};
  KILN_EXPECT_OK(rms->check(p, limits("sm_90")));
  Params wide = p;
  wide["vec"] = Value::integer(8);  // 32 bytes per access
  EXPECT_THAT(rms->check(wide, limits("sm_90")).message(), HasSubstr("at most 16 bytes"));
  Params regs = p;
  regs["threads"] = Value::integer(1024);
  regs["items"] = Value::integer(16);
  EXPECT_THAT(rms->check(regs, limits("sm_90")).message(), HasSubstr("registers"));
  Params split = p;
  split["threads"] = Value::integer(64);
  split["rows_per_block"] = Value::integer(4);
  EXPECT_THAT(rms->check(split, limits("sm_90")).message(), HasSubstr("whole number of warps"));
  Params three = p;
  three["threads"] = Value::integer(96);
  EXPECT_THAT(rms->check(three, limits("sm_90")).message(), HasSubstr("power of two"));
  // Problem constraints: cols must be a multiple of vec.
  KILN_EXPECT_OK(rms->check_problem(p, Shape{7, 4096}));
  EXPECT_THAT(rms->check_problem(p, Shape{7, 4098}).message(), HasSubstr("not a multiple of vec 4"));
  EXPECT_EQ(rms->check_problem(p, Shape{7, int64_t{1} << 32}).code(), ErrorCode::kOutOfRange);
}

TEST(Geometry, RowTemplates) {
  KILN_ASSERT_OK_AND_ASSIGN(TemplatePtr sm, find_template("softmax"));
  Params p{{"dtype", Value::dtype(DType::kBF16)}, {"threads", Value::integer(128)},
           {"rows_per_block", Value::integer(4)}, {"vec", Value::integer(8)}, {"items", Value::integer(1)}};
  KILN_ASSERT_OK_AND_ASSIGN(Launch l, sm->geometry(p, Shape{17, 64}));
  EXPECT_EQ(l.grid.x, 5u);
  EXPECT_EQ(l.block.x, 128u);
  EXPECT_EQ(l.align_elems, 8u);
  EXPECT_EQ(l.align_bytes, 16u);
  EXPECT_FALSE(sm->geometry(p, Shape{17, 60}).ok());
  KILN_ASSERT_OK_AND_ASSIGN(Rendered r, sm->render(p));
  EXPECT_EQ(r.config_name, "softmax_bf16_t128_r4_v8_i1");
  EXPECT_EQ(get_int(r.params, "row_threads"), 32);
}

TEST(Grid, FixedParametersAndIndexing) {
  auto t = toy();
  KILN_ASSERT_OK_AND_ASSIGN(Grid g, Grid::create(t, {{"dtype", Value::dtype(DType::kF16)}}));
  EXPECT_EQ(g.size(), 2u * 3 * 2 * 2 * 2);
  std::set<std::string> names;
  for (uint64_t i = 0; i < g.size(); ++i) {
    Params p = g.at(i);
    EXPECT_EQ(get_dtype(p, "dtype"), DType::kF16);
    names.insert(*t->config_name(p));
  }
  EXPECT_EQ(names.size(), g.size());
  EXPECT_THAT(Grid::create(t, {{"nope", Value::integer(1)}}).status().message(), HasSubstr("unknown parameter 'nope'"));
  EXPECT_THAT(Grid::create(t, {{"smem_bytes", Value::integer(1)}}).status().message(), HasSubstr("derived"));
}

// sample() checks configurations lazily, in its pseudo-random order; this is the definition it must match:
// check the whole grid, order the passing ones, take those adding an uncovered value, then fill up to n.
std::vector<Params> sample_by_definition(const Grid& g, const DeviceLimits& lim, size_t n, uint64_t seed) {
  auto mix = [](uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  std::vector<std::pair<uint64_t, uint64_t>> order;
  for (uint64_t i = 0; i < g.size(); ++i) {
    if (g.tmpl().check(g.at(i), lim).ok()) order.emplace_back(mix(i ^ mix(seed)), i);
  }
  std::sort(order.begin(), order.end());
  std::set<std::pair<std::string, std::string>> covered;
  std::vector<bool> chosen(order.size(), false);
  std::vector<Params> out;
  for (size_t j = 0; j < order.size(); ++j) {
    Params p = g.at(order[j].second);
    bool adds = false;
    for (const ParamSpec* a : g.axes()) adds |= !covered.count({a->name, p.at(a->name).short_text()});
    if (!adds) continue;
    for (const ParamSpec* a : g.axes()) covered.insert({a->name, p.at(a->name).short_text()});
    chosen[j] = true;
    out.push_back(p);
  }
  for (size_t j = 0; j < order.size() && out.size() < n; ++j) {
    if (!chosen[j]) out.push_back(g.at(order[j].second));
  }
  return out;
}

TEST(Sample, TheLazyWalkPicksWhatCheckingTheWholeGridPicks) {
  templates::set_generation_cache(false);  // every call walks the grid
  for (const TemplatePtr& t : all_templates()) {
    Grid g = test_grid(t);
    for (const char* arch : {"sm_90a", "sm_80"}) {
      for (size_t n : {size_t{1}, size_t{5}, size_t{64}}) {
        for (uint64_t seed : {0u, 7u}) {
          EXPECT_EQ(sample(g, limits(arch), n, seed), sample_by_definition(g, limits(arch), n, seed))
              << t->name() << " " << arch << " n=" << n << " seed=" << seed;
        }
      }
    }
  }
  // The wgmma family's whole grid for one GEMM problem, as choice generation samples it (30,240 configurations).
  KILN_ASSERT_OK_AND_ASSIGN(TemplatePtr w, find_template("gemm_wgmma_sm90"));
  KILN_ASSERT_OK_AND_ASSIGN(
      Grid g, Grid::create(w, gemm_problem_params(DType::kBF16, Layout::kRowMajor, Layout::kColMajor, {})));
  EXPECT_EQ(sample(g, limits("sm_90a"), 64, 0), sample_by_definition(g, limits("sm_90a"), 64, 0));
  templates::set_generation_cache(true);
}

// Fixed parameters no configuration passes with, or a target the template cannot run on, cost a bounded walk
// (the fuzzer found a quarter-million-check walk of the wgmma grid with one impossible value fixed); a
// feasible sample is unchanged (TheLazyWalkPicksWhatCheckingTheWholeGridPicks).
TEST(Sample, ImpossibleParametersCostABoundedWalk) {
  templates::set_generation_cache(false);
  KILN_ASSERT_OK_AND_ASSIGN(TemplatePtr w, find_template("gemm_wgmma_sm90"));
  auto checks_of = [&](const Grid& g, const char* arch, size_t* picked) {
    const uint64_t before = templates::generation_stats().sample_checks;
    *picked = sample(g, limits(arch), 64).size();
    return templates::generation_stats().sample_checks - before;
  };
  KILN_ASSERT_OK_AND_ASSIGN(Grid whole, Grid::create(w, {}));
  ASSERT_GT(whole.size(), 500000u);
  size_t picked = 1;
  EXPECT_EQ(checks_of(whole, "sm_80", &picked), 0u) << "wgmma needs sm_90a: nothing to check";
  EXPECT_EQ(picked, 0u);
  KILN_ASSERT_OK_AND_ASSIGN(Grid impossible, Grid::create(w, {{"consumers", Value::integer(63)}}));
  ASSERT_GT(impossible.size(), 100000u);
  EXPECT_LE(checks_of(impossible, "sm_90a", &picked), 2u * 8192u);
  EXPECT_EQ(picked, 0u);
  EXPECT_GT(checks_of(whole, "sm_90a", &picked), 0u);
  EXPECT_EQ(picked, 64u);
  templates::set_generation_cache(true);
}

TEST(Sample, CoversEveryValueDeterministically) {
  // sm_90a: every template (the wgmma family needs an arch-specific target).
  for (const TemplatePtr& t : all_templates()) {
    Grid g = test_grid(t);
    auto a = sample(g, limits("sm_90a"), 4);
    auto b = sample(g, limits("sm_90a"), 4);
    EXPECT_EQ(a, b) << t->name();
    auto all = pruned(g, limits("sm_90a"));
    for (const ParamSpec* axis : g.axes()) {
      for (const Value& v : axis->values) {
        bool possible = std::any_of(all.begin(), all.end(), [&](const Params& p) { return p.at(axis->name) == v; });
        bool covered = std::any_of(a.begin(), a.end(), [&](const Params& p) { return p.at(axis->name) == v; });
        EXPECT_EQ(possible, covered) << t->name() << " " << axis->name << "=" << v.short_text();
      }
    }
    for (const Params& p : a) KILN_EXPECT_OK(t->check(p, limits("sm_90a")));
    auto big = sample(g, limits("sm_90a"), 40);
    EXPECT_EQ(big.size(), std::min<size_t>(std::max<size_t>(40, a.size()), all.size()));
    if (all.size() > a.size()) {
      EXPECT_NE(sample(g, limits("sm_90a"), 4, 1), a) << "the seed changes the sample";
    }
  }
}

TEST(Epilogue, RendersCompositionsDeterministically) {
  KILN_ASSERT_OK_AND_ASSIGN(EpilogueSpec spec, parse_epilogue("bias+gelu", DType::kF16));
  EXPECT_EQ(spec.ops, (std::vector<EpilogueOp>{EpilogueOp::kBias, EpilogueOp::kGelu}));
  EXPECT_EQ(spec.tag(), "bias_gelu_f16");
  std::string s = render_epilogue(spec);
  EXPECT_EQ(s, render_epilogue(spec));
  EXPECT_THAT(s, HasSubstr("typedef __half kiln_epilogue_out_t;"));
  EXPECT_THAT(s, HasSubstr("kiln_gelu_tanh"));
  EXPECT_THAT(s, HasSubstr("#define KILN_EPILOGUE_USES_ROW_COL 1"));
  EXPECT_LT(s.find("ep.bias"), s.find("kiln_gelu_tanh")) << "ops apply in order";
  KILN_ASSERT_OK_AND_ASSIGN(EpilogueSpec none, parse_epilogue("", DType::kF32));
  EXPECT_EQ(none.tag(), "none_f32");
  EXPECT_THAT(render_epilogue(none), HasSubstr("#define KILN_EPILOGUE_USES_ROW_COL 0"));
  EXPECT_THAT(parse_epilogue("bias+tanh", DType::kBF16).status().message(), HasSubstr("unknown epilogue op 'tanh'"));
  EpilogueSpec mixed = spec;
  mixed.bias_dtype = DType::kF32;
  EXPECT_EQ(mixed.tag(), "biasf32_gelu_f16");
  Value v = epilogue_value(spec);
  EXPECT_EQ(v.kind(), ParamKind::kCode);
  EXPECT_EQ(v.code_tag(), "bias_gelu_f16");
}

// A GEMM-shaped template with the `partials` problem parameter, for the subgraph description.
TemplateDef fake_gemm_def() {
  TemplateDef d{.name = "fake_gemm", .problem = "gemm", .file = "fake.cu", .entry = "fake_gemm"};
  d.params = {int_param("bm", ParamRole::kTunable, {64, 128}, "", ""),
              bool_param("partials", ParamRole::kProblem, "partials", "")};
  d.geometry = [](const Params& p, const Shape& s) -> Result<Launch> {
    Launch l;
    l.grid.x = static_cast<unsigned>((s.m + get_int(p, "bm") - 1) / get_int(p, "bm"));
    l.grid.z = static_cast<unsigned>(s.splits);
    return l;
  };
  return d;
}

TEST(Subgraph, SplitKDescribesPartialsAndReduce) {
  KILN_ASSERT_OK_AND_ASSIGN(TemplatePtr gemm, Template::create(fake_gemm_def(), "${bm} ${partials}", {}));
  EpilogueSpec ep;
  ep.ops = {EpilogueOp::kBias, EpilogueOp::kRelu};
  Params reduce{{"threads", Value::integer(256)}, {"vec", Value::integer(4)}};
  KILN_ASSERT_OK_AND_ASSIGN(Subgraph g, make_splitk_gemm(gemm, {{"bm", Value::integer(128)}}, reduce, ep,
                                                         Shape{300, 200, 1000}, 4));
  ASSERT_EQ(g.steps.size(), 2u);
  // ceil(1000 / 4) = 250 -> 256 per slice -> 4 slices.
  EXPECT_EQ(g.steps[0].k_per_split, 256);
  EXPECT_EQ(g.steps[0].split_k, 4);
  EXPECT_EQ(g.steps[0].binding, Binding::kGemmPartials);
  EXPECT_TRUE(get_bool(g.steps[0].kernel.params, "partials"));
  EXPECT_EQ(g.steps[0].geometry.grid.z, 4u);
  EXPECT_EQ(g.steps[1].binding, Binding::kSplitKReduce);
  EXPECT_EQ(g.steps[1].tmpl->name(), "splitk_reduce");
  EXPECT_EQ(g.steps[1].kernel.config_name, "splitk_reduce_bias_relu_bf16_t256_v4");
  EXPECT_EQ(g.workspace_bytes, 4u * 300 * 200 * sizeof(float));
  EXPECT_THAT(g.name, HasSubstr("splitk4_"));
  // Asking for more slices than 128-wide K chunks gives fewer slices.
  KILN_ASSERT_OK_AND_ASSIGN(Subgraph g2, make_splitk_gemm(gemm, {{"bm", Value::integer(64)}}, reduce, ep,
                                                          Shape{8, 8, 300}, 16));
  EXPECT_EQ(g2.steps[0].split_k, 3);
  EXPECT_EQ(g2.steps[1].split_k, 3);
  // A template without `partials` cannot be a split-K step.
  KILN_ASSERT_OK_AND_ASSIGN(TemplatePtr rms, find_template("rmsnorm"));
  EXPECT_THAT(make_splitk_gemm(rms, {}, reduce, ep, Shape{8, 8, 8}, 2).status().message(), HasSubstr("'partials'"));
  EXPECT_FALSE(make_splitk_gemm(gemm, {{"bm", Value::integer(64)}}, reduce, ep, Shape{8, 8, 8}, 0).ok());
  // The reduce step's bad parameter is named.
  Params bad = reduce;
  bad["vecc"] = Value::integer(1);
  EXPECT_THAT(make_splitk_gemm(gemm, {{"bm", Value::integer(64)}}, bad, ep, Shape{8, 8, 8}, 2).status().message(),
              HasSubstr("unknown parameter 'vecc'"));
}

TEST(KernelArgs, LayoutIsFixed) {
  // The structs are passed by value to kernels compiled by NVRTC: their layout must not drift silently.
  EXPECT_EQ(sizeof(KilnEpilogueArgs), 32u);
  EXPECT_EQ(sizeof(KilnGemmArgs), 32u + 24u + 24u + 32u);
  EXPECT_EQ(sizeof(KilnNormArgs), 48u + 8u + 32u + 8u);
  EXPECT_EQ(sizeof(KilnSoftmaxArgs), 16u + 8u + 16u + 8u);
  EXPECT_EQ(sizeof(KilnSplitKReduceArgs), 16u + 8u + 8u + 16u + 32u);
}

}  // namespace
}  // namespace kiln::templates

namespace kiln::templates {
namespace {

uint16_t bits(DType t, float v) {
  uint16_t b = 0;
  store_element(t, v, &b);
  return b;
}

TEST(HostElements, RoundToNearestEvenAndKeepSpecialValues) {
  EXPECT_EQ(bits(DType::kBF16, 1.0f), 0x3F80);
  EXPECT_EQ(bits(DType::kBF16, 1.0f + 0x1p-8f), 0x3F80);      // a tie goes to the even neighbour
  EXPECT_EQ(bits(DType::kBF16, 1.0f + 3 * 0x1p-8f), 0x3F82);  // and up when that one is even
  EXPECT_EQ(bits(DType::kBF16, std::nanf("")), 0x7FC0);
  EXPECT_EQ(bits(DType::kF16, 1.0f), 0x3C00);
  EXPECT_EQ(bits(DType::kF16, -2.5f), 0xC100);
  EXPECT_EQ(bits(DType::kF16, 65504.0f), 0x7BFF);
  EXPECT_EQ(bits(DType::kF16, 70000.0f), 0x7C00);             // overflow: infinity
  EXPECT_EQ(bits(DType::kF16, 0x1p-24f), 0x0001);             // the smallest subnormal
  EXPECT_EQ(bits(DType::kF16, 0x1p-25f), 0x0000);             // half of it: the even neighbour, zero
  EXPECT_EQ(bits(DType::kF16, 3 * 0x1p-25f), 0x0002);
  const uint16_t pi_bf16 = 0x4049, tiny_f16 = 0x0001;
  EXPECT_EQ(load_element(DType::kBF16, &pi_bf16), 3.140625f);
  EXPECT_EQ(load_element(DType::kF16, &tiny_f16), 0x1p-24f);
  float f = 0;
  store_element(DType::kF32, 0.1f, &f);
  EXPECT_EQ(load_element(DType::kF32, &f), 0.1f);
}

}  // namespace
}  // namespace kiln::templates
