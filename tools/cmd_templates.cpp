// `kiln templates list | check | render`: the template library from the command line.
//   list    every template: problem, parameters, grid size, configurations left after pruning for an arch
//   check   renders every pruned configuration of every template and NVRTC-compiles a deterministic sample
//           of N per template for ARCH, in parallel threads; a line per failure (with the log); exit 1 if any
//   render  prints one configuration's source (parameters given as name=value; the rest from a sample)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "kiln/jit.h"
#include "kiln/templates/templates.h"

namespace kiln::cli {
namespace {

using namespace kiln::templates;

Result<DeviceLimits> limits_for(const std::string& arch) {
  KILN_ASSIGN_OR_RETURN(Target t, Target::parse(arch));
  return DeviceLimits::for_target(t);
}

std::vector<TemplatePtr> selected(const std::string& name) {
  std::vector<TemplatePtr> out;
  for (const TemplatePtr& t : all_templates()) {
    if (name.empty() || t->name() == name) out.push_back(t);
  }
  return out;
}

int report_registry_errors() {
  for (const Status& s : registry_errors()) fmt::print(stderr, "kiln templates: broken template: {}\n", s.to_string());
  return registry_errors().empty() ? 0 : 1;
}

struct ListArgs {
  std::vector<std::string> archs{"sm_80", "sm_90", "sm_90a"};
  bool json = false;
};

int run_list(const ListArgs& a) {
  std::vector<DeviceLimits> limits;
  for (const auto& arch : a.archs) {
    auto l = limits_for(arch);
    if (!l.ok()) {
      fmt::print(stderr, "kiln templates list: {}\n", l.status().to_string());
      return 2;
    }
    limits.push_back(*l);
  }
  std::string head = fmt::format("{:<18} {:<14} {:>6} {:>8}", "template", "problem", "params", "grid");
  for (const auto& l : limits) head += fmt::format(" {:>8}", l.arch);
  if (!a.json) fmt::print("{}  description\n", head);
  nlohmann::json out = nlohmann::json::array();
  int broken = 0;
  for (const TemplatePtr& t : all_templates()) {
    auto grid = Grid::create(t);
    if (!grid.ok()) {
      fmt::print(stderr, "kiln templates list: {}: {}\n", t->name(), grid.status().to_string());
      ++broken;
      continue;
    }
    size_t nparams = std::count_if(t->params().begin(), t->params().end(),
                                   [](const ParamSpec& s) { return s.role != ParamRole::kDerived; });
    std::string line = fmt::format("{:<18} {:<14} {:>6} {:>8}", t->name(), t->problem(), nparams, grid->size());
    nlohmann::json pruned_by_arch = nlohmann::json::object();
    for (const auto& l : limits) {
      const size_t n = pruned_count(*grid, l);
      line += fmt::format(" {:>8}", n);
      pruned_by_arch[l.arch] = n;
    }
    if (a.json) {
      out.push_back({{"template", t->name()}, {"problem", t->problem()}, {"params", nparams}, {"grid", grid->size()},
                     {"pruned", pruned_by_arch}, {"description", t->description()}});
    } else {
      fmt::print("{}  {}\n", line, t->description());
    }
  }
  if (a.json) fmt::print("{}\n", out.dump(2));
  else fmt::print("(grid: configurations over tunable and problem parameters; per arch: those left after pruning)\n");
  return report_registry_errors() || broken ? 1 : 0;
}

struct CheckArgs {
  std::string arch = "sm_90";
  size_t sample = 4;
  std::string name;
  unsigned jobs = 0;
  bool verbose = false;
};

int run_check(const CheckArgs& a) {
  auto limits = limits_for(a.arch);
  if (!limits.ok()) {
    fmt::print(stderr, "kiln templates check: {}\n", limits.status().to_string());
    return 2;
  }
  Target target{a.arch};
  auto templates = selected(a.name);
  if (templates.empty()) {
    fmt::print(stderr, "kiln templates check: no template '{}'\n", a.name);
    return 2;
  }
  int failures = report_registry_errors();
  struct Job {
    TemplatePtr t;
    Rendered r;
  };
  std::vector<Job> jobs;
  for (const TemplatePtr& t : templates) {
    auto grid = Grid::create(t);
    if (!grid.ok()) {
      fmt::print("FAIL {}: {}\n", t->name(), grid.status().to_string());
      ++failures;
      continue;
    }
    if (t->def().min_cc > limits->cc || (t->def().needs_arch_specific && !limits->arch_specific)) {
      fmt::print("skip {}: not for {}\n", t->name(), a.arch);
      continue;
    }
    // Render every configuration that survives pruning: rendering is cheap and must never fail.
    auto all = pruned(*grid, *limits);
    size_t render_failures = 0;
    for (const Params& p : all) {
      auto r = t->render(p);
      if (!r.ok()) {
        if (render_failures++ < 5) fmt::print("FAIL render {} [{}]: {}\n", t->name(), to_string(p), r.status().to_string());
      }
    }
    failures += static_cast<int>(render_failures);
    auto picks = sample(*grid, *limits, a.sample);
    fmt::print("{}: {} configurations, {} after pruning for {}, {} rendered, compiling {}\n", t->name(), grid->size(),
               all.size(), a.arch, all.size() - render_failures, picks.size());
    for (const Params& p : picks) {
      auto r = t->render(p);
      if (r.ok()) jobs.push_back({t, std::move(*r)});
    }
  }
  unsigned n = a.jobs ? a.jobs : std::max(1u, std::thread::hardware_concurrency());
  n = std::min<unsigned>(n, std::max<size_t>(1, jobs.size()));
  std::atomic<size_t> next{0};
  std::atomic<int> compile_failures{0};
  std::mutex print_mu;
  auto start = std::chrono::steady_clock::now();
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < jobs.size();) {
      const Job& j = jobs[i];
      auto b = compile(j.r.source, target);
      std::lock_guard<std::mutex> lock(print_mu);
      if (!b.ok()) {
        ++compile_failures;
        fmt::print("FAIL compile {} ({}): {}\n{}\n", j.r.config_name, to_string(j.r.params), b.status().to_string(),
                   b.status().detail());
      } else if (a.verbose) {
        fmt::print("ok   {} {:.0f} ms, {} bytes\n", j.r.config_name, b->compile_seconds * 1e3, b->cubin.size());
      }
    }
  };
  std::vector<std::thread> threads;
  for (unsigned i = 0; i < n; ++i) threads.emplace_back(worker);
  for (auto& th : threads) th.join();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  failures += compile_failures.load();
  fmt::print("compiled {} configurations for {} in {:.1f} s on {} threads: {} failed\n", jobs.size(), a.arch, secs, n,
             compile_failures.load());
  if (failures) fmt::print("kiln templates check: {} failure(s)\n", failures);
  return failures ? 1 : 0;
}

