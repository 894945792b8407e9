#pragma once
// The catalogue of metrics (docs/metrics.md): their names, groups and direction, and the parsing of
// `--metrics`. Apart from the maths (metrics.h) so that the records, which read and check metric
// names, do not see the estimators that the maths compares.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace attnprobe {

enum class Metric {
  kSpec,
  kSpecRel,
  kFro,
  kFroRel,
  kMse,
  kNmse,
  kMaxAbs,
  kAngle,
  kZeroRows,  // one value per trial
  kBiasFroRel,
  kVarFroRel,
  kBiasSpecRel,  // one value per case (trial −1)
  kGradQFroRel,  // gradient metrics, one value per trial, only when named (docs/metrics.md)
  kGradQAngle,
  kGradVFroRel,
  kGradPairs,
  kRowTv,
  kRowKl,
  kTopkRecall,    // per trial, from the implied attention weights (O(n²): asked for by name)
  kKeysAttended,  // per trial, from the keys a selection estimator reads (asked for by name or `selection`)
  kKeysScored,
  kDensity,
  kDensityScored,
  kMassRecall,
  kTailMass,
  kTailGap,
  kTailPred,
  kRowKlRev,
  kKeptOverlap,
  kTopkRecallAt10,
  kDenRel,  // sampling diagnostics: for estimators whose kept keys carry weights
  kNumRel,
  kEpsCover,
  kPilot,
};

/// The per-trial metrics, in CSV order: what `--metrics all` selects.
const std::vector<Metric>& all_metrics();
/// The case-level metrics (docs/metrics.md): computed from all T ≥ 2 trials of a case and written
/// with trial −1; selected by name or by the word `case` in `--metrics`.
const std::vector<Metric>& case_metrics();
bool is_case_metric(Metric metric);
/// The gradient metrics (per trial): they cost a backward pass, so only `--metrics` names select them.
const std::vector<Metric>& gradient_metrics();
bool is_gradient_metric(Metric metric);
/// The attention-weight metrics (docs/metrics.md): per trial, for estimators registered with
/// `weights`; O(n²), so selected only by name or by the word `weights` in `--metrics`.
const std::vector<Metric>& weight_metrics();
bool is_weight_metric(Metric metric);
/// The selection metrics (docs/metrics.md, "Selection metrics"): per trial, for estimators that state the
/// keys each row reads (capabilities.h `selection`); O(n_q·n_k·p), selected by name or by the word `selection`.
const std::vector<Metric>& selection_metrics();
bool is_selection_metric(Metric metric);
const char* metric_name(Metric metric);
/// Every metric attnprobe computes (per trial, per case, weights, selection, gradients), in that order.
const std::vector<Metric>& known_metrics();
/// The metric called `name`, or nullopt for a name attnprobe does not compute.
std::optional<Metric> find_metric(std::string_view name);
/// Every metric is ≥ 0 (or NaN/+inf), and all but `topk_recall`, `mass_recall`, `kept_overlap`,
/// `topk_recall@10` and `eps_cover` are errors or costs, larger is worse; those (fractions of the right keys, of the
/// attention found or of the rows within ε) are larger is better. `check` reads
/// its direction from here.
bool larger_is_better(Metric metric);
/// Parses "spec,angle", "all" (the per-trial metrics), "case" (the case-level ones), "weights" (the
/// attention-weight ones), "selection" (the selection ones) or a mix such as "all,case"; throws UsageError
/// listing valid names.
std::vector<Metric> parse_metrics(const std::string& text);

}  // namespace attnprobe
