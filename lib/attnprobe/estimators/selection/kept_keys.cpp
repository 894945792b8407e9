#include "attnprobe/estimators/selection/kept_keys.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <type_traits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "attnprobe/common/error.h"

namespace attnprobe {
namespace {

// The stable softmax of a kept set and its completion terms (§ the header), in T: the kept keys' weights
// e^{β − top} with β = ℓ + ω and top = max β, then each completion's e^{λ_c − top} (a relative one's
// e^{log_mass}·Σ_S e^{β − top}); when a completion outweighs every key, all are shifted by its excess so the largest
// term is 1. Without completions this is the kept keys' softmax exactly as before they existed.
template <class T>
struct RowTerms {
  std::vector<T> keys;         ///< per kept key
  std::vector<T> completions;  ///< per completion term
  T total = 0;                 ///< the sum of both
};

// Row `row` (at `position`) of `view`; its logits are the model's (ScoreShaping) when the view has shaping.
template <class T, class Q, class K>
RowTerms<T> kept_exponentials(const Q& q_row, const K& k, T scale, const KeptKeys& kept, const HeadView& view,
                              int64_t row) {
  const ScoreShaping* shaping = view.shaping.any() ? &view.shaping : nullptr;
  const int64_t position = shaping != nullptr ? view.position(row) : 0;
  const size_t count = kept.keys.size();
  RowTerms<T> terms;
  std::vector<T>& beta = terms.keys;
  beta.resize(count);
  T top = -INFINITY;
  for (size_t r = 0; r < count; ++r) {
    beta[r] = scale * q_row.dot(k.row(kept.keys[r]));
    if (shaping != nullptr) beta[r] = shaping->logit(beta[r], row, position, kept.keys[r]);
    if (!kept.log_weights.empty()) beta[r] += static_cast<T>(kept.log_weights[r]);
    top = std::max(top, beta[r]);
  }
  T& total = terms.total;
  total = 0;
  for (T& b : beta) total += b = std::exp(b - top);
  if (kept.completions.empty()) return terms;
  // Completion log-masses relative to top (to 0 when no key is kept: the completions alone), in float64.
  const double kept_total = static_cast<double>(total);
  std::vector<double> relative;
  double shift = count > 0 ? 0.0 : -INFINITY;
  for (const Completion& c : kept.completions) {
    if (c.relative && count == 0) throw std::logic_error("a relative completion term needs kept keys");
    relative.push_back(c.relative ? std::log(kept_total) + c.log_mass
                                  : c.log_mass - (count > 0 ? static_cast<double>(top) : 0.0));
    shift = std::max(shift, relative.back());
  }
  if (shift > 0 && count > 0) {
    const T factor = static_cast<T>(std::exp(-shift));
    total = 0;
    for (T& b : beta) total += b *= factor;
  } else if (count > 0) {
    shift = 0;
  }
  for (double r : relative) total += terms.completions.emplace_back(static_cast<T>(std::exp(r - shift)));
  return terms;
}

template <class T, class M, class Out>
void attend_rows(const HeadView& view, const M& q, const M& k, const M& v, const Estimator::KeptRows& keep,
                 ThreadPool* pool, Out& out, Precision stored = Precision::kF32) {
  const int64_t n = view.n();
  out.setZero(n, v.cols());
  for_each_index(pool, (n + kKeptRowsPerTask - 1) / kKeptRowsPerTask, [&](int64_t block) {
    for (int64_t i = block * kKeptRowsPerTask; i < std::min(n, (block + 1) * kKeptRowsPerTask); ++i) {
      const KeptKeys kept = keep(i);
      if (kept.keys.empty() && kept.completions.empty()) continue;  // the zero row
      RowTerms<T> w = kept_exponentials<T>(q.row(i), k, static_cast<T>(view.scale), kept, view, i);
      if constexpr (std::is_same_v<T, float>)  // P stored for P·V; the row sum is of the float32 terms
        if (below_float32(stored)) {
          round_in_place(w.keys.data(), static_cast<int64_t>(w.keys.size()), stored);
          round_in_place(w.completions.data(), static_cast<int64_t>(w.completions.size()), stored);
        }
      auto row = out.row(i);
      for (size_t r = 0; r < w.keys.size(); ++r) row += w.keys[r] * v.row(kept.keys[r]);
      for (size_t c = 0; c < w.completions.size(); ++c) {
        // A completion's value (sparq's v̄) is a tensor the kernel reads like V: stored in the precision too.
        Eigen::Matrix<T, 1, Eigen::Dynamic> value = kept.completions[c].value.template cast<T>();
        if constexpr (std::is_same_v<T, float>) round_in_place(value.data(), value.size(), stored);
        row += w.completions[c] * value;
      }
      row /= w.total;
    }
  });
}

}  // namespace

void attend_kept(const HeadView& view, const Estimator::KeptRows& keep, ThreadPool* pool, MatrixF& out,
                 Precision stored) {
  attend_rows<float>(view, view.qf, view.kf, view.vf, keep, pool, out, stored);
}

MatrixD attend_kept_f64(const HeadView& view, const Estimator::KeptRows& keep) {
  MatrixD out;
  attend_rows<double>(view, view.q, view.k, view.v, keep, nullptr, out);
  return out;
}

Estimator::WeightRows kept_weights(const HeadView& view, Estimator::KeptRows keep) {
  return [&view, keep = std::move(keep)](int64_t r0, int64_t rows) {
    MatrixD w = MatrixD::Zero(rows, view.keys());
    for (int64_t i = 0; i < rows; ++i) {
      const KeptKeys kept = keep(r0 + i);
      if (kept.keys.empty() && kept.completions.empty()) continue;
      const RowTerms<double> e = kept_exponentials<double>(view.q.row(r0 + i), view.k, view.scale, kept, view, r0 + i);
      for (size_t r = 0; r < e.keys.size(); ++r) w(i, kept.keys[r]) = e.keys[r] / e.total;
      // A completion's weight, spread evenly over the keys it stands for, so that Â·V gives its e^{λ}·u_c when u_c
      // is their mean value (sparq's v̄ over V_t).
      for (size_t c = 0; c < e.completions.size(); ++c) {
        const std::vector<int64_t>& over = kept.completions[c].summarises;
        const KeyRange seen = view.visible(r0 + i);
        const double count = over.empty() ? static_cast<double>(seen.size()) : static_cast<double>(over.size());
        const double share = e.completions[c] / e.total / count;
        if (over.empty()) {
          for (int64_t j = seen.begin; j < seen.end; ++j) w(i, j) += share;
        } else {
          for (int64_t j : over) w(i, j) += share;
        }
      }
    }
    return w;
  };
}

double widened_dot(const float* q, const float* k, int64_t p) {
  double part[4] = {0, 0, 0, 0};
  int64_t c = 0;
  for (; c + 4 <= p; c += 4)
    for (int l = 0; l < 4; ++l) part[l] += static_cast<double>(q[c + l]) * static_cast<double>(k[c + l]);
  for (; c < p; ++c) part[0] += static_cast<double>(q[c]) * static_cast<double>(k[c]);
  return (part[0] + part[1]) + (part[2] + part[3]);
}

std::vector<double> score_visible(const HeadView& view, int64_t row) { return score_visible(view, view.qf, row); }

std::vector<double> score_visible(const HeadView& view, const MatrixF& queries, int64_t row) {
  const KeyRange seen = view.visible(row);
  const float* q = queries.row(row).data();
  std::vector<double> scores(seen.size());
  for (int64_t j = seen.begin; j < seen.end; ++j)
    scores[j - seen.begin] = view.scale * widened_dot(q, view.kf.row(j).data(), view.p());
  if (view.shaping.any()) {
    // The view's shaping is its own head's: another head's rows (share=group) would need theirs, which is why a
    // group-shared setting declares no shaping (narrow_sharing) and never gets here.
    if (&queries != &view.qf) throw std::logic_error("score shaping applies to the view's own query rows only");
    const int64_t position = view.position(row);
    for (int64_t j = seen.begin; j < seen.end; ++j)
      scores[j - seen.begin] = view.shaping.logit(scores[j - seen.begin], row, position, j);
  }
  return scores;
}

void append_range(std::vector<int64_t>& keys, int64_t begin, int64_t end) {
  for (int64_t j = begin; j < end; ++j) keys.push_back(j);
}

void finish_kept(std::vector<int64_t>& keys) {
  // Most methods append their parts in key order already: checking that is linear, while sorting a few thousand
  // kept keys per row was a tenth of a quest or moba decode step.
  if (std::adjacent_find(keys.begin(), keys.end(), std::greater_equal<>()) == keys.end()) return;
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
}

std::vector<int64_t> sink_and_window(KeyRange seen, int64_t position, int64_t sink, int64_t window) {
  std::vector<int64_t> keys;
  append_range(keys, seen.begin, std::min(seen.end, sink));
  append_range(keys, std::max(seen.begin, position - window + 1), std::min(seen.end, position + 1));
  finish_kept(keys);
  return keys;
}

std::vector<int64_t> keys_outside(KeyRange seen, const std::vector<int64_t>& fixed) {
  std::vector<int64_t> rest;
  rest.reserve(static_cast<size_t>(std::max<int64_t>(0, seen.size() - static_cast<int64_t>(fixed.size()))));
  size_t f = 0;
  for (int64_t j = seen.begin; j < seen.end; ++j) {
    if (f < fixed.size() && fixed[f] == j) {
      ++f;
      continue;
    }
    rest.push_back(j);
  }
  return rest;
}

KeptKeys oracle_fixed_part(const HeadView& view, int64_t row, int64_t sink, int64_t window,
                           std::vector<int64_t>& rest) {
  const KeyRange seen = view.visible(row);
  KeptKeys kept{sink_and_window(seen, view.position(row), sink, window), {}, static_cast<double>(seen.size())};
  rest = keys_outside(seen, kept.keys);
  return kept;
}

int64_t compressed_prompt_end(const HeadView& view, const char* method) {
  const int64_t P = view.prompt_end();
  require_input(view.positions.empty() && view.prompt_qf.rows() == view.first_position && P > 0,
                "{} needs the query rows of the prompt before the evaluated rows (positions 0..{}), which this slice "
                "does not hold: measure the last rows of a self-attention slice with --queries last:W.",
                method, view.first_position - 1);
  return P;
}

Estimator::KeptRows rows_after_prompt(const HeadView& view, std::shared_ptr<const std::vector<int64_t>> prompt,
                                      int64_t P, ScoreTies ties) {
  return [&view, prompt = std::move(prompt), P, ties](int64_t i) {
    const KeyRange seen = view.visible(i);
    KeptKeys kept{{}, {}, 0.0};
    kept.ties = ties;
    kept.keys.reserve(prompt->size() + static_cast<size_t>(std::max<int64_t>(0, seen.end - P)));
    for (int64_t j : *prompt)
      if (j >= seen.begin && j < seen.end) kept.keys.push_back(j);
    append_range(kept.keys, std::max(P, seen.begin), seen.end);
    return kept;
  };
}

void positional_forms(int64_t sink, int64_t window, Capabilities& can) {
  if (sink == 0 && window == 0) return;
  can.forms = {Mask::kCausal, Mask::kWindow};
  can.decode = can.weights = can.forms;
}

std::vector<double> stored_scores(std::vector<double> scores, Precision precision) {
  if (below_float32(precision))
    for (double& score : scores) score = store_as(score, precision);
  return scores;
}

ScoreTies ranking_ties(const std::vector<int64_t>& order, const std::vector<double>& scores, int64_t first,
                       int64_t kept) {
  const int64_t ranked = static_cast<int64_t>(order.size());
  ScoreTies ties;
  if (kept <= 0 || kept >= ranked) return ties;  // nothing dropped or nothing kept: the scores decided nothing
  const auto score = [&](int64_t r) { return scores[order[r] - first]; };
  ties.rankings = 1;
  ties.scores = static_cast<double>(ranked);
  ties.cut_ties = score(kept - 1) == score(kept) ? 1 : 0;
  // Equal scores sit side by side in an ordered list: a score is tied when a neighbour equals it.
  for (int64_t r = 0; r < ranked; ++r)
    ties.tied += (r > 0 && score(r - 1) == score(r)) || (r + 1 < ranked && score(r + 1) == score(r)) ? 1 : 0;
  return ties;
}

namespace {

// best_by_score's set without ordering every candidate: its (score descending, index ascending) order is total, so
// the `count` best are one set, however found. The scores are dealt into kBuckets equal slices of [low, high] — a
// monotone map ((v − low)·scale rounds monotonically), so every candidate of a higher bucket beats every one of a
// lower — and only the bucket the cut falls in is ordered. Two linear passes where nth_element's indirect comparisons
// were a sixth of a sparq decode step (65536 candidates per row). Infinite or NaN scores, or all equal, take
// nth_element.
// best_by_score's order on candidate keys a and b: the higher score, and on equal scores the older key.
auto higher_then_older(const std::vector<double>& scores, int64_t first) {
  return [&scores, first](int64_t a, int64_t b) {
    const double sa = scores[a - first], sb = scores[b - first];
    return sa > sb || (sa == sb && a < b);
  };
}

std::vector<int64_t> best_of(std::vector<int64_t> candidates, const std::vector<double>& scores, int64_t first,
                             int64_t count) {
  const auto better = higher_then_older(scores, first);
  const size_t n = candidates.size();
  std::vector<double> value(n);  // the candidates' scores, gathered
  double low = INFINITY, high = -INFINITY;
  bool finite = true;
  size_t c = 0;
#if defined(__AVX512F__)
  // Eight at a time (the scalar loop's comparisons do not vectorise): v − v is NaN exactly for an infinite or NaN v.
  __m512d lows = _mm512_set1_pd(INFINITY), highs = _mm512_set1_pd(-INFINITY), nonfinite = _mm512_setzero_pd();
  for (; c + 8 <= n; c += 8) {
    const __m512i index = _mm512_sub_epi64(_mm512_loadu_si512(candidates.data() + c), _mm512_set1_epi64(first));
    const __m512d v = _mm512_i64gather_pd(index, scores.data(), 8);
    _mm512_storeu_pd(value.data() + c, v);
    lows = _mm512_min_pd(lows, v);
    highs = _mm512_max_pd(highs, v);
    nonfinite = _mm512_add_pd(nonfinite, _mm512_sub_pd(v, v));
  }
  low = _mm512_reduce_min_pd(lows);
  high = _mm512_reduce_max_pd(highs);
  finite = !std::isnan(_mm512_reduce_add_pd(nonfinite));
#endif
  for (; c < n; ++c) {
    const double v = value[c] = scores[candidates[c] - first];
    finite = finite && std::isfinite(v);
    low = v < low ? v : low;
    high = v > high ? v : high;
  }
  constexpr int64_t kBuckets = 4096;
  const double scale = static_cast<double>(kBuckets) / (high - low);
  if (!finite || !(high > low) || !std::isfinite(scale)) {
    std::nth_element(candidates.begin(), candidates.begin() + count, candidates.end(), better);
    candidates.resize(count);
    return candidates;
  }
  std::vector<uint16_t> bucket(n);
  std::vector<int64_t> counts(kBuckets, 0);
  for (size_t c = 0; c < n; ++c) {
    bucket[c] = static_cast<uint16_t>(std::min(kBuckets - 1, static_cast<int64_t>((value[c] - low) * scale)));
    ++counts[bucket[c]];
  }
  int64_t cut = kBuckets - 1, above = 0;  // the bucket holding the count-th best, and the candidates above it
  for (; above + counts[cut] < count; --cut) above += counts[cut];
  std::vector<size_t> boundary;  // positions in `candidates`
  for (size_t c = 0; c < n; ++c)
    if (bucket[c] == cut) boundary.push_back(c);
  const int64_t wanted = count - above;
  std::nth_element(boundary.begin(), boundary.begin() + (wanted - 1), boundary.end(),
                   [&](size_t a, size_t b) { return better(candidates[a], candidates[b]); });
  for (int64_t w = 0; w < wanted; ++w) bucket[boundary[w]] = kBuckets;  // above the cut now
  // In the candidates' order: ascending candidates (every caller's) give ascending keys, which finish_kept then
  // need not sort (16384 kept keys a row at a 25% budget).
  std::vector<int64_t> best;
  best.reserve(count);
  for (size_t c = 0; c < n; ++c)
    if (bucket[c] > cut) best.push_back(candidates[c]);
  return best;
}

}  // namespace

std::vector<int64_t> best_by_score(std::vector<int64_t> candidates, const std::vector<double>& scores, int64_t first,
                                   int64_t count, Precision precision, ScoreTies* ties) {
  if (count >= static_cast<int64_t>(candidates.size())) return candidates;
  if (count <= 0) return {};
  const bool rounding = below_float32(precision);
  const std::vector<double> stored = rounding ? stored_scores(scores, precision) : std::vector<double>();
  const std::vector<double>& compared = rounding ? stored : scores;
  if (rounding && ties) {  // a full order for the tie counts (the rounded path is an emulation already)
    std::sort(candidates.begin(), candidates.end(), higher_then_older(compared, first));
    *ties += ranking_ties(candidates, compared, first, count);
    candidates.resize(count);
    return candidates;
  }
  return best_of(std::move(candidates), compared, first, count);
}

}  // namespace attnprobe
