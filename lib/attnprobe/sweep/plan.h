#pragma once
// The sweep planner: expands a request (estimator specs × sample counts × layers × heads ×
// batch items × lengths × trials) into estimator settings and slices, validating everything
// against the dump before any work starts, so a typo fails in milliseconds, not an hour in.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attnprobe/estimators/registry.h"
#include "attnprobe/io/dump.h"
#include "attnprobe/metrics/catalogue.h"

namespace attnprobe {

struct SweepRequest {
  std::vector<std::string> estimators;  ///< spec strings, as typed
  std::vector<int64_t> samples;         ///< values for each estimator's samples knob; empty: the spec's own
  std::string layers = "all", heads = "all", batch = "all";  ///< lists ("0,2", "0..3") or "all"
  std::vector<int64_t> lengths;  ///< prefix lengths; empty: each batch item's full valid length
  int trials = 8;                ///< per random setting; deterministic ones run once
  uint64_t seed = 0;
  std::string reference = "auto";  ///< auto | softmax | any deterministic spec
  std::string mask = "auto";       ///< auto (each layer's `causal` attribute) | full | causal
  std::vector<Metric> metrics = all_metrics();
};

/// One estimator configuration of the grid.
struct EstimatorSetting {
  Spec spec;                       ///< samples knob applied
  std::string canonical;           ///< spec.canonical()
  std::optional<int64_t> samples;  ///< knob value; none when the estimator has none
  std::string reference;           ///< canonical reference spec
  int trials = 1;
};

struct SliceRef {
  int layer = 0, head = 0, batch = 0;
  int64_t n = 0;
  Mask mask = Mask::kFull;
};

struct SweepPlan {
  std::vector<EstimatorSetting> settings;
  std::vector<SliceRef> slices;  ///< grouped so that one slice is read once for all settings
  uint64_t seed = 0;
  std::vector<Metric> metrics;

  int64_t tasks_per_slice() const;  ///< Σ over settings of their trials
  int64_t total_tasks() const { return tasks_per_slice() * static_cast<int64_t>(slices.size()); }
  /// The rows a run writes: each per-trial metric per task, each case metric once per (slice, setting
  /// with at least two trials). Double: a hostile grid overflows int64.
  double total_rows() const;
};

/// The mask of a layer's cases: `mask` is auto | full | causal (auto: the layer's `causal`
/// attribute, full when absent). UsageError for any other word.
Mask resolve_mask(const std::string& mask, const LayerInfo& layer);

/// Throws UsageError/InputError on an empty or invalid request.
SweepPlan plan_sweep(const Dump& dump, const SweepRequest& request);

/// Resolves a list option ("all" or a list) against the valid indices [0, count) of `what`.
std::vector<int> resolve_indices(const std::string& text, int64_t count, const std::string& what,
                                 const std::vector<int>& valid = {});

/// The canonical case id that keys randomness (docs/randomness.md): independent of the dump's file
/// name, of the thread and of which other cases run. Causal cases end in ";mask=causal", so every
/// full-mask case keeps the id (and the numbers) it had before masks existed.
std::string case_id(const SliceRef& slice, const std::string& canonical_spec);

/// The key of trial `trial` of a case: what the runner's estimators draw with, and what Python's
/// estimate(case=...) draws with to give the same numbers.
RandomKey case_key(uint64_t seed, const SliceRef& slice, const std::string& canonical_spec, uint32_t trial);

}  // namespace attnprobe
