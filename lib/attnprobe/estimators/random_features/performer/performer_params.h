#pragma once
// performer's keys (M, ortho), declared once and shared with performer-raw, which has the same map without its
// shifts. Apart from performer.h, which the CUDA version includes without the registry.
#include "attnprobe/estimators/param_set.h"
#include "attnprobe/estimators/random_features/performer/performer.h"

namespace attnprobe {

const ParamSet<PerformerParams>& performer_param_set();

}  // namespace attnprobe
