// sparq (docs/estimators/selection.md) and the completion terms of the selection core, against float64
// implementations written here from the definitions: SparQ's channels, temperature and approximate logits, its kept
// set, the reallocation of the missing mass α to the value mean, and the core's softmax over kept keys plus
// completions. Bounds carry the value observed when they were set.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "attnprobe/common/error.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/selection/kept_keys.h"
#include "attnprobe/exact/exact_attention.h"
#include "attnprobe/metrics/catalogue.h"
#include "attnprobe/metrics/selection_metrics.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

namespace {

struct SparqCase {
  int64_t r = 4, k = 24, window = 6;
  bool realloc = true, group = true;
  std::string agg = "logit";
  std::string spec() const {
    return fmt::format("sparq(r={},k={},window={},realloc={},share={},agg={})", r, k, window, realloc ? 1 : 0,
                       group ? "group" : "head", agg);
  }
};

// A causal view (pv ≠ p) whose kv group has `size` heads: head 0 is the view's own, the others mix its queries with
// their own (related heads), cut to its last `last` rows (0: the whole slice).
HeadView group_view(int64_t n, int p, int size, int64_t last, uint64_t seed) {
  HeadView base = synth_slice(n, p, 0.3, seed, p + 3);
  base.mask = Mask::kCausal;
  std::vector<MatrixF> rows(size);  // prefix_group copies them
  std::vector<const MatrixF*> members(size, nullptr);
  for (int m = 1; m < size; ++m) {
    const HeadView other = synth_slice(n, p, 0.3, seed + 50 + m);
    rows[m] = 0.6f * base.qf + 0.8f * other.qf;
    members[m] = &rows[m];
  }
  if (size > 1) base.group = prefix_group(members, 0, base.keys());
  return last > 0 ? last_rows(base, last) : base;
}

// Every head's query row i (float32 values widened), the view's own first.
std::vector<RowVectorD> group_rows(const HeadView& view, int64_t i, bool group) {
  std::vector<RowVectorD> heads = {view.qf.row(i).cast<double>()};
  if (group && view.group)
    for (int m = 1; m < view.group->size(); ++m) heads.push_back(view.group->rows[m].row(i).cast<double>());
  return heads;
}

struct Reference {
  std::vector<int64_t> kept;
  double alpha = 1;  // Σ_S softmax_{V_t}(ŝ) of the own head
  RowVectorD out;
};

// sparq's row i from its definition, float64 throughout (keys and values as the float32 copies hold them).
Reference sparq_row(const HeadView& view, int64_t i, const SparqCase& c) {
  const int64_t t = view.position(i), p = view.p();
  std::vector<int64_t> seen(t + 1);  // causal: keys 0..t
  std::iota(seen.begin(), seen.end(), 0);
  const std::vector<RowVectorD> heads = group_rows(view, i, c.group);
  Reference ref;
  // Channels: the r largest Σ_h |q_d|, ties to the lower channel.
  std::vector<int64_t> channels(p);
  std::iota(channels.begin(), channels.end(), 0);
  std::stable_sort(channels.begin(), channels.end(), [&](int64_t a, int64_t b) {
    double sa = 0, sb = 0;
    for (const RowVectorD& q : heads) sa += std::abs(q(a)), sb += std::abs(q(b));
    return sa > sb;
  });
  channels.resize(std::min<int64_t>(c.r, p));
  // ŝ^{(h)}_j = q_I·k_{j,I}/τ_h with τ_h = √(p·‖q_I‖₁/‖q‖₁).
  std::vector<std::vector<double>> approx;
  for (const RowVectorD& q : heads) {
    double covered = 0;
    for (int64_t d : channels) covered += std::abs(q(d));
    const double tau = std::sqrt(static_cast<double>(p) * covered / q.lpNorm<1>());
    std::vector<double> s(t + 1);
    for (int64_t j = 0; j <= t; ++j) {
      double dot = 0;
      for (int64_t d : channels) dot += q(d) * static_cast<double>(view.kf(j, d));
      s[j] = dot / tau;
    }
    approx.push_back(s);
  }
  // Window keys, then the best others by the aggregate.
  std::vector<int64_t> rest;
  for (int64_t j : seen) (j > t - c.window ? ref.kept : rest).push_back(j);
  std::vector<double> score(t + 1, c.agg == "max" ? -INFINITY : 0.0);
  for (std::vector<double> s : approx) {
    if (c.agg != "logit" && approx.size() > 1) {  // softmax over the candidates, per head
      double top = -INFINITY, total = 0;
      for (int64_t j : rest) top = std::max(top, s[j]);
      for (int64_t j : rest) total += std::exp(s[j] - top);
      for (int64_t j : rest) s[j] = std::exp(s[j] - top) / total;
    }
    for (int64_t j : rest) score[j] = c.agg == "max" ? std::max(score[j], s[j]) : score[j] + s[j];
  }
  if (c.k >= t + 1) {
    ref.kept = seen;
  } else {
    std::stable_sort(rest.begin(), rest.end(), [&](int64_t a, int64_t b) { return score[a] > score[b]; });
    const int64_t extra = std::max<int64_t>(0, c.k - static_cast<int64_t>(ref.kept.size()));
    ref.kept.insert(ref.kept.end(), rest.begin(), rest.begin() + std::min<int64_t>(extra, rest.size()));
    std::sort(ref.kept.begin(), ref.kept.end());
  }
  // α over V_t of the own head's ŝ.
  const std::vector<double>& own = approx.front();
  const double top = *std::max_element(own.begin(), own.end());
  double all = 0, in = 0;
  for (int64_t j : seen) all += std::exp(own[j] - top);
  for (int64_t j : ref.kept) in += std::exp(own[j] - top);
  ref.alpha = ref.kept.size() == seen.size() ? 1.0 : in / all;
  // softmax_S(ℓ)·V, and the value mean over V_t.
  RowVectorD selected = RowVectorD::Zero(view.pv()), mean = RowVectorD::Zero(view.pv());
  double lmax = -INFINITY, total = 0;
  auto logit = [&](int64_t j) { return view.scale * view.qf.row(i).cast<double>().dot(view.kf.row(j).cast<double>()); };
  for (int64_t j : ref.kept) lmax = std::max(lmax, logit(j));
  for (int64_t j : ref.kept) {
    const double w = std::exp(logit(j) - lmax);
    selected += w * view.vf.row(j).cast<double>();
    total += w;
  }
  if (total > 0) selected /= total;
  for (int64_t j : seen) mean += view.vf.row(j).cast<double>() / static_cast<double>(seen.size());
  ref.out = c.realloc ? RowVectorD(ref.alpha * selected + (1 - ref.alpha) * mean) : selected;
  return ref;
}

std::vector<int64_t> library_kept(const std::string& spec, const HeadView& view, int64_t i) {
  return parse_spec(spec).make()->kept_keys(view, {make_random_key(1, spec, 0)})(i).keys;
}

}  // namespace

