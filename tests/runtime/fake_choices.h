// Choices that are only a name, a kind and parameters: what the performance model and the planner look at
// (CPU-only tests of ranking, plans and pruning).
#pragma once

#include <map>
#include <string>

#include "kiln/runtime/choice.h"

namespace kiln::runtime::testing {

using Params = std::map<std::string, std::string>;

class FakeChoice final : public Choice {
 public:
  FakeChoice(std::string name, ChoiceKind kind, Params p) : name_(std::move(name)), kind_(kind), params_(std::move(p)) {}
  const std::string& name() const override { return name_; }
  ChoiceKind kind() const override { return kind_; }
  Status prepare(const Binaries&) override { return Status(); }
  Status run(const OpArgs&, CUdeviceptr, CUstream) const override { return Status(); }
  std::map<std::string, std::string> parameters() const override { return params_; }

 private:
  std::string name_;
  ChoiceKind kind_;
  Params params_;
};

/// gemm_wgmma_sm90's parameters as a tuner report spells them.
inline Params wgmma(int bm, int bn, int consumers = 2, int stages = 4, int cluster_k = 1, bool swap_ab = false,
                    bool persistent = false, int blocks_per_sm = 1, int group_m = 8) {
  return {{"template", "gemm_wgmma_sm90"}, {"bm", std::to_string(bm)}, {"bn", std::to_string(bn)},
          {"consumers", std::to_string(consumers)}, {"stages", std::to_string(stages)},
          {"cluster_k", std::to_string(cluster_k)}, {"swap_ab", swap_ab ? "true" : "false"},
          {"persistent", persistent ? "true" : "false"}, {"blocks_per_sm", std::to_string(blocks_per_sm)},
          {"group_m", std::to_string(group_m)}};
}

}  // namespace kiln::runtime::testing
