// The rule that turns measured choices into one winner, kept apart from the GPU so it can be tested alone.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "kiln/runtime/tuner.h"

namespace kiln::runtime::detail {

/// The noise window around the best median: choices within it are not told apart by their timings.
/// max(tie_fraction x best median, the best's p90 - median).
double tie_window(const ChoiceResult& best, double tie_fraction);

/// The winner among `results` (any order): the fastest successful, complete measurement; among the choices
/// within tie_window() of it, the lowest `rank`, then the lowest name. -1 when none succeeded.
int pick_winner(const std::vector<ChoiceResult>& results, const std::function<int(const std::string&)>& rank,
                double tie_fraction);

}  // namespace kiln::runtime::detail