TEST_CASE("sparq agrees with a float64 implementation of its definition", "[selection][sparq]") {
  // Decode rows (the last 12 of 120) and a whole causal slice; a kv group of 2 heads; every share/agg/realloc.
  const HeadView decode = group_view(120, 16, 2, 12, 3);
  const HeadView whole = group_view(60, 16, 2, 0, 4);
  double worst = 0;
  int sets = 0;
  for (const HeadView* view : {&decode, &whole})
    for (bool group : {false, true})
      for (const std::string agg : {"logit", "mean", "max"})
        for (bool realloc : {false, true})
          for (int64_t r : {int64_t{3}, int64_t{16}, int64_t{40}}) {
            const SparqCase c{r, 24, 6, realloc, group, agg};
            INFO(c.spec() << " rows " << view->n());
            const MatrixF out = run_estimator(c.spec(), *view);
            for (int64_t i = 0; i < view->n(); ++i) {
              const Reference ref = sparq_row(*view, i, c);
              CHECK(library_kept(c.spec(), *view, i) == ref.kept);
              ++sets;
              worst = std::max(worst, (out.row(i).cast<double>() - ref.out).norm() / ref.out.norm());
            }
          }
  CHECK(sets == 2 * 3 * 2 * 3 * (12 + 60));
  CHECK(worst < 1e-5);  // observed 2.3e-7
}