struct RenderArgs {
  std::string name;
  std::vector<std::string> assignments;
  std::string arch = "sm_90";
};

Result<Value> parse_value(const ParamSpec& s, const std::string& text) {
  switch (s.kind) {
    case ParamKind::kInt:
      try {
        size_t used = 0;
        long long v = std::stoll(text, &used);
        if (used != text.size()) break;
        return Value::integer(v);
      } catch (...) {
      }
      break;
    case ParamKind::kBool:
      if (text == "true" || text == "1") return Value::boolean(true);
      if (text == "false" || text == "0") return Value::boolean(false);
      break;
    case ParamKind::kDType: {
      KILN_ASSIGN_OR_RETURN(DType t, parse_dtype(text));
      return Value::dtype(t);
    }
    case ParamKind::kLayout:
      if (text == "row") return Value::layout(Layout::kRowMajor);
      if (text == "col") return Value::layout(Layout::kColMajor);
      break;
    case ParamKind::kEnum: return Value::enumeration(text);
    case ParamKind::kCode:
      // A code parameter is given as an epilogue spec: ops[:out dtype], e.g. "bias+gelu:bf16".
      {
        std::string ops = text, out = "bf16";
        if (auto c = text.find(':'); c != std::string::npos) {
          ops = text.substr(0, c);
          out = text.substr(c + 1);
        }
        KILN_ASSIGN_OR_RETURN(DType dt, parse_dtype(out));
        KILN_ASSIGN_OR_RETURN(EpilogueSpec spec, parse_epilogue(ops, dt));
        return epilogue_value(spec);
      }
  }
  return make_error(ErrorCode::kInvalidArgument, fmt::format("'{}' is not a {} value for '{}'", text, kind_name(s.kind), s.name));
}

// A given value must be one the template can take: a tunable int from 1 (or its least declared value) to 65536,
// a problem int a size from 1 to 2^31 - 1, an enum one of its choices. Outside, the template's arithmetic would
// overflow or divide by zero, and the error would name some other parameter. Within, the template's constraints
// decide: a tunable's declared values are only the grid it samples, and seeds the tuner adds (a 16-stage ring)
// lie outside them, so a configuration a tune chose must render here too.
Status check_range(const ParamSpec& s, const Value& v) {
  auto bad = [&](const std::string& why) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("{}={} is out of range: {}", s.name, v.short_text(), why));
  };
  auto listed = [&] {
    std::string out;
    for (const Value& x : s.values) out += (out.empty() ? "" : ", ") + x.short_text();
    return out;
  };
  if (s.kind == ParamKind::kInt) {
    const int64_t i = v.as_int();
    if (s.role == ParamRole::kTunable && !s.values.empty()) {
      auto [lo, hi] = std::minmax_element(s.values.begin(), s.values.end(),
                                          [](const Value& x, const Value& y) { return x.as_int() < y.as_int(); });
      const int64_t least = std::min<int64_t>(1, lo->as_int()), most = std::max<int64_t>(65536, hi->as_int());
      if (i < least || i > most) {
        return bad(fmt::format("{} is from {} to {} (sampled: {})", s.name, least, most, listed()));
      }
    } else if (i < 1 || i > (int64_t{1} << 31) - 1) {
      return bad("sizes are from 1 to 2147483647");
    }
  }
  if (s.kind == ParamKind::kEnum && std::find(s.values.begin(), s.values.end(), v) == s.values.end()) {
    return bad(fmt::format("{} is one of {}", s.name, listed()));
  }
  return Status();
}

