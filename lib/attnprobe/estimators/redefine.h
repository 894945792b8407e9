#pragma once
// Redefining an estimator, for Python's custom estimators only (python/src/custom_estimators.h): a later sweep may
// declare `py:NAME` with other keys, values or flags. Kept out of registry.h, which every estimator includes,
// because built-in estimators are registered once and never redefined.
#include "attnprobe/estimators/registry.h"

namespace attnprobe {

/// Adds `def`, or replaces the definition registered under its name when that one has the same family. The replaced
/// definition stays alive, so specs parsed from it earlier stay valid. Returns true.
bool redefine_estimator(EstimatorDef def);

}  // namespace attnprobe
