// The registry of every kiln template, and the enumeration of their configurations (the autotuner's
// search space): the full grid, the grid pruned against a device's limits, and deterministic samples.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "kiln/templates/template.h"

namespace kiln::templates {

/// Every template, sorted by name. Built on first use from the embedded texts (thread-safe); a template that
/// fails validation is a bug in kiln: it is left out and its error is returned by registry_errors(), which a
/// test checks is empty.
std::span<const TemplatePtr> all_templates();
std::span<const Status> registry_errors();
/// The template `name`, or kNotFound listing the known names.
Result<TemplatePtr> find_template(std::string_view name);
/// The templates that solve `problem` ("gemm", "rmsnorm", ...), sorted by name.
std::vector<TemplatePtr> templates_for(std::string_view problem);

/// The template that supersedes `t` where kernels compile for `arch_target` (the device's best target, e.g.
/// "sm_90a"): its TemplateDef::superseded_by, when that template is registered and can compile for the target
/// (compute capability and arch-specific features). nullptr when `t` is worth trying there.
TemplatePtr superseded_on(const Template& t, const Target& arch_target);

/// The configurations of one template: the cartesian product of the `values` of its tunable and problem
/// parameters, minus those named in `fixed`, which every configuration takes as given. Index order is
/// deterministic (last-declared parameter varies fastest).
class Grid {
 public:
  /// kInvalidArgument when `fixed` names an unknown or derived parameter, or one has no values to enumerate.
  static Result<Grid> create(TemplatePtr t, Params fixed = {});
  uint64_t size() const { return size_; }
  /// The configuration at `index` < size() (not yet completed: no derived params).
  Params at(uint64_t index) const;
  const Template& tmpl() const { return *t_; }
  /// The parameters every configuration takes as given.
  const Params& fixed() const { return fixed_; }
  /// The axes enumerated, in declaration order.
  const std::vector<const ParamSpec*>& axes() const { return axes_; }

 private:
  TemplatePtr t_;
  Params fixed_;
  std::vector<const ParamSpec*> axes_;
  uint64_t size_ = 1;
};

/// Every configuration of `grid` that passes the template's constraints against `limits` (in grid order).
std::vector<Params> pruned(const Grid& grid, const DeviceLimits& limits);
/// How many pass, without keeping them.
uint64_t pruned_count(const Grid& grid, const DeviceLimits& limits);

/// A deterministic sample of the configurations of `grid` that pass `limits`: first, for every axis and each
/// of its values that some passing configuration has, one configuration having it (so every parameter value
/// is covered); then more, up to `n` in all, in a fixed pseudo-random order (seeded by `seed`). It returns
/// more than `n` only when covering every value needs more. The same inputs give the same sample everywhere
/// (memoised with the template: see generation_cache_enabled()). The walk is bounded: a template `limits`
/// cannot run (Template::supports()) gives an empty sample at once, and each phase (covering, then filling up
/// to `n`) stops after 8,192 failed checks in a row, so a value that passes in fewer than about one in 8,192 of
/// the configurations having it may go uncovered.
std::vector<Params> sample(const Grid& grid, const DeviceLimits& limits, size_t n, uint64_t seed = 0);

}  // namespace kiln::templates