TEST_CASE("sparq's identities: full budgets are exact, r = p gives topk's set and α = the kept mass",
          "[selection][sparq]") {
  const HeadView view = group_view(100, 16, 1, 10, 7);
  const MatrixD exact = exact_attention_f64(view.q, view.k, view.v, view.scale, nullptr, view.geometry());
  // k ≥ |V_t| (100 keys): exact with and without the reallocation (α = 1), to float32 rounding.
  for (const char* spec : {"sparq(k=100,realloc=0)", "sparq(k=100,realloc=1)", "sparq(k=4096,window=0)"}) {
    INFO(spec);
    const MatrixF out = run_estimator(spec, view);
    CHECK((out.cast<double>() - exact).norm() / exact.norm() < 1e-6);  // observed ≤ 2.0e-7
  }
  // r = p with s = 1/√p: τ = √p, ŝ = q·k/√p = ℓ. The kept set is topk's with k − window scored keys and the same
  // window, and α is the exact kept mass m, so ô = m·μ_S + (1 − m)·v̄.
  REQUIRE(std::abs(view.scale - 0.25) < 1e-15);
  const auto rows = parse_spec("sparq(r=16,k=20,window=5)").make()->kept_keys(view, {make_random_key(1, "s", 0)});
  const MatrixF out = run_estimator("sparq(r=16,k=20,window=5)", view);
  double worst = 0;
  for (int64_t i = 0; i < view.n(); ++i) {
    const std::vector<int64_t> kept = rows(i).keys;
    CHECK(kept == library_kept("topk(k=15,window=5)", view, i));
    CHECK(kept.size() == 20);
    const KeyRange seen = view.visible(i);
    const RowVectorD a = attention_rows_f64(view.q, view.k, view.scale, i, 1, view.geometry()).row(0);
    double m = 0;
    RowVectorD mu = RowVectorD::Zero(view.pv()), mean = RowVectorD::Zero(view.pv());
    for (int64_t j : kept) m += a(j), mu += a(j) * view.v.row(j);
    for (int64_t j = seen.begin; j < seen.end; ++j) mean += view.v.row(j) / static_cast<double>(seen.size());
    const RowVectorD expected = mu + (1 - m) * mean;  // m·μ_S = Σ_S a_j v_j
    worst = std::max(worst, (out.row(i).cast<double>() - expected).norm() / expected.norm());
  }
  CHECK(worst < 1e-5);  // observed 1.7e-7 (ŝ from float32 inputs, ℓ in float64)
}

