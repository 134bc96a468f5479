#include "kiln/runtime/ops.h"

#include <set>

#include <fmt/format.h>

namespace kiln::runtime {

Status OpRegistry::add(OpDef def) {
  if (def.name.empty() || !def.choices || !def.reference || !def.buffers || !def.tolerance) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("op '{}' needs a name, choices, reference, buffers and tolerance", def.name));
  }
  std::lock_guard lock(mu_);
  std::string name = def.name;
  ops_[name] = std::make_shared<const OpDef>(std::move(def));
  return Status();
}

Status OpRegistry::add_choices(const std::string& op,
                               std::function<Result<std::vector<ChoicePtr>>(const Problem&, const ChoiceContext&)> extra) {
  std::lock_guard lock(mu_);
  if (!ops_.count(op)) return make_error(ErrorCode::kNotFound, fmt::format("no op '{}' to add choices to", op));
  extra_[op].push_back(std::move(extra));
  return Status();
}

Result<std::shared_ptr<const OpDef>> OpRegistry::find(const std::string& op) const {
  std::lock_guard lock(mu_);
  auto it = ops_.find(op);
  if (it != ops_.end()) return it->second;
  std::string known;
  for (const auto& [name, _] : ops_) known += (known.empty() ? "" : ", ") + name;
  return make_error(ErrorCode::kNotFound, fmt::format("no op '{}' (known: {})", op, known));
}

Result<std::vector<ChoicePtr>> OpRegistry::choices(const Problem& problem, const ChoiceContext& ctx) const {
  KILN_RETURN_IF_ERROR(problem.validate());
  KILN_ASSIGN_OR_RETURN(auto def, find(problem.op));
  std::vector<std::function<Result<std::vector<ChoicePtr>>(const Problem&, const ChoiceContext&)>> extra;
  {
    std::lock_guard lock(mu_);
    if (auto it = extra_.find(problem.op); it != extra_.end()) extra = it->second;
  }
  KILN_ASSIGN_OR_RETURN(std::vector<ChoicePtr> out, def->choices(problem, ctx));
  for (const auto& gen : extra) {
    KILN_ASSIGN_OR_RETURN(std::vector<ChoicePtr> more, gen(problem, ctx));
    for (auto& c : more) out.push_back(std::move(c));
  }
  std::set<std::string> names;
  for (const auto& c : out) {
    if (!names.insert(c->name()).second) {
      return make_error(ErrorCode::kInvalidArgument, fmt::format("two choices of {} are named '{}'", problem.describe(), c->name()));
    }
  }
  return out;
}

std::vector<std::string> OpRegistry::ops() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  for (const auto& [name, _] : ops_) out.push_back(name);
  return out;
}

Result<ChoiceContext> choice_context(int ordinal) {
  KILN_ASSIGN_OR_RETURN(DeviceInfo info, device_info(ordinal));
  ChoiceContext ctx;
  ctx.device = info;
  ctx.has_device = true;
  ctx.target = Target{info.arch()};
  // wgmma and setmaxnreg need the arch-specific target; Hopper is the one kiln has templates for.
  ctx.arch_target = info.cc_major == 9 && info.cc_minor == 0 ? Target{"sm_90a"} : ctx.target;
  ctx.limits = templates::DeviceLimits::from_device(info, ctx.target);
  ctx.arch_limits = templates::DeviceLimits::from_device(info, ctx.arch_target);
  return ctx;
}

Result<ChoiceContext> choice_context_for_arch(const Target& arch) {
  ChoiceContext ctx;
  KILN_ASSIGN_OR_RETURN(ctx.target, Target::parse(arch.arch));
  if (ctx.target.arch_specific()) {
    ctx.arch_target = ctx.target;
    ctx.target = Target{ctx.target.arch.substr(0, ctx.target.arch.size() - 1)};
  } else {
    ctx.arch_target = ctx.target.compute_capability() == 90 ? Target{"sm_90a"} : ctx.target;
  }
  KILN_ASSIGN_OR_RETURN(ctx.limits, templates::DeviceLimits::for_target(ctx.target));
  KILN_ASSIGN_OR_RETURN(ctx.arch_limits, templates::DeviceLimits::for_target(ctx.arch_target));
  return ctx;
}

}  // namespace kiln::runtime
