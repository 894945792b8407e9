#pragma once
// The replay driver of the evicting caches (class C, docs/estimators/selection.md, "Replayed caches"): a policy
// holds a cache C of key indices with a score per key, fed only by earlier query rows.
//   1. Prefill (rows < P, no eviction inside it): exact causal attention of the prompt rows gives the initial
//      scores, either every prompt row's column sums σ_j = Σ_{i=j}^{P−1} a_ij (H2O) or the last prompt row's
//      weights a_{P−1,j} (TOVA); C = [0, P); one eviction.
//   2. Steps t = P..N−1: A_t = C ∪ {t} is row t's attended set (its output: softmax over A_t with exact logits);
//      the step weights a^{(t)}_j = softmax_{A_t}(s·q_t·k_j), renormalised over A_t, then update the scores
//      (added, H2O; or replacing them, TOVA) and C = A_t is evicted to the capacity.
// Eviction keeps the `protect` newest keys ([t − protect + 1, t] ∩ C) and the capacity − |those| best others by
// (score descending, index ascending): a tie keeps the older key. Once the cache is full exactly one key leaves
// a step, found by one argmin scan: O(B) per step.
// Row t's set depends on query rows < t and keys ≤ t only (its own weights act after its output). One replay
// yields the sets of every evaluated row t ≥ first, so a case replays once (deterministic).
// Members: the replay steps a list of heads together, each with its own query rows and keys, and scores by an
// aggregate (mean, max or sum) of the members' weights; a single member is one head's own cache.
// Cost: prefill column sums O(P²·p) flops in row blocks of 64 (each block's logits against the keys up to it,
// O(64·P) memory; never P × P), the last row O(P·p); then O(|A_t|·p) a step and member.
#include <cstdint>
#include <vector>

#include "attnprobe/common/matrix.h"
#include "attnprobe/common/rounding.h"
#include "attnprobe/estimators/capabilities.h"
#include "attnprobe/estimators/estimator.h"
#include "attnprobe/estimators/selection/kept_keys.h"
#include "attnprobe/estimators/selection/sharing.h"
#include "attnprobe/view/head_view.h"

namespace attnprobe {

enum class ReplayAggregate { kMean, kMax, kSum };

/// One head the replay steps: its query rows by absolute position and the keys it reads (float32, as stored for
/// the estimators; scores widen them to float64).
struct ReplayMember {
  const MatrixF* prompt = nullptr;  ///< query rows at positions 0..prompt->rows() − 1 (rows × p), or null
  const MatrixF* rows = nullptr;    ///< query rows at positions first..first + rows->rows() − 1 (rows × p)
  int64_t first = 0;                ///< the position of rows' first row
  const MatrixF* keys = nullptr;    ///< N × p: key j at position j
  double scale = 0;                 ///< s

  /// Query row at position t: from `prompt` before `first`, else from `rows`.
  const float* query(int64_t t) const;
};

/// The members whose weights score a cache, each its prompt rows, its evaluated rows from the view's first position,
/// and its keys: the view's own head (share=head, or a view without its group), every head of its kv group, each
/// reading the view's keys, or every head of its layer, each reading its kv head's (sharing.h, which checks that
/// they hold the view's rows).
std::vector<ReplayMember> replay_members(const HeadView& view, Share share);

/// The replay's aggregate of the members' weights for a sharing `agg` (sum for logit: the scores are weights).
ReplayAggregate replay_aggregate(Aggregate agg);

/// The prompt P = view.first_position of a view a replay runs on, after checking that the view holds the query
/// rows of positions 0..P − 1 (InputError naming them and `method` otherwise) and is causal (UsageError).
int64_t replay_prompt(const HeadView& view, const char* method);

enum class PrefillScores {
  kColumnSums,  ///< σ_j = Σ_{i=j}^{P−1} a_ij over every prompt row (H2O)
  kLastRow,     ///< a_{P−1,j} (TOVA)
};

struct ReplayPolicy {
  PrefillScores prefill = PrefillScores::kColumnSums;
  bool accumulate = true;  ///< scores add each step's weights (H2O); else the step's weights replace them (TOVA)
  int64_t capacity = 0;    ///< |C| after an eviction (H2O: heavy + window − 1; TOVA: budget)
  int64_t protect = 0;     ///< the newest keys never evicted (H2O: window − 1; TOVA: 0)
  ReplayAggregate aggregate = ReplayAggregate::kMean;
  /// Below float32: the scores as a cache in that dtype keeps them (kReplayedScoresRounded); f32: float64 sums.
  Precision stored = Precision::kF32;
};

/// The rounding points of a replayed cache below float32 (Capabilities::rounding, docs/precision.md).
inline constexpr const char* kReplayedScoresRounded =
    "inputs and output in the precision; the scores as the reference code keeps them in the model's dtype: the logits "
    "that score the cache (float64 of the rounded inputs) and their softmax weights stored in it, the prefill's "
    "column sums of the stored weights stored once, each step's stored weights added to the stored scores and the "
    "sum stored (accumulating) or put in their place (replacing); an eviction among equal stored scores drops the "
    "newest; " ATTNPROBE_KEPT_KEYS_ATTENDED;

struct ReplaySets {
  std::vector<std::vector<int64_t>> sets;  ///< A_t (ascending) of rows t = first..keys − 1
  /// Row t's: the tie counts of the eviction that left the cache it attends (the prefill's or step t − 1's), below
  /// float32; zero counts at f32 and where nothing was evicted.
  std::vector<ScoreTies> ties;
};

/// `can` with the rounding points of a replayed cache.
constexpr Capabilities replayed_scores_rounded(Capabilities can) {
  can.rounding = kReplayedScoresRounded;
  return can;
}

/// The attended sets of rows t = first..keys − 1, from a replay with prompt P ≤ first over positions 0..keys − 1
/// (steps from P; the steps before `first` update the cache unevaluated).
ReplaySets replay_sets(const std::vector<ReplayMember>& members, const ReplayPolicy& policy, int64_t prompt,
                       int64_t first, int64_t keys);

/// The kept keys of a replay's evaluated rows (row i: its set and its ties; keys_scored 0 a row, since the step's own
/// weights score the cache and the replay is state work).
Estimator::KeptRows replayed_rows(ReplaySets replay);

/// The prefill scores of one member over keys 0..P − 1 (float64): the column sums σ_j of the causal weights of
/// rows 0..P − 1, or the last row's weights; below float32, of the weights as stored (kReplayedScoresRounded).
std::vector<double> prefill_scores(const ReplayMember& member, PrefillScores kind, int64_t prompt,
                                   Precision stored = Precision::kF32);

}  // namespace attnprobe