TEST_CASE("sparq's weights, keys read and metrics", "[selection][sparq]") {
  const HeadView view = group_view(90, 12, 2, 10, 11);
  const int64_t n = view.n();
  for (bool realloc : {false, true}) {
    const std::string spec = fmt::format("sparq(r=5,k=30,window=4,realloc={})", realloc ? 1 : 0);
    INFO(spec);
    const auto estimator = parse_spec(spec).make();
    const EstimateContext ctx{make_random_key(1, spec, 0)};
    // Â: rows sum to 1, Â·V is the estimate (the completion's mass spread evenly over V_t).
    const MatrixD w = estimator->weights(view, ctx)(0, n);
    const MatrixD out = attend_kept_f64(view, estimator->kept_keys(view, ctx));
    CHECK((w.rowwise().sum().array() - 1).abs().maxCoeff() < 1e-12);  // observed 4.4e-16
    CHECK((w * view.v - out).norm() / out.norm() < 1e-12);            // observed 3.0e-16
    CHECK((out - attend_kept_f64(view, estimator->kept_keys(view, ctx))).norm() == 0);
    // The metrics: keys_attended = k (every row sees ≥ 81 keys), keys_scored = |V_t|·r/p, one rep with realloc.
    const std::vector<Metric> which = {Metric::kKeysAttended, Metric::kKeysScored, Metric::kRepsAttended,
                                       Metric::kTailMass,     Metric::kTailPred,   Metric::kDenRel,
                                       Metric::kMassRecall};
    const std::vector<double> got = selection_metrics(view, estimator->kept_keys(view, ctx), which);
    double scored = 0, den_rel = 0, mass = 0, err = 0;
    const MatrixD exact = exact_attention_f64(view.q, view.k, view.v, view.scale, nullptr, view.geometry());
    for (int64_t i = 0; i < n; ++i) {
      const KeyRange seen = view.visible(i);
      scored += static_cast<double>(seen.size()) * 5 / 12;
      const Reference ref = sparq_row(view, i, SparqCase{5, 30, 4, realloc, true, "logit"});
      const RowVectorD a = attention_rows_f64(view.q, view.k, view.scale, i, 1, view.geometry()).row(0);
      double m = 0;
      for (int64_t j : ref.kept) m += a(j);
      mass += m;
      den_rel += std::abs(m / ref.alpha - 1);  // D̂/D = m + m(1 − α)/α
      err += (out.row(i) - exact.row(i)).norm();
    }
    CHECK(got[0] == 30);
    CHECK(got[1] == Approx(scored / n).epsilon(1e-12));
    CHECK(got[2] == (realloc ? 1 : 0));
    CHECK(got[6] == Approx(mass / n).epsilon(1e-12));
    if (realloc) {  // not a renormalised selection: no tail decomposition, the estimate diagnostics instead
      CHECK(std::isnan(got[3]));
      CHECK(std::isnan(got[4]));
      CHECK(got[5] == Approx(den_rel / n).epsilon(1e-6));  // α from float32 inputs
      CHECK(got[5] > 0.01);                                // observed 0.056: α is not the kept mass
    } else {                                               // the tail identity: tail_pred is the row error
      CHECK(got[3] == Approx(1 - mass / n).epsilon(1e-9));
      CHECK(std::abs(got[4] - err / n) < 1e-10 * exact.norm());  // observed 3.1e-17·‖O‖
      CHECK(std::isnan(got[5]));
    }
  }
}

TEST_CASE("sparq: a group of one is share=head bit for bit, and bad settings are refused", "[selection][sparq]") {
  const HeadView view = group_view(80, 16, 1, 8, 2);
  CHECK(run_estimator("sparq(r=4,k=20,window=4,share=group,agg=mean)", view) ==
        run_estimator("sparq(r=4,k=20,window=4,share=head)", view));
  // r beyond the head size clips to every channel (stories260K has p = 8 under the default r = 16).
  CHECK(run_estimator("sparq(r=16,k=20,window=4)", view) == run_estimator("sparq(r=99,k=20,window=4)", view));
  // k = window = 0 with realloc keeps nothing: the value mean over V_t; without, the zero row.
  const MatrixF mean_only = run_estimator("sparq(k=0,window=0)", view);
  const KeyRange seen = view.visible(3);
  const RowVectorD mean = view.vf.middleRows(seen.begin, seen.size()).cast<double>().colwise().mean();
  CHECK((mean_only.row(3).cast<double>() - mean).norm() < 1e-6 * mean.norm());  // observed 2.1e-8
  CHECK(run_estimator("sparq(k=0,window=0,realloc=0)", view).isZero(0));
  for (const char* bad : {"sparq(r=0)", "sparq(k=32,window=64)", "sparq(realloc=2)", "sparq(share=kv)"}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_spec(bad), UsageError);
  }
  try {
    parse_spec("sparq(k=32,window=64)");
  } catch (const UsageError& e) {
    CHECK_THAT(e.what(), Catch::Contains("window=64") && Catch::Contains("k=32"));
  }
  // The window is a position: under the full mask only window = 0.
  CHECK_THROWS_AS(require_mask_support(parse_spec("sparq"), Mask::kFull), UsageError);
  CHECK_NOTHROW(require_mask_support(parse_spec("sparq(window=0)"), Mask::kFull));
}

