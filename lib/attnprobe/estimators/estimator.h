#pragma once
// The one interface every estimator implements. An estimator is built from a validated spec
// (registry.h) and maps one head slice to an n × pv estimate of its target. It must be const and
// re-entrant: the runner calls one instance from several threads, and all randomness comes from
// ctx.key (docs/randomness.md), never from state.
#include <functional>
#include <limits>
#include <optional>
#include <vector>

#include "attnprobe/common/matrix.h"
#include "attnprobe/common/parallel.h"
#include "attnprobe/common/rounding.h"
#include "attnprobe/rng/random_stream.h"
#include "attnprobe/view/head_view.h"

namespace attnprobe {

struct EstimateContext {
  RandomKey key;               ///< keyed by (seed, case id, trial)
  ThreadPool* pool = nullptr;  ///< set by `bench` for estimators that parallelise inside one call
  /// Keyed like `key` with the case id's head replaced by its kv head (`kv=g`): the draws that every query head
  /// of a kv group shares (hash tables per kv head). Unset outside a sweep, where a call holds one head.
  std::optional<RandomKey> group_key;
  /// The case's precision (--precision, docs/precision.md). Below float32 the view's inputs are already rounded to
  /// it and the runner rounds the output; an estimator that declares stored intermediates (Capabilities::rounding)
  /// rounds those with round_in_place at the points it declares. Draws never depend on it.
  Precision precision = Precision::kF32;

  /// The key of the draws shared by a kv group: group_key when set, else the head's own key.
  RandomKey shared_key() const { return group_key.value_or(key); }
};

/// The backward pass of an estimator for a loss L = ⟨G, Y⟩ with upstream gradient G (n × pv), in
/// float64. What Y is and which inputs the gradient is taken with respect to is the estimator's
/// `backward` form in the registry (registry.h): "out" — Y is the output, with respect to the raw Q
/// and V (softmax, vmean, performer); "yoso" — Y = W·V unnormalised, with respect to q̂ (the
/// estimator's normalised or lifted query rows) and V (docs/estimators/yoso.md, "Backward pass").
struct Gradients {
  MatrixD q;  ///< ∂L/∂Q (n × p) or ∂L/∂Q̂ (n × p′)
  MatrixD v;  ///< ∂L/∂V (keys × pv)
  /// Fraction of the n × keys (query, key) pairs whose weight the backward evaluates: 1 for dense
  /// forms, nnz/(n·keys) for YOSO's sparse form, NaN for forms that visit no pair (tables, features).
  double pair_fraction = std::numeric_limits<double>::quiet_NaN();
};

/// The keys a query row reads, for methods that choose part of the cache (docs/estimators/selection.md): absolute
/// key indices, ascending and distinct, inside the keys the row sees, with their log-weights (empty: every
/// weight 1, a selection), optional completion terms (Completion), and how many p-dimensional vectors were dotted with
/// the query to choose them
/// (`keys_scored`: keys or metadata). A sampling method states its log-weights on every row (zeros on the keys it
/// reads exactly), so the sampling metrics know it for a sampler; `pilot` and `eps` are what a method with a pilot
/// sample and an (ε, δ) promise reports (vattention: the pilot's draws, its ε), NaN for the others.
/// A completion term of a kept set: mass standing in for keys the row does not read one by one (a value mean, a
/// cluster), with a log-mass λ_c and a value u_c (pv wide) that join the kept keys' softmax:
/// ô = (Σ_S e^{ℓ_j + ω_j}·v_j + Σ_c e^{λ_c}·u_c) / (Σ_S e^{ℓ_j + ω_j} + Σ_c e^{λ_c}). `relative`: λ_c is stated
/// over the kept keys' own mass, e^{λ_c} = e^{log_mass}·Σ_S e^{ℓ + ω}, so its share of the output is fixed whatever
/// precision the logits are computed in (sparq's (1 − α)/α; it needs a non-empty kept set). In the implied weights
/// Â its mass is spread uniformly over the keys it summarises.
struct Completion {
  double log_mass = 0;
  bool relative = false;
  RowVectorD value;
  std::vector<int64_t> summarises;  ///< ascending absolute key indices; empty: every key the row sees (V_t)
};

/// How the scores of a row's rankings could decide its kept set below float32 (score_ties, cut_ties;
/// docs/precision.md): a method that ranks keys by scores stored in the case's precision counts, per ranking that
/// drops some candidates, the candidates, those whose stored score equals another candidate's, and whether the
/// last kept score equals the first dropped one (then tie-breaking, not the scores, chose the kept set). Counted
/// below float32 only (float32 cases rank float64 scores): all zero otherwise.
struct ScoreTies {
  double rankings = 0;  ///< rankings that dropped some candidates
  double cut_ties = 0;  ///< of those, the ones whose cut fell inside a tie
  double scores = 0;    ///< candidates those rankings ordered
  double tied = 0;      ///< of those, the ones whose stored score equals another candidate's
  ScoreTies& operator+=(const ScoreTies& other) {
    rankings += other.rankings, cut_ties += other.cut_ties, scores += other.scores, tied += other.tied;
    return *this;
  }
};

struct KeptKeys {
  std::vector<int64_t> keys;
  std::vector<double> log_weights;
  double scored = 0;
  double pilot = std::numeric_limits<double>::quiet_NaN();  ///< the pilot draws behind this row's budget
  double eps = std::numeric_limits<double>::quiet_NaN();  ///< the ε of the method's own ‖ô − o‖ ≤ ε‖o‖ promise
  std::vector<Completion> completions;                    ///< none for every method but sparq
  ScoreTies ties;  ///< the row's rankings below float32 (a prompt compressed once: that one ranking, on every row)
};

class Estimator {
 public:
  virtual ~Estimator() = default;