int run_render(const RenderArgs& a) {
  auto t = find_template(a.name);
  if (!t.ok()) {
    fmt::print(stderr, "kiln templates render: {}\n", t.status().to_string());
    return 2;
  }
  Params given;
  for (const std::string& as : a.assignments) {
    auto eq = as.find('=');
    std::string key = as.substr(0, eq), val = eq == std::string::npos ? "" : as.substr(eq + 1);
    const ParamSpec* s = (*t)->param(key);
    if (eq == std::string::npos || !s) {
      fmt::print(stderr, "kiln templates render: '{}' is not name=value of a parameter of {}\n", as, a.name);
      return 2;
    }
    if (s->role == ParamRole::kDerived) {
      fmt::print(stderr, "kiln templates render: '{}': {} is derived from the other parameters, not given\n", as, key);
      return 2;
    }
    auto v = parse_value(*s, val);
    Status in_range = v.ok() ? check_range(*s, *v) : v.status();
    if (!in_range.ok()) {
      fmt::print(stderr, "kiln templates render: {}\n", in_range.to_string());
      return 2;
    }
    given.insert_or_assign(key, *v);
  }
  // Parameters not given come from the first sampled configuration that agrees with those given.
  auto grid = Grid::create(*t, given);
  auto limits = limits_for(a.arch);
  if (!grid.ok() || !limits.ok()) {
    fmt::print(stderr, "kiln templates render: {}\n", (!grid.ok() ? grid.status() : limits.status()).to_string());
    return 2;
  }
  auto picks = sample(*grid, *limits, 1);
  if (picks.empty()) {
    fmt::print(stderr, "kiln templates render: no configuration of {} for {} has {} (the template's constraints rule "
               "it out)\n", a.name, a.arch, given.empty() ? std::string("any parameters") : to_string(given));
    return 2;
  }
  Params p = picks.front();
  auto r = (*t)->render(p);
  if (!r.ok()) {
    fmt::print(stderr, "kiln templates render: {}\n", r.status().to_string());
    return 1;
  }
  fmt::print("// configuration {}\n// parameters    {}\n// entry         {}\n// key ({})  {}\n{}", r->config_name,
             to_string(r->params), r->source.entry, a.arch, make_key(r->source, Target{a.arch}).hex(), r->source.source);
  return 0;
}

void add_templates_command(CLI::App& app) {
  auto& grp = group(app, "templates", "The kernel template library: list, check, render");

  auto list_args = std::make_shared<ListArgs>();
  auto* list = grp.add_subcommand("list", "List templates, their problems, grid sizes and pruned counts per arch");
  list->add_option("--arch", list_args->archs, "Archs to prune for (default sm_80 sm_90 sm_90a)")->allow_extra_args(false);
  list->add_flag("--json", list_args->json, "Print the list as JSON");
  on_run(list, list_args, run_list);

  auto check_args = std::make_shared<CheckArgs>();
  auto* check = grp.add_subcommand("check", "Render every template and NVRTC-compile a sample of configurations");
  check->add_option("--arch", check_args->arch, "Target arch (default sm_90)");
  check->add_option("--sample", check_args->sample, "Configurations compiled per template (default 4; more when covering every parameter value needs more)")
      ->check(CLI::Range(1, 100000));
  check->add_option("--template", check_args->name, "Only this template");
  check->add_option("-j,--jobs", check_args->jobs, "Compile threads (default: all cores)")->check(CLI::Range(0, 1024));
  check->add_flag("-v,--verbose", check_args->verbose, "Print every compiled configuration");
  on_run(check, check_args, run_check);

  auto render_args = std::make_shared<RenderArgs>();
  auto* render = grp.add_subcommand("render", "Print the source of one configuration");
  render->add_option("template", render_args->name, "Template name")->required();
  render->add_option("params", render_args->assignments,
                     "name=value ... (code parameters as an epilogue: 'bias+gelu:bf16'); the rest from a sample");
  render->add_option("--arch", render_args->arch, "Arch for pruning and the key (default sm_90)");
  on_run(render, render_args, run_render);
}

}  // namespace

KILN_REGISTER_COMMAND(add_templates_command);

}  // namespace kiln::cli