TEST_CASE("completion terms join the kept keys' softmax and spread their mass in Â", "[selection][core]") {
  HeadView view = synth_slice(40, 8, 0.5, 9, 5);
  view.mask = Mask::kCausal;
  view = last_rows(view, 3);
  // Row 1 (position 38): keys {2, 30, 38}, one log-weight, an absolute completion over keys {0, 1, 5} and a
  // relative one over V_t.
  const RowVectorD u1 = RowVectorD::LinSpaced(5, -1, 2), u2 = RowVectorD::Constant(5, 0.7);
  KeptKeys row{{2, 30, 38}, {0.0, 0.4, -0.2}, 0};
  row.completions.push_back({1.5, false, u1, {0, 1, 5}});
  row.completions.push_back({-0.8, true, u2, {}});
  KeptKeys empty_keys{{}, {}, 0};
  empty_keys.completions.push_back({-3, false, u1, {}});
  const Estimator::KeptRows keep = [&](int64_t i) { return i == 1 ? row : i == 2 ? empty_keys : KeptKeys{{}, {}, 0}; };
  // The definition: D̂ = Σ_S e^{ℓ_j + ω_j} + e^{λ_1} + e^{λ_2}, λ_2 = −0.8 + log Σ_S e^{ℓ + ω}.
  double kept_sum = 0;
  RowVectorD num = RowVectorD::Zero(5);
  for (size_t r = 0; r < 3; ++r) {
    const double e = std::exp(view.scale * view.q.row(1).dot(view.k.row(row.keys[r])) + row.log_weights[r]);
    kept_sum += e;
    num += e * view.v.row(row.keys[r]);
  }
  const double c1 = std::exp(1.5), c2 = std::exp(-0.8) * kept_sum, total = kept_sum + c1 + c2;
  const RowVectorD expected = (num + c1 * u1 + c2 * u2) / total;
  const MatrixD f64 = attend_kept_f64(view, keep);
  MatrixF f32;
  attend_kept(view, keep, nullptr, f32);
  CHECK((f64.row(1) - expected).norm() < 1e-14 * expected.norm());                // observed 1.7e-16
  CHECK((f32.row(1).cast<double>() - expected).norm() < 1e-6 * expected.norm());  // observed 8.4e-8
  CHECK(f64.row(0).isZero(0));                                                    // nothing: the zero row
  CHECK((f64.row(2) - u1).norm() < 1e-15);                                        // a completion alone: u_c
  // Â: the kept keys' e^{ℓ+ω}/D̂, completion 1 spread over its 3 keys, completion 2 over the 39 keys of V_t.
  const MatrixD w = kept_weights(view, keep)(1, 1);
  for (int64_t j = 0; j < 39; ++j) {
    double want = c2 / total / 39;
    if (j == 0 || j == 1 || j == 5) want += c1 / total / 3;
    for (size_t r = 0; r < 3; ++r)
      if (row.keys[r] == j)
        want += std::exp(view.scale * view.q.row(1).dot(view.k.row(j)) + row.log_weights[r]) / total;
    CHECK(w(0, j) == Approx(want).epsilon(1e-12));
  }
  CHECK(w(0, 39) == 0);  // after the row's position
}
