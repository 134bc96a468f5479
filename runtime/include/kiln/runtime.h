// kiln's autotuner and collectives in one include.
#pragma once

#include "kiln/runtime/builtin.h"
#include "kiln/runtime/choice.h"
#include "kiln/runtime/collective.h"
#include "kiln/runtime/comm.h"
#include "kiln/runtime/ops.h"
#include "kiln/runtime/plan_ahead.h"
#include "kiln/runtime/problem.h"
#include "kiln/runtime/tuner.h"
