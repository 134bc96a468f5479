// Which configurations of each kiln GEMM template family the suite measures on a shape: a short list, by a
// heuristic over the shape (M small: swap-AB tiles whose bn covers M; few tiles for the SMs: K split over a
// cluster; large: the big persistent tiles), every entry valid for the device limits and the shape. Pure (no
// GPU): the suite's CPU test checks every shape's lists.
#pragma once

#include <string>
#include <vector>

#include "kiln/templates/template.h"
#include "suite_shapes.h"

namespace kiln::bench::suite {

struct FamilyCandidates {
  std::string family;            // the template's name
  std::string arch;              // what its kernels compile for ("sm_90a", or the device's arch)
  templates::TemplatePtr tmpl;
  std::vector<templates::Params> configs;  // complete except derived parameters; at most max_configs
};

/// Every GEMM family that `device_arch_target` (e.g. "sm_90a") can run and that no other supersedes there
/// (templates::superseded_on: no gemm_mma_sm80 on sm_90a), plus the superseded ones named in `families` (or
/// all of them for "all"), as the tuner's ChoiceContext::families.
std::vector<FamilyCandidates> candidates_for(const SuiteShape& s, const templates::DeviceLimits& limits,
                                             const Target& device_arch_target, const std::vector<std::string>& families,
                                             size_t max_configs);

/// "swap_ab", "cluster_k", "persistent" or "tile": the variant of a gemm_wgmma_sm90 configuration, for the
/// per-variant bests in the results ("" for other families).
std::string variant_of(const std::string& family, const templates::Params& p);

}  // namespace kiln::bench::suite
