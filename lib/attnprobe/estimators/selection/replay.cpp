#include "attnprobe/estimators/selection/replay.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>

#include "attnprobe/common/error.h"
#include "attnprobe/estimators/selection/kept_keys.h"

namespace attnprobe {

const float* ReplayMember::query(int64_t t) const {
  return t < first ? prompt->row(t).data() : rows->row(t - first).data();
}

std::vector<ReplayMember> replay_members(const HeadView& view, Share share) {
  const ScoringHeads heads = scoring_heads(view, share);
  std::vector<ReplayMember> members;
  for (int h = 0; h < heads.size(); ++h)
    members.push_back({heads.prompt[h], heads.rows[h], view.first_position, heads.keys[h], view.scale});
  return members;
}

ReplayAggregate replay_aggregate(Aggregate agg) {
  return agg == Aggregate::kMean  ? ReplayAggregate::kMean
         : agg == Aggregate::kMax ? ReplayAggregate::kMax
                                  : ReplayAggregate::kSum;
}

int64_t replay_prompt(const HeadView& view, const char* method) {
  require_usage(view.mask == Mask::kCausal,
                "{} replays a cache over decode steps, which needs the causal mask: use --mask causal.", method);
  const int64_t P = view.prompt_end();  // the first evaluated row, or earlier with --prefill
  // Bottom-right rows of a self-attention slice: the rows before them are the prompt the cache is built from.
  require_input(view.positions.empty() && view.prompt_qf.rows() == view.first_position &&
                    view.first_position + view.n() == view.keys(),
                "{} builds its cache from every query row before the evaluated ones (positions 0..{}), which this "
                "slice does not hold: measure the last rows of a self-attention slice with --queries last:W.",
                method, view.first_position - 1);
  return P;
}

namespace {

constexpr int64_t kPrefillBlock = 64;  ///< prompt rows whose logits are held at once (64 × P doubles)

// x stored in a precision below float32 (through float32), as a float64 again.
double stored_value(double x, Precision stored) { return static_cast<double>(store_as(x, stored)); }

// σ_j = Σ_{i=j}^{P−1} a_ij. Per block of rows: their logits against keys 0..(block end − 1) (one float64 product
// of the widened float32 inputs), then per row its log-sum-exp over keys ≤ i and its weights added to the column
// sums, rows in ascending order (a fixed order: the same bits on any pool). Below float32 the logits and the weights
// are stored in the precision before they are used (stored_value), and the sums made of the stored weights.
std::vector<double> column_sums(const ReplayMember& member, int64_t P, Precision stored) {
  const int64_t p = member.keys->cols();
  const MatrixD keys = member.keys->topRows(P).cast<double>();
  Eigen::ArrayXd sums = Eigen::ArrayXd::Zero(P);
  MatrixD queries(kPrefillBlock, p);
  for (int64_t b0 = 0; b0 < P; b0 += kPrefillBlock) {
    const int64_t b1 = std::min(P, b0 + kPrefillBlock), rows = b1 - b0;
    for (int64_t r = 0; r < rows; ++r)
      queries.row(r) = Eigen::Map<const RowVectorF>(member.query(b0 + r), p).cast<double>();
    MatrixD logits = member.scale * (queries.topRows(rows) * keys.topRows(b1).transpose());
    store_below_float32(logits, stored);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t seen = b0 + r + 1;  // row i = b0 + r sees keys 0..i
      const auto row = logits.row(r).head(seen).array();
      const Eigen::ArrayXd e = (row - row.maxCoeff()).exp().transpose();
      if (!below_float32(stored)) {
        sums.head(seen) += e / e.sum();
        continue;
      }
      const double total = e.sum();
      for (int64_t j = 0; j < seen; ++j) sums(j) += stored_value(e(j) / total, stored);
    }
  }
  return std::vector<double>(sums.data(), sums.data() + P);
}

// Softmax over `keys` of row t's logits s·q_t·k_j (float64 from the float32 inputs, widened_dot), into `weights`;
// below float32 the logits and the weights stored in the precision, as an eager attention in the model's dtype
// materialises them (softmax in float32 of the stored logits, cast back: H2O's and TOVA's reference code).
void step_weights(const ReplayMember& member, int64_t t, const std::vector<int64_t>& keys, Precision stored,
                  std::vector<double>& weights) {
  const int64_t p = member.keys->cols();
  const float* q = member.query(t);
  const bool rounding = below_float32(stored);
  weights.resize(keys.size());
  double top = -INFINITY;
  for (size_t r = 0; r < keys.size(); ++r) {
    double logit = member.scale * widened_dot(q, member.keys->row(keys[r]).data(), p);
    if (rounding) logit = stored_value(logit, stored);
    top = std::max(top, weights[r] = logit);
  }
  double total = 0;
  for (double& w : weights) total += w = std::exp(w - top);
  for (double& w : weights) w = rounding ? stored_value(w / total, stored) : w / total;
}

// into = aggregate(into, x) elementwise; `count` members so far (mean: the sum, divided at the end).
void aggregate_into(std::vector<double>& into, const std::vector<double>& x, ReplayAggregate how, bool first) {
  if (first) {
    into = x;
    return;
  }
  for (size_t r = 0; r < x.size(); ++r)
    into[r] = how == ReplayAggregate::kMax ? std::max(into[r], x[r]) : into[r] + x[r];
}

void finish_aggregate(std::vector<double>& values, ReplayAggregate how, size_t members) {
  if (how != ReplayAggregate::kMean || members == 1) return;
  for (double& v : values) v /= static_cast<double>(members);
}

// The cache: keys ascending, score[r] the score of keys[r].
struct Cache {
  std::vector<int64_t> keys;
  std::vector<double> scores;