  /// out: n × pv, computed from view.qf/kf/vf (float32).
  virtual void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const = 0;

  /// A float64 evaluation, for deterministic estimators that serve as a reference (target) of
  /// others; nullopt when the estimator has none (then it cannot be a reference).
  virtual std::optional<MatrixD> reference(const HeadView& view, ThreadPool* pool) const { return std::nullopt; }

  /// The gradients of L = ⟨G, Y⟩ (upstream: n × pv), with the same draws as estimate() under the
  /// same ctx.key; nullopt when the estimator declares no backward form. Never forms n × n beyond
  /// row blocks.
  virtual std::optional<Gradients> backward(const HeadView& view, const MatrixD& upstream,
                                            const EstimateContext& ctx) const {
    return std::nullopt;
  }

  /// The attention matrix Â this estimator implies, from the same draws as estimate() with the same
  /// ctx: a function giving rows [r0, r0 + rows) × keys in float64, so that estimate's row i is
  /// Σ_j Â_ij·v_j (docs/metrics.md, "Attention-weight metrics"; rows ℓ2-normalised by YOSO include
  /// that scale). Set up once per call (the draws), then asked block by block: never n × n at once.
  /// Empty for estimators registered without `weights`.
  using WeightRows = std::function<MatrixD(int64_t r0, int64_t rows)>;
  virtual WeightRows weights(const HeadView& view, const EstimateContext& ctx) const { return nullptr; }

  /// The keys each row reads, from the same draws as estimate() with the same ctx: row i (0-based among the
  /// view's rows) → its kept keys. Empty for estimators registered without `selection` (capabilities.h).
  using KeptRows = std::function<KeptKeys(int64_t row)>;
  virtual KeptRows kept_keys(const HeadView& view, const EstimateContext& ctx) const { return nullptr; }

  /// Useful floating-point operations of one call, for `bench` GFLOP/s; 0 when not defined.
  virtual double flops(int64_t n, int64_t p, int64_t pv) const { return 0; }

  /// Bytes of working memory one call needs at most for an n × p (queries, keys), n × pv (values)
  /// slice, besides the slice itself and `out`: the estimate that refuses a case before anything is
  /// allocated (`--max-memory`, sweep/budget.h). The default covers a few n × (p + pv) float64
  /// temporaries; an estimator whose memory grows with its parameters (features, projected rows,
  /// hash tables) overrides it. A double, so that hostile sizes cannot overflow it.
  virtual double memory_bytes(int64_t n, int64_t p, int64_t pv) const {
    return 4.0 * 8.0 * static_cast<double>(n) * static_cast<double>(p + pv);
  }

  /// The same for backward() (asked when a plan has gradient metrics), its gradients included; the
  /// default is memory_bytes() plus the two float64 gradients.
  virtual double backward_memory_bytes(int64_t n, int64_t p, int64_t pv) const {
    return memory_bytes(n, p, pv) + 8.0 * static_cast<double>(n) * static_cast<double>(p + pv);
  }
};

}  // namespace attnprobe
