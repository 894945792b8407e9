#pragma once
// What performer and performer-raw share (performer-raw is the same map without its shifts): the keys (M, ortho),
// declared once, and the float32 feature map of a view under a key. Apart from performer.h, which the CUDA
// version includes without the registry.
#include "attnprobe/estimators/estimator.h"
#include "attnprobe/estimators/param_set.h"
#include "attnprobe/estimators/random_features/feature_attention.h"
#include "attnprobe/estimators/random_features/performer/performer.h"

namespace attnprobe {

const ParamSet<PerformerParams>& performer_param_set();

/// Performer's map for positive_feature_attention: w^Q = w^K = √s·ω (ω drawn from ctx.key, M × p), h = s/2.
PositiveFeatureMapF performer_feature_map(const HeadView& view, const EstimateContext& ctx,
                                          const PerformerParams& params);

}  // namespace attnprobe