  // Keeps the `protect` newest positions up to t and the best others up to `capacity` keys in all. With `ties`, the
  // ranking's tie counts are added to it (ranking_ties: the candidates ordered in full, for the rounded scores).
  void evict(int64_t t, int64_t capacity, int64_t protect, ScoreTies* ties) {
    const int64_t size = static_cast<int64_t>(keys.size());
    if (size <= capacity) return;
    // Keys ≥ t − protect + 1 are the last ones of the ascending list.
    const int64_t candidates = std::lower_bound(keys.begin(), keys.end(), t - protect + 1) - keys.begin();
    const int64_t keep = std::max<int64_t>(0, capacity - (size - candidates));
    const int64_t drop = candidates - keep;
    if (drop <= 0) return;
    if (ties) {
      std::vector<int64_t> order(candidates);
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(),
                [&](int64_t a, int64_t b) { return scores[a] > scores[b] || (scores[a] == scores[b] && a < b); });
      *ties += ranking_ties(order, std::vector<double>(scores.begin(), scores.begin() + candidates), 0, keep);
    }
    if (drop == 1) {
      // The last of the ranking (score descending, index ascending): the lowest score, the newest among equals.
      int64_t worst = 0;
      for (int64_t r = 1; r < candidates; ++r)
        if (scores[r] <= scores[worst]) worst = r;
      keys.erase(keys.begin() + worst);
      scores.erase(scores.begin() + worst);
      return;
    }
    std::vector<int64_t> order(candidates);
    std::iota(order.begin(), order.end(), 0);
    std::nth_element(order.begin(), order.begin() + keep, order.end(),
                     [&](int64_t a, int64_t b) { return scores[a] > scores[b] || (scores[a] == scores[b] && a < b); });
    std::vector<char> kept(size, 1);
    for (int64_t r = keep; r < candidates; ++r) kept[order[r]] = 0;
    int64_t out = 0;
    for (int64_t r = 0; r < size; ++r)
      if (kept[r]) keys[out] = keys[r], scores[out] = scores[r], ++out;
    keys.resize(out);
    scores.resize(out);
  }
};

}  // namespace

std::vector<double> prefill_scores(const ReplayMember& member, PrefillScores kind, int64_t prompt, Precision stored) {
  if (prompt <= 0) return {};
  if (kind == PrefillScores::kColumnSums) return column_sums(member, prompt, stored);
  std::vector<int64_t> all(prompt);
  std::iota(all.begin(), all.end(), 0);
  std::vector<double> weights;
  step_weights(member, prompt - 1, all, stored, weights);
  return weights;
}

ReplaySets replay_sets(const std::vector<ReplayMember>& members, const ReplayPolicy& policy, int64_t prompt,
                       int64_t first, int64_t keys) {
  require_usage(!members.empty() && prompt >= 0 && prompt <= first && first <= keys,
                "a replay needs members and a prompt before the evaluated rows ({} ≤ {} ≤ {})", prompt, first, keys);
  const bool rounding = below_float32(policy.stored);
  // Below float32 every score is stored (float64 → float32 → the precision), as a cache in the model's dtype keeps it.
  const auto store = [&](double x) { return rounding ? stored_value(x, policy.stored) : x; };
  Cache cache;
  std::vector<double> weights, aggregate;
  ScoreTies last_eviction;  // the ties of the eviction that left the cache a row attends (rounded scores only)
  ScoreTies* const counted = rounding ? &last_eviction : nullptr;
  // 1. Prefill: C = [0, P) with the members' aggregated scores, then one eviction.
  if (prompt > 0) {
    for (size_t m = 0; m < members.size(); ++m) {
      weights = prefill_scores(members[m], policy.prefill, prompt, policy.stored);
      aggregate_into(aggregate, weights, policy.aggregate, m == 0);
    }
    finish_aggregate(aggregate, policy.aggregate, members.size());
    cache.keys.resize(prompt);
    std::iota(cache.keys.begin(), cache.keys.end(), 0);
    cache.scores = aggregate;
    for (double& score : cache.scores) score = store(score);
    cache.evict(prompt - 1, policy.capacity, policy.protect, counted);
  }
  // 2. Steps: A_t = C ∪ {t} is row t's set; its weights then update the scores and C = A_t is evicted.
  ReplaySets out;
  out.sets.reserve(keys - first);
  for (int64_t t = prompt; t < keys; ++t) {
    cache.keys.push_back(t);
    cache.scores.push_back(0.0);  // a new key's score starts at its own weight (added below)
    if (t >= first) {
      out.sets.push_back(cache.keys);
      out.ties.push_back(last_eviction);
    }
    for (size_t m = 0; m < members.size(); ++m) {
      step_weights(members[m], t, cache.keys, policy.stored, weights);
      aggregate_into(aggregate, weights, policy.aggregate, m == 0);
    }
    finish_aggregate(aggregate, policy.aggregate, members.size());
    if (policy.accumulate)
      for (size_t r = 0; r < aggregate.size(); ++r) cache.scores[r] = store(cache.scores[r] + store(aggregate[r]));
    else
      for (size_t r = 0; r < aggregate.size(); ++r) cache.scores[r] = store(aggregate[r]);
    last_eviction = ScoreTies{};
    cache.evict(t, policy.capacity, policy.protect, counted);
  }
  return out;
}

Estimator::KeptRows replayed_rows(ReplaySets replay) {
  auto shared = std::make_shared<const ReplaySets>(std::move(replay));
  return [shared](int64_t i) {
    KeptKeys kept{shared->sets[i], {}, 0.0};
    kept.ties = shared->ties[i];
    return kept;
  };
}

}  // namespace attnprobe
