// kiln's cache in one include: the store, problem keys, records, tune modes, bundles and preloading.
#pragma once

#include "kiln/cache/bundle.h"
#include "kiln/cache/integrity.h"
#include "kiln/cache/preload.h"
#include "kiln/cache/problem_key.h"
#include "kiln/cache/records.h"
#include "kiln/cache/signing.h"
#include "kiln/cache/store.h"
#include "kiln/cache/tuning.h"
