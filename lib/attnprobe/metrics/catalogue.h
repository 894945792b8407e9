#pragma once
// The catalogue of metrics (docs/metrics.md): their names, groups and direction, and the parsing of
// `--metrics`. Apart from the maths (metrics.h) so that the records, which read and check metric
// names, do not see the estimators that the maths compares.
#include <cstdint>
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
  kRepsAttended,  // completion terms a row attends beside its keys (sparq's value mean)
  kDensity,
  kDensityScored,
  kMassRecall,
  kTailMass,
  kTailGap,
  kTailPred,
  kRowKlRev,
  kKeptOverlap,
  kTopkRecallAtK,
  kDenRel,  // sampling diagnostics: for estimators whose kept keys carry weights
  kNumRel,
  kEpsCover,
  kPilot,
  kApproxErr,  // precision metrics: per trial, selected by name or by the word `precision` (docs/metrics.md)
  kRoundFloor,
  kRoundExcess,
  kFaRatio,
  kApproxErrSpec,
  kRoundFloorSpec,
  kRoundExcessSpec,
  kFaRatioSpec,
  kNonfiniteRows,
  kKeptOverlapF32,  // selection metrics of a case below float32 (docs/metrics.md, docs/precision.md)
  kScoreTies,
  kCutTies,
  kKeptOverlapA,  // |S_t ∩ O_t| / |S_t|: the share of a selection's keys its reference keeps too
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
/// The precision metrics (docs/metrics.md, "Precision metrics"): per trial, the split of a case's error into the
/// estimator's approximation and the rounding of its precision (`--precision`); selected by name or by the word
/// `precision`. They cost one more estimate (in float32) and exact attention in the case's precision.
const std::vector<Metric>& precision_metrics();
bool is_precision_metric(Metric metric);
/// The metric's name in the CSV. `topk_recall@K` carries its K: this form writes the default K (10); a sweep writes
/// the K it computed with through the overload below.
const char* metric_name(Metric metric);
/// The name with `recall_k` as topk_recall@K's K (other metrics: their name).
std::string metric_name(Metric metric, int64_t recall_k);
/// K of topk_recall@K when none is asked for (Quest's recall of the 10 heaviest keys).
inline constexpr int64_t kDefaultRecallK = 10;
/// Every metric attnprobe computes (per trial, per case, weights, selection, gradients, precision), in that order.
const std::vector<Metric>& known_metrics();
/// The metric called `name` (topk_recall@K for any K ≥ 1), or nullopt for a name attnprobe does not compute.
std::optional<Metric> find_metric(std::string_view name);
/// Every metric is ≥ 0 (or NaN/+inf), and all but `topk_recall`, `mass_recall`, `kept_overlap`,
/// `topk_recall@K` and `eps_cover` are errors or costs, larger is worse; those (fractions of the right keys, of the
/// attention found or of the rows within ε) are larger is better. `check` reads
/// its direction from here.
bool larger_is_better(Metric metric);
/// Parses "spec,angle", "all" (the per-trial metrics), "case" (the case-level ones), "weights" (the
/// attention-weight ones), "selection" (the selection ones), "precision" (the precision ones) or a mix such as
/// "all,case"; throws UsageError
/// listing valid names. `topk_recall@K` may name any K ≥ 1: with `recall_k` given, its K is stored there when
/// *recall_k is 0 (not chosen yet) and must equal it otherwise (a sweep computes one K; UsageError).
std::vector<Metric> parse_metrics(const std::string& text, int64_t* recall_k = nullptr);

}  // namespace attnprobe
