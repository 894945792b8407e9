#include "attnprobe/metrics/selection_metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "attnprobe/exact/exact_attention.h"
#include "attnprobe/metrics/largest_entries.h"

namespace attnprobe {
namespace {

constexpr int64_t kRowBlock = 64;

// The first `count` of a largest-first list of keys, ascending (for the merge in `common`).
std::vector<int64_t> ascending_prefix(const std::vector<int64_t>& largest_first, int64_t count) {
  std::vector<int64_t> out(
      largest_first.begin(),
      largest_first.begin() + std::min<int64_t>(count, static_cast<int64_t>(largest_first.size())));
  std::sort(out.begin(), out.end());
  return out;
}

// |x ∩ y| of two ascending index lists.
int64_t common(const std::vector<int64_t>& x, const std::vector<int64_t>& y) {
  int64_t both = 0;
  for (size_t i = 0, j = 0; i < x.size() && j < y.size();) {
    if (x[i] == y[j]) {
      ++both, ++i, ++j;
    } else if (x[i] < y[j]) {
      ++i;
    } else {
      ++j;
    }
  }
  return both;
}

// |x ∩ y| / |x ∪ y| of two ascending index lists (1 for two empty ones).
double jaccard(const std::vector<int64_t>& x, const std::vector<int64_t>& y) {
  const int64_t both = common(x, y);
  const int64_t either = static_cast<int64_t>(x.size() + y.size()) - both;
  return either > 0 ? static_cast<double>(both) / static_cast<double>(either) : 1.0;
}

// |x ∩ y| / |x|: the share of x that y holds too (1 for an empty x, which y holds vacuously).
double contained(const std::vector<int64_t>& x, const std::vector<int64_t>& y) {
  return x.empty() ? 1.0 : static_cast<double>(common(x, y)) / static_cast<double>(x.size());
}

// Per-row values, summed over the rows for their means.
struct Sums {
  double attended = 0, scored = 0, reps = 0, density = 0, density_scored = 0, mass = 0, tail_mass = 0, tail_gap = 0,
         tail_pred = 0, kl_rev = 0, overlap = 0, recall = 0, den_rel = 0, num_rel = 0, covered = 0, pilot = 0,
         overlap_f32 = 0, overlap_a = 0;
  ScoreTies ties;
};

// log D = log Σ_{V_t} e^{ℓ_j} of a row, from its float64 logits (shifted by their maximum).
double row_log_normaliser(const HeadView& view, int64_t row) {
  const KeyRange seen = view.visible(row);
  const RowVectorD logits =
      view.scale * (view.k.middleRows(seen.begin, seen.size()) * view.q.row(row).transpose()).transpose();
  const double top = logits.maxCoeff();
  return top + std::log((logits.array() - top).exp().sum());
}

}  // namespace

std::vector<double> selection_metrics(const HeadView& view, const Estimator::KeptRows& kept,
                                      const std::vector<Metric>& which, double eps, int64_t recall_k,
                                      const Estimator::KeptRows* reference_kept,
                                      const Estimator::KeptRows* float32_kept) {
  if (!kept) throw std::logic_error("selection metrics of an estimator that states no kept keys");
  const int64_t n = view.n();
  Sums sums;
  // Some row is not a renormalised selection — its keys carry weights or it has completion terms — so the tail
  // decomposition does not apply and the estimate diagnostics (den_rel, num_rel, eps_cover) do.
  bool weighted = false;
  const bool wants_jaccard = std::find(which.begin(), which.end(), Metric::kKeptOverlap) != which.end();
  const bool wants_contained = std::find(which.begin(), which.end(), Metric::kKeptOverlapA) != which.end();
  const bool wants_overlap = wants_jaccard || wants_contained;
  const bool wants_recall = std::find(which.begin(), which.end(), Metric::kTopkRecallAtK) != which.end();
  const bool wants_overlap_f32 = std::find(which.begin(), which.end(), Metric::kKeptOverlapF32) != which.end();
  for (int64_t r0 = 0; r0 < n; r0 += kRowBlock) {
    const int64_t rows = std::min(kRowBlock, n - r0);
    const MatrixD a = attention_rows_f64(view.q, view.k, view.scale, r0, rows, view.geometry(), &view.shaping);
    for (int64_t r = 0; r < rows; ++r) {
      const KeptKeys row = kept(r0 + r);
      const KeyRange seen = view.visible(r0 + r);
      const bool estimated = !row.log_weights.empty() || !row.completions.empty();
      weighted = weighted || estimated;
      double m = 0, tail = 0;  // the kept and the dropped mass, each summed (1 − m would cancel when m ≈ 1)
      RowVectorD kept_sum = RowVectorD::Zero(view.pv()), tail_sum = RowVectorD::Zero(view.pv());
      // The sampling estimate over D: D̂/D = Σ_S a_j·w_j and N̂/D = Σ_S a_j·w_j·v_j (a_j·w_j as e^{log a_j + ω_j}:
      // a tiny a_j may carry a huge weight).
      double den = 0;
      RowVectorD num = RowVectorD::Zero(view.pv());
      size_t next = 0;  // walks the ascending kept keys beside the visible range
      for (int64_t j = seen.begin; j < seen.end; ++j) {
        const bool in = next < row.keys.size() && row.keys[next] == j;
        if (in) {
          if (estimated && a(r, j) > 0) {
            const double share =
                row.log_weights.empty() ? a(r, j) : std::exp(std::log(a(r, j)) + row.log_weights[next]);
            den += share;
            num += share * view.v.row(j);
          }
          ++next;
          m += a(r, j);
          kept_sum += a(r, j) * view.v.row(j);
        } else {
          tail += a(r, j);
          tail_sum += a(r, j) * view.v.row(j);
        }
      }
      // Completion terms over D: a relative one's mass is e^{λ}·Σ_S e^{ℓ + ω}, so over D it is e^{λ}·(D̂_S/D); an
      // absolute one's is e^{λ − log D}, log D from the row's float64 logits.
      if (!row.completions.empty()) {
        const double kept_den = den;
        double log_d = std::numeric_limits<double>::quiet_NaN();
        for (const Completion& c : row.completions) {
          if (!c.relative && std::isnan(log_d)) log_d = row_log_normaliser(view, r0 + r);
          const double share = c.relative ? std::exp(c.log_mass) * kept_den : std::exp(c.log_mass - log_d);
          den += share;
          num += share * c.value;
        }
      }
      const double visible = static_cast<double>(seen.size()), attended = static_cast<double>(row.keys.size());
      // μ_T − μ_S; a row that keeps everything (m = 1, no tail) has no gap, one that keeps nothing no μ_S.
      const RowVectorD mu_s = m > 0 ? RowVectorD(kept_sum / m) : RowVectorD::Zero(view.pv());
      const RowVectorD mu_t = tail > 0 ? RowVectorD(tail_sum / tail) : RowVectorD::Zero(view.pv());
      const double gap = next == static_cast<size_t>(seen.size()) ? 0.0 : (mu_t - mu_s).norm();
      sums.attended += attended;
      sums.scored += row.scored;
      sums.reps += static_cast<double>(row.completions.size());
      sums.density += attended / visible;
      sums.density_scored += row.scored / visible;
      sums.mass += m;
      sums.tail_mass += tail;
      sums.tail_gap += gap;
      sums.tail_pred += tail * gap;
      sums.kl_rev += m > 0 ? -std::log1p(-tail) : std::numeric_limits<double>::infinity();
      if (estimated) {
        const RowVectorD exact = kept_sum + tail_sum;  // o_t = N/D
        const double o_norm = exact.norm(), limit = std::isnan(row.eps) ? eps : row.eps;
        sums.den_rel += std::abs(den - 1);
        sums.num_rel += (num - exact).norm() / o_norm;
        // ô = N̂/D̂; an empty estimate is the zero row (attend_kept's).
        const RowVectorD estimate = den > 0 ? RowVectorD(num / den) : RowVectorD::Zero(view.pv());
        sums.covered += (estimate - exact).norm() <= limit * o_norm ? 1.0 : 0.0;
        sums.pilot += row.pilot;
      }
      // Against the oracle of the same size or the reference's set (kept_overlap, a Jaccard index, and kept_overlap_a,
      // the share of the row's keys it holds) and the K heaviest keys.
      // One ranking serves both, ranked only as deep as they read (a selection reference needs none for the overlap).
      const int64_t size = static_cast<int64_t>(row.keys.size());
      const int64_t ranked = std::max(wants_overlap && !reference_kept ? size : 0, wants_recall ? recall_k : 0);
      const std::vector<int64_t> largest =
          ranked > 0 ? largest_entries(a.row(r), seen.begin, seen.end, ranked) : std::vector<int64_t>();
      if (wants_overlap) {
        const std::vector<int64_t> other =
            reference_kept ? (*reference_kept)(r0 + r).keys : ascending_prefix(largest, size);
        if (wants_jaccard) sums.overlap += jaccard(row.keys, other);
        if (wants_contained) sums.overlap_a += contained(row.keys, other);
      }
      sums.ties += row.ties;
      if (wants_overlap_f32) sums.overlap_f32 += float32_kept ? jaccard(row.keys, (*float32_kept)(r0 + r).keys) : 1.0;
      if (wants_recall) {
        const std::vector<int64_t> top = ascending_prefix(largest, recall_k);
        sums.recall += static_cast<double>(common(row.keys, top)) / static_cast<double>(top.size());
      }
    }
  }
  const double rows = static_cast<double>(n), nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> out;
  for (Metric metric : which) {
    switch (metric) {
      case Metric::kKeysAttended:
        out.push_back(sums.attended / rows);
        break;
      case Metric::kKeysScored:
        out.push_back(sums.scored / rows);
        break;
      case Metric::kRepsAttended:
        out.push_back(sums.reps / rows);
        break;
      case Metric::kDensity:
        out.push_back(sums.density / rows);
        break;
      case Metric::kDensityScored:
        out.push_back(sums.density_scored / rows);
        break;
      case Metric::kMassRecall:
        out.push_back(sums.mass / rows);
        break;
      case Metric::kTailMass:
        out.push_back(weighted ? nan : sums.tail_mass / rows);
        break;
      case Metric::kTailGap:
        out.push_back(weighted ? nan : sums.tail_gap / rows);
        break;
      case Metric::kTailPred:
        out.push_back(weighted ? nan : sums.tail_pred / rows);
        break;
      case Metric::kRowKlRev:
        out.push_back(weighted ? nan : sums.kl_rev / rows);
        break;
      case Metric::kKeptOverlap:
        out.push_back(sums.overlap / rows);
        break;
      case Metric::kTopkRecallAtK:
        out.push_back(sums.recall / rows);
        break;
      case Metric::kDenRel:
        out.push_back(weighted ? sums.den_rel / rows : nan);
        break;
      case Metric::kNumRel:
        out.push_back(weighted ? sums.num_rel / rows : nan);
        break;
      case Metric::kEpsCover:
        out.push_back(weighted ? sums.covered / rows : nan);
        break;
      case Metric::kPilot:
        out.push_back(weighted ? sums.pilot / rows : nan);
        break;
      case Metric::kKeptOverlapA:
        out.push_back(sums.overlap_a / rows);
        break;
      case Metric::kKeptOverlapF32:
        out.push_back(sums.overlap_f32 / rows);
        break;
      case Metric::kScoreTies:
        out.push_back(sums.ties.scores > 0 ? sums.ties.tied / sums.ties.scores : nan);
        break;
      case Metric::kCutTies:
        out.push_back(sums.ties.rankings > 0 ? sums.ties.cut_ties / sums.ties.rankings : nan);
        break;
      default:
        throw std::logic_error(std::string("not a selection metric: ") + metric_name(metric));
    }
  }
  return out;
}

}  // namespace attnprobe
