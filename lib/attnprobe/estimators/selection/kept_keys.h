#pragma once
// The core of the selection family (docs/estimators/selection.md): every method that chooses which cached keys a
// query reads returns, per evaluated row, its kept keys S_t — ascending, distinct, inside the keys the row sees —
// with optional log-weights ω_j (Horvitz–Thompson or Hansen–Hurwitz corrections of sampling methods; none for a
// selection, w = 1). One routine turns that into the output, ô_t = Σ_S e^{ℓ_j + ω_j}·v_j / Σ_S e^{ℓ_j + ω_j} with
// ℓ_j = s·q_t·k_j (float32, logits shifted by their maximum; an empty S_t gives the zero row), and another into
// the implied weights Â (float64), so every method states its weights by construction. A row may add completion
// terms (KeptKeys::completions, sparq's value mean): each log-mass λ_c and value u_c joins the same softmax,
// ô_t = (Σ_S e^{ℓ_j + ω_j}·v_j + Σ_c e^{λ_c}·u_c) / (Σ_S e^{ℓ_j + ω_j} + Σ_c e^{λ_c}), shifted by one maximum over
// both; a row without them computes exactly what it did before they existed.
// Selection scores are float64 sums of the float32 inputs (what every device holds, so a device can choose the same
// keys; score_visible), each one a dot product summed in a fixed order, so a near-tie resolves the same way whichever
// rows are evaluated together (the decode rows' bits). Rankings order by
// (score descending, index ascending): a tie keeps the older key.
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "attnprobe/estimators/capabilities.h"
#include "attnprobe/estimators/estimator.h"

namespace attnprobe {

/// Rows per task of attend_kept on the pool (a thread takes a task's rows in order; RowBlocks shares work among
/// them).
inline constexpr int64_t kKeptRowsPerTask = 32;

/// out (n × pv): each row's softmax over its kept keys (logits ℓ_j + ω_j) and completion terms applied to V and
/// the completions' values, float32 like the exact kernel; rows in parallel on `pool`. Nothing kept: the zero row.
/// `stored` below float32: FlashAttention-2's points over the kept keys (ATTNPROBE_KEPT_KEYS_ATTENDED): the row sum of
/// the float32 exponentials, each exponential stored in the precision before its product with V.
void attend_kept(const HeadView& view, const Estimator::KeptRows& keep, ThreadPool* pool, MatrixF& out,
                 Precision stored = Precision::kF32);

/// The same in float64 (the tests' route to the tail identity; not a reference of any estimator).
MatrixD attend_kept_f64(const HeadView& view, const Estimator::KeptRows& keep);

/// Â rows [r0, r0 + rows) × keys, float64: e^{ℓ_j + ω_j} / D̂ on S_t, plus each completion's e^{λ_c} / D̂ spread
/// evenly over the keys it summarises (Completion::summarises; all of V_t when empty), 0 elsewhere.
Estimator::WeightRows kept_weights(const HeadView& view, Estimator::KeptRows keep);

/// An estimator whose rows attend kept keys: its estimate and its weights come from one keep_rows().
class KeptKeysEstimator : public Estimator {
 public:
  /// The kept keys of each row of `view` (with the draws of `ctx` for a random method); never empty here.
  KeptRows kept_keys(const HeadView& view, const EstimateContext& ctx) const override = 0;

  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    attend_kept(view, kept_keys(view, ctx), ctx.pool, out, ctx.precision);
  }
  WeightRows weights(const HeadView& view, const EstimateContext& ctx) const override {
    return kept_weights(view, kept_keys(view, ctx));
  }
};

/// q·k in float64 from float32 inputs, in a fixed order (four interleaved partial sums over the p channels): the
/// one dot product every selection score is made of.
double widened_dot(const float* q, const float* k, int64_t p);

/// The float64 logits s·q_i·k_j of row i over the keys it sees (view.visible(i)), index 0 = the range's first key,
/// from the float32 inputs widened: each one dot product in a fixed order (four interleaved partial sums),
/// independent of the other rows.
std::vector<double> score_visible(const HeadView& view, int64_t row);
/// The same for row `row` of other query rows at the view's positions (another head of its kv group).
std::vector<double> score_visible(const HeadView& view, const MatrixF& queries, int64_t row);

/// Keys [range.begin, range.end) in order, for the positional parts of a kept set.
void append_range(std::vector<int64_t>& keys, int64_t begin, int64_t end);

/// Sorts and drops repeats: the kept set of a method that merged several parts (sinks, a window, a selection).
void finish_kept(std::vector<int64_t>& keys);

/// The fixed part of a row at position t among the keys [seen.begin, seen.end) it sees: the first `sink` keys and
/// the last `window` keys up to t (window counts the query's own key), each clipped to what the row sees.
std::vector<int64_t> sink_and_window(KeyRange seen, int64_t position, int64_t sink, int64_t window);

