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
  std::string reference = "auto";                         ///< auto | softmax | any deterministic spec
  std::string mask = "auto";                              ///< auto (each layer's attributes) | full | causal | window:W
  std::vector<QueryRows> queries = {QueryRows{}};         ///< the query rows of each case: all | last:W (an axis)
  std::vector<Precision> precisions = {Precision::kF32};  ///< what each case is computed in (an axis)
  std::vector<Metric> metrics = all_metrics();
  double eps = 0.05;     ///< ε of the metric eps_cover for samplers without their own (--eps)
  int64_t recall_k = 0;  ///< K of topk_recall@K (--recall-k); 0: kDefaultRecallK
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
  int64_t n = 0;  ///< keys (self-attention: also the queries)
  Mask mask = Mask::kFull;
  int64_t window = 0;                     ///< W of Mask::kWindow
  QueryRows queries;                      ///< the rows evaluated: all, or the last W against the n keys
  Precision precision = Precision::kF32;  ///< inputs and the estimator's stored intermediates rounded to it
};

struct SweepPlan {
  std::vector<EstimatorSetting> settings;
  std::vector<SliceRef> slices;  ///< grouped so that one slice is read once for all settings
  uint64_t seed = 0;
  std::vector<Metric> metrics;
  double eps = 0.05;                   ///< ε of eps_cover for samplers that state none (vattention states its own)
  int64_t recall_k = kDefaultRecallK;  ///< K of topk_recall@K; the metric's name carries it

  int64_t tasks_per_slice() const;  ///< Σ over settings of their trials
  int64_t total_tasks() const { return tasks_per_slice() * static_cast<int64_t>(slices.size()); }
  /// The rows a run writes: each per-trial metric per task, each case metric once per (slice, setting
  /// with at least two trials). Double: a hostile grid overflows int64.
  double total_rows() const;
};

/// The mask of a layer's cases: `mask` is auto | full | causal | window:W (auto: the layer's `causal` attribute,
/// with its `window` attribute window:W, full when absent). UsageError for any other word.
MaskSpec resolve_mask(const std::string& mask, const LayerInfo& layer);

/// Parses a comma-separated list of query rows ("all,last:16"), each once, in order; UsageError naming `what`
/// (the option) for anything else.
std::vector<QueryRows> parse_query_rows_list(const std::string& text, const std::string& what);

/// Throws UsageError/InputError on an empty or invalid request.
SweepPlan plan_sweep(const Dump& dump, const SweepRequest& request);

/// Resolves a list option ("all" or a list) against the valid indices [0, count) of `what`.
std::vector<int> resolve_indices(const std::string& text, int64_t count, const std::string& what,
                                 const std::vector<int>& valid = {});

/// The canonical case id, the identity of a case's rows (docs/randomness.md): independent of the dump's file
/// name, of the thread and of which other cases run. A case under another mask than full ends in ";mask=causal"
/// or ";mask=window:W", one of other query rows than all in ";queries=last:W", so every full-mask self-attention
/// case keeps the id (and the numbers) it had before masks and query rows existed.
std::string case_id(const SliceRef& slice, const std::string& canonical_spec);

/// The key of trial `trial` of a case: what the runner's estimators draw with, and what Python's
/// estimate(case=...) draws with to give the same numbers. Keyed by the case id without its queries and precision
/// parts, so the `last:W` case of a slice draws what its `all` case draws (its rows are the last rows of the `all`
/// estimate), and a bf16 case what its f32 case draws (the difference is rounding alone).
RandomKey case_key(uint64_t seed, const SliceRef& slice, const std::string& canonical_spec, uint32_t trial);

/// The key of the draws a kv group shares (EstimateContext::group_key): case_key's with the case id's `head=h`
/// replaced by `kv=g`, so every query head of kv head g draws the same tables.
RandomKey group_case_key(uint64_t seed, const SliceRef& slice, int kv_head, const std::string& canonical_spec,
                         uint32_t trial);

/// The ";mask=…" and ";queries=…" suffix of a case id or a plan unit's name: empty for a full-mask
/// self-attention case.
std::string geometry_suffix(Mask mask, int64_t window, QueryRows queries);
/// The ";precision=…" suffix that follows it: empty for f32, so float32 cases keep their ids and fingerprints.
std::string precision_suffix(Precision precision);

}  // namespace attnprobe