/// The keys of [seen.begin, seen.end) outside `fixed` (ascending), in order: what a method ranks beyond its fixed part.
std::vector<int64_t> keys_outside(KeyRange seen, const std::vector<int64_t>& fixed);

/// An oracle's fixed part of row `row` (its sink and window keys; keys_scored = every key it sees, since an oracle
/// scores them all) and, in `rest`, the keys it ranks beyond that part (R_t), ascending.
KeptKeys oracle_fixed_part(const HeadView& view, int64_t row, int64_t sink, int64_t window, std::vector<int64_t>& rest);

/// How attend_kept attends below float32, the end of every kept-set method's rounding declaration (a macro so that
/// the declarations below stay compile-time strings).
#define ATTNPROBE_KEPT_KEYS_ATTENDED                                                                       \
  "the kept keys attended at FlashAttention-2's points: logits, exponentials and their sum float32, each " \
  "exponential stored in the precision for its product with V, that product summed float32 (a completion " \
  "term's weight and value, sparq's mean value, stored alike)"

/// The rounding points of a method that attends a kept set it chose without ranking scores (positional or sampled).
inline constexpr const char* kKeptKeysRounded = "inputs and output in the precision; " ATTNPROBE_KEPT_KEYS_ATTENDED;

/// The rounding points of a method that ranks keys by scores (Capabilities::rounding, docs/precision.md).
inline constexpr const char* kRankingScoresRounded =
    "inputs and output in the precision; the scores that rank keys stored in it (each computed in float64 from the "
    "rounded inputs, stored once through float32), so scores that round alike tie and the older key is "
    "kept; " ATTNPROBE_KEPT_KEYS_ATTENDED;

/// `can` with the rounding points of a method that ranks keys by scores.
constexpr Capabilities ranking_scores_rounded(Capabilities can) {
  can.rounding = kRankingScoresRounded;
  return can;
}

/// The capabilities of an oracle selection (topk, topp): deterministic; every mask, and its decode form; it states its
/// weights and kept keys; it ranks and attends by the model's logits, so it honours score shaping (score_visible and
/// the kept-key exponentials apply it). Settings narrow it (positional_forms, narrow_sharing).
inline constexpr Capabilities kOracleSelection = {.random = false,
                                                  .forms = kAllMasks,
                                                  .decode = kAllMasks,
                                                  .weights = kAllMasks,
                                                  .selection = true,
                                                  .shaping = true,
                                                  .rounding = kRankingScoresRounded};

/// P, where the prompt of a view ends (HeadView::prompt_end), for a method that compresses the cache once from the
/// prompt's query rows: InputError naming `method` when the view does not hold the query rows before its
/// evaluated ones (a whole slice, or a dump that stores only its decode rows).
int64_t compressed_prompt_end(const HeadView& view, const char* method);

/// The rows after a prompt compressed once (class B): row i attends the kept prompt keys it sees and every key from
/// P up to its own (decode keys are never evicted); keys_scored 0 a row (the compression is state work).
Estimator::KeptRows rows_after_prompt(const HeadView& view, std::shared_ptr<const std::vector<int64_t>> prompt,
                                      int64_t P, ScoreTies ties = {});

/// Sinks and windows are positions: a setting with either computes under the causal and window masks only (the full
/// mask has no recency), for its declaration's `narrow`.
void positional_forms(int64_t sink, int64_t window, Capabilities& can);

/// The `count` best of `candidates` (absolute indices into the row's visible range starting at `first`) by
/// (score descending, index ascending); scores[j − first] is key j's score. Every candidate when count ≥ their number.
/// A set: in no particular order (callers sort it or test membership).
/// Below float32 the scores are compared as a device stores them in `precision` (each rounded from float32:
/// store_as), so scores that round to one value tie and the older key wins; `ties` (when given) then adds the
/// ranking's ScoreTies. float32 ranks the float64 scores as they are.
std::vector<int64_t> best_by_score(std::vector<int64_t> candidates, const std::vector<double>& scores, int64_t first,
                                   int64_t count, Precision precision = Precision::kF32, ScoreTies* ties = nullptr);

/// `scores` as a device stores them in `precision` (store_as each; float32: unchanged, the float64 scores): what a
/// method that ranks by more than best_by_score (topp's masses) rounds before it ranks.
std::vector<double> stored_scores(std::vector<double> scores, Precision precision);

/// The ScoreTies of one ranking: `order` the candidates best first (absolute indices; scores[j − first] is key j's
/// stored score), of which the first `kept` are kept.
ScoreTies ranking_ties(const std::vector<int64_t>& order, const std::vector<double>& scores, int64_t first,
                       int64_t kept);

}  // namespace attnprobe
