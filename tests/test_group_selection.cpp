// Selections shared over a kv group (share=group, docs/estimators/selection.md) and the methods that compress the
// prompt once without votes — expected, streaming(roll=0) — against float64 implementations written here from their
// definitions: a group's aggregate of its heads' scores, Expected Attention's Gaussian model of future queries.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <map>
#include <numeric>
#include <regex>

#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/selection/duo/duo.h"
#include "attnprobe/exact/exact_attention.h"
#include "attnprobe/io/dump.h"
#include "attnprobe/io/dump_writer.h"
#include "attnprobe/metrics/selection_metrics.h"
#include "attnprobe/records/csv.h"
#include "attnprobe/view/rounded_view.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

namespace {

// The `count` best of `candidates` by (score descending, index ascending).
std::vector<int64_t> best(std::vector<int64_t> candidates, const std::function<double(int64_t)>& score, int64_t count) {
  std::stable_sort(candidates.begin(), candidates.end(), [&](int64_t a, int64_t b) { return score(a) > score(b); });
  candidates.resize(std::min<int64_t>(count, static_cast<int64_t>(candidates.size())));
  std::sort(candidates.begin(), candidates.end());
  return candidates;
}

// Row i's softmax over `kept` applied to V, float64.
RowVectorD attend(const HeadView& view, int64_t i, const std::vector<int64_t>& kept) {
  RowVectorD out = RowVectorD::Zero(view.pv());
  double top = -INFINITY, total = 0;
  auto logit = [&](int64_t j) { return view.scale * view.qf.row(i).cast<double>().dot(view.kf.row(j).cast<double>()); };
  for (int64_t j : kept) top = std::max(top, logit(j));
  for (int64_t j : kept) {
    const double w = std::exp(logit(j) - top);
    out += w * view.v.row(j);
    total += w;
  }
  return out / total;
}

// Head 0 of a group of `size` heads reading the keys of `base`: the other heads' query rows are `base`'s rows
// mixed with their own noise (related heads, as in a trained model), or `base`'s own rows when `identical`.
HeadView grouped(const HeadView& base, int size, bool identical, int64_t last) {
  std::vector<MatrixF> rows(size);
  for (int m = 1; m < size; ++m) {
    const HeadView other = synth_slice(base.keys(), static_cast<int>(base.p()), 0.3, 100 + m);
    rows[m] = identical ? base.qf : MatrixF(0.6f * base.qf + 0.8f * other.qf);
  }
  std::vector<const MatrixF*> members(size, nullptr);
  for (int m = 1; m < size; ++m) members[m] = &rows[m];
  HeadView whole = base;
  whole.group = prefix_group(members, 0, base.keys());
  return last > 0 ? last_rows(whole, last) : whole;
}

// Every head's query rows of a grouped view, head 0 (the view's own) first; with the prompt rows before them.
std::vector<MatrixD> group_queries(const HeadView& view, bool prompt) {
  std::vector<MatrixD> heads = {(prompt ? view.prompt_qf : view.qf).cast<double>()};
  for (int m = 1; m < view.group->size(); ++m)
    heads.push_back((prompt ? view.group->prompt[m] : view.group->rows[m]).cast<double>());
  return heads;
}

// topk(k, share=group, agg) of row i from the definition: each head's logits over the keys the row sees; mean and
// max act on each head's softmax over those candidates, logit sums the logits.
std::vector<int64_t> group_topk_set(const HeadView& view, int64_t i, int64_t k, const std::string& agg) {
  const int64_t t = view.position(i);
  std::vector<int64_t> seen(t + 1);
  std::iota(seen.begin(), seen.end(), 0);
  const std::vector<MatrixD> heads = group_queries(view, false);
  std::vector<double> combined(t + 1, agg == "max" ? -INFINITY : 0.0);
  for (const MatrixD& q : heads) {
    std::vector<double> s(t + 1);
    for (int64_t j = 0; j <= t; ++j) s[j] = view.scale * q.row(i).dot(view.kf.row(j).cast<double>());
    if (agg != "logit") {
      const double top = *std::max_element(s.begin(), s.end());
      double total = 0;
      for (double& x : s) total += x = std::exp(x - top);
      for (double& x : s) x /= total;
    }
    for (int64_t j = 0; j <= t; ++j) combined[j] = agg == "max" ? std::max(combined[j], s[j]) : combined[j] + s[j];
  }
  return best(
      seen, [&](int64_t j) { return combined[j]; }, k);
}

// R_τ of rotary embedding with the rotate_half pairing, as the spec writes it: diag(cos τθ) + diag(sin τθ)·J, θ each
// pair's frequency repeated over both halves, J[f + h, f] = 1 and J[f, f + h] = −1 (h = p/2).
MatrixD rope_matrix(const std::vector<double>& theta, double tau) {
  const int64_t h = static_cast<int64_t>(theta.size()), p = 2 * h;
  Eigen::VectorXd c(p), s(p);
  for (int64_t f = 0; f < p; ++f) {
    c(f) = std::cos(tau * theta[f % h]);
    s(f) = std::sin(tau * theta[f % h]);
  }
  MatrixD J = MatrixD::Zero(p, p);
  for (int64_t f = 0; f < h; ++f) {
    J(f + h, f) = 1;
    J(f, f + h) = -1;
  }
  return MatrixD(c.asDiagonal()) + MatrixD(s.asDiagonal()) * J;
}

// The rotary statistics of expected(stats=rope): frequencies and the number of future positions.
struct RopeStats {
  std::vector<double> theta;
  int64_t future = 0;
};

// Expected Attention's kept prompt set from the definition, for the heads' prompt rows (one head: share=head):
// μ, Σ of rows [sink, P) (divided by the count), z_j = s k·μ + s²/2 kᵀΣk for j in [sink, P), π = softmax z per
// head, their mean over heads, times ‖v_j‖ (vnorm); the sinks and the budget − sink best. With `rope`: μ, Σ of the
// pre-RoPE rows R_iᵀq_i, then μ' = R̄μ, Σ' = R̄ΣR̄ᵀ with R̄ the mean of R_τ over τ = P..P + future − 1.
std::vector<int64_t> expected_prompt_set(const HeadView& view, const std::vector<MatrixD>& prompts, int64_t budget,
                                         int64_t sink, bool cov, bool vnorm, const RopeStats* rope = nullptr) {
  const int64_t P = prompts.front().rows();
  std::vector<int64_t> kept(std::min(P, budget));
  if (P <= budget) {
    std::iota(kept.begin(), kept.end(), 0);
    return kept;
  }
  std::vector<double> score(P, 0.0);
  for (MatrixD q : prompts) {
    const int64_t rows = P - sink;
    if (rope)
      for (int64_t i = sink; i < P; ++i)
        q.row(i) = (rope_matrix(rope->theta, static_cast<double>(i)).transpose() * q.row(i).transpose()).transpose();
    Eigen::RowVectorXd mean = Eigen::RowVectorXd::Zero(q.cols());
    for (int64_t i = sink; i < P; ++i) mean += q.row(i) / static_cast<double>(rows);
    MatrixD sigma = MatrixD::Zero(q.cols(), q.cols());
    for (int64_t i = sink; i < P; ++i) {
      const Eigen::RowVectorXd d = q.row(i) - mean;
      sigma += d.transpose() * d / static_cast<double>(rows);
    }
    if (rope) {
      MatrixD average = MatrixD::Zero(q.cols(), q.cols());
      for (int64_t tau = P; tau < P + rope->future; ++tau)
        average += rope_matrix(rope->theta, static_cast<double>(tau)) / static_cast<double>(rope->future);
      mean = (average * mean.transpose()).transpose();
      sigma = average * sigma * average.transpose();
    }
    std::vector<double> z(P, -INFINITY);
    for (int64_t j = sink; j < P; ++j) {
      const Eigen::RowVectorXd k = view.kf.row(j).cast<double>();
      z[j] = view.scale * k.dot(mean) + (cov ? 0.5 * view.scale * view.scale * (k * sigma * k.transpose())(0) : 0.0);
    }
    const double top = *std::max_element(z.begin() + sink, z.end());
    double total = 0;
    for (int64_t j = sink; j < P; ++j) total += std::exp(z[j] - top);
    for (int64_t j = sink; j < P; ++j) score[j] += std::exp(z[j] - top) / total / static_cast<double>(prompts.size());
  }
  if (vnorm)
    for (int64_t j = sink; j < P; ++j) score[j] *= view.vf.row(j).cast<double>().norm();
  std::vector<int64_t> candidates(P - sink);
  std::iota(candidates.begin(), candidates.end(), sink);
  kept = best(
      candidates, [&](int64_t j) { return score[j]; }, budget - sink);
  for (int64_t j = 0; j < sink; ++j) kept.push_back(j);
  std::sort(kept.begin(), kept.end());
  return kept;
}

// A decode row's kept set: the prompt's kept keys and every key from P to its own.
std::vector<int64_t> with_decode_keys(std::vector<int64_t> prompt, const HeadView& view, int64_t i) {
  for (int64_t j = view.first_position; j <= view.position(i); ++j) prompt.push_back(j);
  return prompt;
}

HeadView causal_slice(int64_t n, int p, uint64_t seed) {
  HeadView view = synth_slice(n, p, 0.3, seed, p + 3);
  view.mask = Mask::kCausal;
  return view;
}

std::string write_pattern(const std::string& name, const std::string& text) {
  const std::string path = temp_path(name);
  std::ofstream(path) << text;
  return path;
}

// The values of the CSV rows of `metric`, by head (a sweep of one layer, one batch item, one length).
std::map<int, double> values_by_head(const std::string& csv, const std::string& metric) {
  std::map<int, double> out;
  for (const TrialRow& row : read_csv(csv).trials)
    if (row.metric == metric) out[static_cast<int>(row.key.head.value())] = row.value;
  return out;
}

// A sweep of `spec` with mass_recall into `csv` over the last 4 rows of a synthetic causal layer of 4 query heads
// over 2 kv heads (n = 96, p = 16), written to `name`: the dump's path.
std::string sweep_gqa_layer(const std::string& name, const std::string& spec, const std::string& csv) {
  SynthOptions gqa = synth_options(1, 4, 1, 96, 16);
  gqa.kv_heads = 2;
  const std::string dump = write_synth(name, gqa);
  const auto run = run_attnprobe("sweep " + dump + " -e '" + spec +
                                 "' --mask causal --queries last:4 --metrics mass_recall --overwrite -q -o " + csv);
  REQUIRE(run.exit_code == 0);
  return dump;
}

}  // namespace

TEST_CASE("topk shared over a kv group ranks by the group's aggregate", "[selection][share]") {
  const HeadView view = grouped(causal_slice(120, 12, 41), 3, false, 10);
  for (const std::string agg : {"mean", "max", "logit"}) {
    const std::string spec = "topk(k=9,share=group,agg=" + agg + ")";
    INFO(spec);
    int64_t mismatches = 0, differ_from_head = 0;
    for (int64_t i = 0; i < view.n(); ++i) {
      const std::vector<int64_t> kept = group_topk_set(view, i, 9, agg);
      mismatches += stated_set(spec, view, i) != kept;
      differ_from_head += stated_set("topk(k=9)", view, i) != kept;
    }
    CHECK(mismatches == 0);
    CHECK(differ_from_head >
          0);  // the group's choice is another one: observed on 8 (mean), 5 (max), 9 (logit) of 10 rows
  }
}

TEST_CASE("a group of one is share=head bit for bit, and G identical heads choose as one", "[selection][share]") {
  const HeadView whole = causal_slice(160, 16, 43);
  const HeadView alone = last_rows(whole, 12), one = grouped(whole, 1, false, 12), same = grouped(whole, 4, true, 12);
  for (const auto& [head, group] : std::vector<std::pair<std::string, std::string>>{
           {"topk(k=12)", "topk(k=12,share=group,agg=max)"},
           {"snapkv(window=8,budget=40)", "snapkv(window=8,budget=40,share=group)"},
           {"expected(budget=40,share=head)", "expected(budget=40)"}}) {
    INFO(head << " vs " << group);
    CHECK(rows_identical(run_estimator(head, alone), run_estimator(group, alone), alone.n()));  // no group
    CHECK(rows_identical(run_estimator(head, alone), run_estimator(group, one), alone.n()));    // a group of one
    int64_t mismatches = 0;
    for (int64_t i = 0; i < same.n(); ++i) mismatches += stated_set(head, alone, i) != stated_set(group, same, i);
    CHECK(mismatches == 0);
  }
}

TEST_CASE("snapkv shared over a kv group keeps the best of the group's pooled votes", "[selection][share]") {
  // kvpress's form: the group's mean of each head's votes (window 6, budget 30, kernel 1: no pooling).
  const HeadView view = grouped(causal_slice(140, 12, 47), 2, false, 8);
  const int64_t P = view.first_position, window = 6, budget = 30;
  std::vector<double> votes(P - window, 0.0);
  for (const MatrixD& q : group_queries(view, true))
    for (int64_t r = P - window; r < P; ++r) {
      std::vector<double> w(r + 1);
      double top = -INFINITY, total = 0;
      for (int64_t j = 0; j <= r; ++j)
        top = std::max(top, w[j] = view.scale * q.row(r).dot(view.kf.row(j).cast<double>()));
      for (double& x : w) total += x = std::exp(x - top);
      for (int64_t j = 0; j < P - window; ++j) votes[j] += w[j] / total / 2;
    }
  std::vector<int64_t> candidates(P - window);
  std::iota(candidates.begin(), candidates.end(), 0);
  std::vector<int64_t> kept = best(
      candidates, [&](int64_t j) { return votes[j]; }, budget - window);
  for (int64_t j = P - window; j < P; ++j) kept.push_back(j);
  std::sort(kept.begin(), kept.end());
  const std::string spec = "snapkv(window=6,budget=30,kernel=1,share=group)";
  const MatrixF out = run_estimator(spec, view);
  int64_t mismatches = 0;
  double worst = 0;
  for (int64_t i = 0; i < view.n(); ++i) {
    const std::vector<int64_t> row = with_decode_keys(kept, view, i);
    mismatches += stated_set(spec, view, i) != row;
    const RowVectorD expected = attend(view, i, row);
    worst = std::max(worst, (out.row(i).cast<double>() - expected).norm() / expected.norm());
  }
  CHECK(mismatches == 0);
  CHECK(worst < 1e-5);  // float32 attention of the same keys: observed 1.5e-7
}

TEST_CASE("expected keeps the prompt keys its Gaussian model of future queries weighs most", "[selection][expected]") {
  const HeadView whole = causal_slice(200, 12, 53);
  struct Case {
    std::string spec;
    int64_t budget, sink;
    bool cov, vnorm;
    int group;
  };
  for (const Case& c : {Case{"expected(budget=40,share=head)", 40, 4, true, true, 1},
                        Case{"expected(budget=24,sink=0,cov=0,vnorm=0,share=head)", 24, 0, false, false, 1},
                        Case{"expected(budget=30,sink=2,vnorm=0)", 30, 2, true, false, 3},
                        Case{"expected(budget=36)", 36, 4, true, true, 2}}) {
    const HeadView view = c.group > 1 ? grouped(whole, c.group, false, 16) : last_rows(whole, 16);
    INFO(c.spec);
    const std::vector<MatrixD> prompts =
        c.group > 1 ? group_queries(view, true) : std::vector<MatrixD>{view.prompt_qf.cast<double>()};
    const std::vector<int64_t> prompt = expected_prompt_set(view, prompts, c.budget, c.sink, c.cov, c.vnorm);
    const MatrixF out = run_estimator(c.spec, view);
    int64_t mismatches = 0;
    double worst = 0;
    for (int64_t i = 0; i < view.n(); ++i) {
      const std::vector<int64_t> kept = with_decode_keys(prompt, view, i);
      mismatches += stated_set(c.spec, view, i) != kept;
      const RowVectorD expected = attend(view, i, kept);
      worst = std::max(worst, (out.row(i).cast<double>() - expected).norm() / expected.norm());
    }
    CHECK(mismatches == 0);
    CHECK(worst < 1e-5);  // float32 attention of the same keys: observed 2.3e-7..3.1e-7
  }
  // A budget covering the prompt keeps every key: exact attention of the decode rows.
  const HeadView view = last_rows(whole, 16);
  const MatrixD exact = exact_attention_f64(view.q, view.k, view.v, view.scale, nullptr, view.geometry());
  const MatrixD weights = make_estimator(parse_spec("expected(budget=184)"), Device::kCpu)
                              ->weights(view, {make_random_key(1, "e", 0)})(0, view.n());
  CHECK((weights * view.v - exact).norm() / exact.norm() < 1e-12);  // observed 5.0e-16
  // What it cannot measure: no prompt rows, a prompt of its sinks only, a budget below the sinks.
  CHECK_THROWS_AS(run_estimator("expected", whole), InputError);
  CHECK_THROWS_AS(run_estimator("expected(sink=4)", last_rows(whole, 195)), InputError);
  CHECK_THROWS_AS(parse_spec("expected(budget=2,sink=4)"), UsageError);
}

TEST_CASE("streaming(roll=0) keeps the sinks and the prompt's last keys once, and every decode key",
          "[selection][streaming]") {
  const HeadView whole = causal_slice(150, 8, 59);
  const HeadView view = last_rows(whole, 20);  // P = 130
  for (const auto& [sink, window] : std::vector<std::pair<int64_t, int64_t>>{{4, 16}, {0, 8}, {8, 200}}) {
    const std::string spec = fmt::format("streaming(sink={},window={},roll=0)", sink, window);
    INFO(spec);
    int64_t mismatches = 0;
    for (int64_t i = 0; i < view.n(); ++i) {
      std::vector<int64_t> kept;
      for (int64_t j = 0; j <= view.position(i); ++j)
        if (j < sink || (j >= 130 - window && j < 130) || j >= 130) kept.push_back(j);
      mismatches += stated_set(spec, view, i) != kept;
    }
    CHECK(mismatches == 0);
  }
  // Rows with no prompt before them: a usage error naming --queries last:W.
  CHECK_THROWS_AS(run_estimator("streaming(roll=0)", whole), UsageError);
}

TEST_CASE("a sweep gives share=group settings the rows of every head of the kv group", "[selection][share][cli]") {
  // Two query heads per kv head: the runner's head 2 (kv head 1) must choose with heads 2 and 3.
  const std::string csv = temp_path("group-share.csv");
  const Dump opened = Dump::open(sweep_gqa_layer("group-share.h5", "topk(k=6,share=group,agg=logit)", csv));
  const HeadView two = opened.read_slice(0, 2, 0, 96), three = opened.read_slice(0, 3, 0, 96);
  HeadView whole = two;
  whole.mask = Mask::kCausal;
  whole.group = prefix_group({nullptr, &three.qf}, 0, 96);
  const HeadView view = last_rows(whole, 4);
  const std::vector<double> expected = selection_metrics(
      view, make_estimator(parse_spec("topk(k=6,share=group,agg=logit)"), Device::kCpu)->kept_keys(view, {}),
      parse_metrics("mass_recall"));
  const auto written = values_by_head(csv, "mass_recall");
  REQUIRE(written.size() == 4);
  CHECK(written.at(2) == Approx(expected[0]).epsilon(1e-12));  // observed: equal (the CSV's 17 digits)
  // The same sweep on heads that each have their own kv head: share=group is share=head, value for value.
  const std::string mha = write_synth("group-share-mha.h5", synth_options(1, 2, 1, 96, 16));
  const std::string a = temp_path("mha-head.csv"), b = temp_path("mha-group.csv");
  REQUIRE(run_attnprobe("sweep " + mha +
                        " -e 'topk(k=6)' --mask causal --queries last:4 --metrics selection "
                        "--overwrite -q -o " +
                        a)
              .exit_code == 0);
  REQUIRE(run_attnprobe("sweep " + mha +
                        " -e 'topk(k=6,share=group)' --mask causal --queries last:4 --metrics "
                        "selection --overwrite -q -o " +
                        b)
              .exit_code == 0);
  for (const std::string metric : {"mass_recall", "tail_pred", "keys_attended"}) {
    INFO(metric);
    CHECK(values_by_head(a, metric) == values_by_head(b, metric));
  }
}

TEST_CASE("duo reads DuoAttention's pattern: retrieval heads are exact, streaming heads stream", "[selection][duo]") {
  SynthOptions gqa = synth_options(1, 4, 1, 96, 16);
  gqa.kv_heads = 2;
  const std::string dump = write_synth("duo.h5", gqa);
  // kv head 0 retrieves (α 0.9), kv head 1 streams (α 0.1, and a value above 1 is clipped on a second layer line).
  const std::string pattern = write_pattern("duo.tsv", "0.9\t0.1\n1.7\t-3\n");
  auto sweep = [&](const std::string& spec, const std::string& name) {
    const std::string csv = temp_path(name);
    const auto run = run_attnprobe("sweep " + dump + " -e '" + spec + "' --mask causal --queries last:8 " +
                                   "--metrics spec_rel,density --overwrite -q -o " + csv);
    INFO(run.output);
    REQUIRE(run.exit_code == 0);
    return csv;
  };
  const std::string labelled = sweep("duo(sink=2,window=8,pattern=" + pattern + ")", "duo.csv");
  const std::string streaming = sweep("streaming(sink=2,window=8)", "duo-streaming.csv");
  const auto error = values_by_head(labelled, "spec_rel"), density = values_by_head(labelled, "density");
  const auto streamed = values_by_head(streaming, "spec_rel");
  REQUIRE(error.size() == 4);
  for (int head : {0, 1}) {
    CHECK(error.at(head) < 1e-5);    // exact attention in float32: observed 1.5e-7, 2.5e-7
    CHECK(density.at(head) == 1.0);  // every visible key
  }
  for (int head : {2, 3}) CHECK(error.at(head) == streamed.at(head));  // the same rows, the same numbers
  // kvpress's fraction: streaming the lowest half of the 4 pairs is kv head 1 on layer 0 (and kv 1 on layer 1).
  const auto half =
      values_by_head(sweep("duo(sink=2,window=8,pattern=" + pattern + ",fraction=0.5)", "duo-f.csv"), "spec_rel");
  CHECK(half == error);
  // No pattern: every head streams, bit for bit streaming's numbers.
  CHECK(values_by_head(sweep("duo(sink=2,window=8)", "duo-none.csv"), "spec_rel") == streamed);
}

TEST_CASE("duo(mix=1) is the blend alpha*exact + (1 - alpha)*streaming(window - 1)", "[selection][duo]") {
  const std::string pattern = write_pattern("duo-mix.tsv", "0.3\n");
  HeadView view = last_rows(causal_slice(120, 12, 61), 10);
  REQUIRE(view.id.n > 0);
  const MatrixD exact = exact_attention_f64(view.q, view.k, view.v, view.scale, nullptr, view.geometry());
  const MatrixF out = run_estimator("duo(sink=3,window=9,pattern=" + pattern + ",mix=1)", view);
  double worst = 0;
  for (int64_t i = 0; i < view.n(); ++i) {
    std::vector<int64_t> window;
    for (int64_t j = 0; j <= view.position(i); ++j)
      if (j < 3 || j > view.position(i) - 8) window.push_back(j);
    const RowVectorD expected = 0.3 * exact.row(i) + 0.7 * attend(view, i, window);
    worst = std::max(worst, (out.row(i).cast<double>() - expected).norm() / expected.norm());
  }
  CHECK(worst < 1e-5);  // float32 softmax over log-weights: observed 2.2e-7
  // The pattern labels heads by layer and kv head: a slice without them (Python's arrays) is refused.
  view.id = SliceId{};
  CHECK_THROWS_AS(run_estimator("duo(pattern=" + pattern + ")", view), InputError);
}

TEST_CASE("duo refuses pattern files it cannot read, naming the line", "[selection][duo]") {
  CHECK(read_duo_pattern(write_pattern("duo-ok.tsv", "0.5\t2\r\n-1\t0.25\n")) ==
        std::vector<std::vector<double>>{{0.5, 1.0}, {0.0, 0.25}});
  for (const auto& [text, says] :
       std::vector<std::pair<std::string, std::string>>{{"", "is empty"},
                                                        {"0.5\t0.5\n0.5\n", "line 2 has 1 values"},
                                                        {"0.5\tnan\n", "not a finite number"},
                                                        {"0.5\tx\n", "not a finite number"},
                                                        {"0.5\n\n0.5\n", "line 2 is empty"}}) {
    INFO(says);
    CHECK_THROWS_WITH(read_duo_pattern(write_pattern("duo-bad.tsv", text)), Catch::Contains(says));
  }
  CHECK_THROWS_WITH(read_duo_pattern(temp_path("no-such-pattern.tsv")), Catch::Contains("cannot open"));
  CHECK_THROWS_AS(parse_spec("duo(pattern=a file.tsv)"), UsageError);
  CHECK_THROWS_AS(parse_spec("duo(mix=1,window=1)"), UsageError);
  // A pattern of another model: exit 3 naming the layers and kv heads it labels.
  const std::string dump = write_synth("duo-two.h5", synth_options(1, 2, 1, 64, 8));
  const auto run = run_attnprobe("eval " + dump + " -e 'duo(pattern=" + write_pattern("duo-one.tsv", "0.9\n") +
                                 ")' --mask causal --queries last:4 -q");
  CHECK(run.exit_code == 3);
  CHECK_THAT(run.output, Catch::Contains("labels 1 layers of 1 kv heads"));
}

namespace {

// Each head of a grouped view as a view of its own (its query rows and prompt rows; its keys), in head order: the
// heads of the view's kv group, or with `layer` every head of the group (a layer's, whose other kv heads bring their
// keys).
std::vector<HeadView> member_views(const HeadView& view, bool layer = false) {
  std::vector<HeadView> heads;
  for (int m = 0; m < view.group->size(); ++m) {
    const bool own_keys = view.group->keys.empty() || !view.group->keys[m];
    if (m == view.group->member) heads.push_back(view);
    if (m == view.group->member || (!own_keys && !layer)) continue;
    HeadView head = view;
    head.qf = view.group->rows[m];
    head.prompt_qf = view.group->prompt[m];
    if (!own_keys) head.kf = *view.group->keys[m];
    head.group = nullptr;
    heads.push_back(head);
  }
  return heads;
}

// The heads' aggregate (mean or max) of their weights over `cache` for row t.
std::vector<double> group_weights(const std::vector<HeadView>& heads, int64_t t, const std::vector<int64_t>& cache,
                                  bool max) {
  std::vector<double> out(cache.size(), max ? -INFINITY : 0.0);
  for (const HeadView& head : heads) {
    const std::vector<double> w = softmax_over(head, t, cache);
    for (size_t r = 0; r < w.size(); ++r)
      out[r] = max ? std::max(out[r], w[r]) : out[r] + w[r] / static_cast<double>(heads.size());
  }
  return out;
}

// H2O with one cache per kv group, stepped literally: the prompt's column sums aggregated over the heads (mean, or
// the max of each head's sums), each step's aggregated weights added; evict to heavy + window − 1 keeping the
// window − 1 newest.
std::vector<std::vector<int64_t>> h2o_group_port(const HeadView& view, int64_t heavy, int64_t window, bool max) {
  const std::vector<HeadView> heads = member_views(view);
  const int64_t P = view.first_position;
  std::vector<int64_t> cache(P);
  std::iota(cache.begin(), cache.end(), 0);
  std::vector<double> acc(P, max ? -INFINITY : 0.0);
  for (const HeadView& head : heads) {
    std::vector<double> sums(P, 0.0);
    for (int64_t i = 0; i < P; ++i) {
      const std::vector<int64_t> seen(cache.begin(), cache.begin() + i + 1);
      const std::vector<double> w = softmax_over(head, i, seen);
      for (int64_t j = 0; j <= i; ++j) sums[j] += w[j];
    }
    for (int64_t j = 0; j < P; ++j) acc[j] = max ? std::max(acc[j], sums[j]) : acc[j] + sums[j] / heads.size();
  }
  auto evict = [&] {
    const int64_t size = static_cast<int64_t>(cache.size()), recent = window - 1;
    if (size <= heavy + recent) return;
    std::vector<size_t> keep = topk_sorted(std::vector<double>(acc.begin(), acc.end() - recent), heavy);
    for (int64_t r = size - recent; r < size; ++r) keep.push_back(static_cast<size_t>(r));
    std::vector<int64_t> kept;
    std::vector<double> scores;
    for (size_t r : keep) kept.push_back(cache[r]), scores.push_back(acc[r]);
    cache = kept;
    acc = scores;
  };
  if (P > 0) evict();
  std::vector<std::vector<int64_t>> sets;
  for (int64_t t = P; t < view.keys(); ++t) {
    cache.push_back(t);
    acc.push_back(0.0);
    sets.push_back(cache);
    const std::vector<double> w = group_weights(heads, t, cache, max);
    for (size_t r = 0; r < w.size(); ++r) acc[r] += w[r];
    evict();
  }
  return sets;
}

// TOVA with one cache per kv group (or per layer: TOVACache's, every head over its own kv head's keys): the mean over
// the heads of the current row's weights, top-k then sort.
std::vector<std::vector<int64_t>> tova_group_port(const HeadView& view, int64_t budget, bool layer = false) {
  const std::vector<HeadView> heads = member_views(view, layer);
  const int64_t P = view.first_position;
  std::vector<int64_t> cache(P);
  std::iota(cache.begin(), cache.end(), 0);
  auto reduce = [&](const std::vector<double>& scores) {
    if (static_cast<int64_t>(cache.size()) <= budget) return;
    std::vector<int64_t> kept;
    for (size_t r : topk_sorted(scores, budget)) kept.push_back(cache[r]);
    cache = kept;
  };
  if (P > 0) reduce(group_weights(heads, P - 1, cache, false));
  std::vector<std::vector<int64_t>> sets;
  for (int64_t t = P; t < view.keys(); ++t) {
    cache.push_back(t);
    sets.push_back(cache);
    reduce(group_weights(heads, t, cache, false));
  }
  return sets;
}

}  // namespace

TEST_CASE("h2o and tova with one cache per kv group keep the sets of a literal group port", "[selection][share]") {
  const HeadView whole = causal_slice(180, 12, 67);
  for (const int64_t rows : {int64_t{40}, int64_t{180}}) {  // a prompt of 140, and none (every row a step)
    const HeadView view = grouped(whole, 3, false, rows);
    struct Case {
      std::string spec;
      std::vector<std::vector<int64_t>> sets;
    };
    for (const Case& c : {Case{"h2o(heavy=12,window=9,share=group)", h2o_group_port(view, 12, 9, false)},
                          Case{"h2o(heavy=10,window=5,share=group,agg=max)", h2o_group_port(view, 10, 5, true)},
                          Case{"tova(budget=24,heads=group)", tova_group_port(view, 24)}}) {
      INFO(c.spec << ", the last " << rows << " rows");
      int64_t mismatches = 0, differ_from_head = 0;
      const std::string head = c.spec.substr(0, 4) == "tova"
                                   ? "tova(budget=24,heads=head)"
                                   : std::regex_replace(c.spec, std::regex(",share=group.*\\)"), ")");
      for (int64_t i = 0; i < view.n(); ++i) {
        mismatches += stated_set(c.spec, view, i) != c.sets[i];
        differ_from_head += stated_set(head, view, i) != c.sets[i];
      }
      CHECK(mismatches == 0);
      // A group's cache is not its head's: with every row a step, observed 157 (h2o mean), 164 (h2o max) and 154
      // (tova) rows of 180 differ; after a prompt of 140, 40 of 40 for the means, 0 for h2o's max (the heavy hitters
      // of 140 prompt rows are the same keys for the head and its group's max).
      if (rows == 180) CHECK(differ_from_head > 100);
    }
  }
}

namespace {

// Head `own` of a layer of 4 query heads over 2 kv heads around `base`, whose keys are head own's kv head's: the other
// heads' query rows are `base`'s mixed with their own noise; the other kv head's keys are another slice's.
HeadView layered(const HeadView& base, int own, int64_t last) {
  constexpr int kHeads = 4, kPerKv = 2;
  const HeadView other_kv = synth_slice(base.keys(), static_cast<int>(base.p()), 0.3, 200);
  std::vector<MatrixF> rows(kHeads);
  std::vector<const MatrixF*> members(kHeads, nullptr), keys(kHeads, nullptr);
  for (int m = 0; m < kHeads; ++m) {
    if (m == own) continue;
    rows[m] = 0.6f * base.qf + 0.8f * synth_slice(base.keys(), static_cast<int>(base.p()), 0.3, 100 + m).qf;
    members[m] = &rows[m];
    if (m / kPerKv != own / kPerKv) keys[m] = &other_kv.kf;
  }
  HeadView whole = base;
  whole.group = prefix_group(members, own, base.keys(), keys);
  return last > 0 ? last_rows(whole, last) : whole;
}

}  // namespace

TEST_CASE("tova(heads=layer) keeps one cache for the layer, scored by every head over its own kv head's keys",
          "[selection][share]") {
  const HeadView whole = causal_slice(180, 12, 67);
  for (const int own : {0, 3})                                // the view: the first head, or the last of kv head 1
    for (const int64_t rows : {int64_t{40}, int64_t{180}}) {  // a prompt of 140, and none (every row a step)
      INFO("head " << own << ", the last " << rows << " rows");
      const HeadView view = layered(whole, own, rows);
      const std::vector<std::vector<int64_t>> layer = tova_group_port(view, 24, true),
                                              group = tova_group_port(view, 24);
      int64_t layer_mismatches = 0, group_mismatches = 0, layer_not_group = 0;
      for (int64_t i = 0; i < view.n(); ++i) {
        const std::vector<int64_t> got = stated_set("tova(budget=24)", view, i);  // heads=layer, the default
        layer_mismatches += got != layer[i];
        group_mismatches += stated_set("tova(budget=24,heads=group)", view, i) != group[i];
        layer_not_group += got != group[i];
      }
      CHECK(layer_mismatches == 0);
      CHECK(group_mismatches == 0);  // a layer's group serves share=group with its kv group's heads
      // The other kv head's weights move the cache: observed 154 (head 0) and 155 (head 3) of 180 rows differ with
      // every row a step, 40 of 40 after the prompt.
      CHECK(layer_not_group > rows / 2);
    }
  // Rounded below float32 (--precision bf16), the other kv head's keys are rounded with the view's, one copy for
  // the kv head as before.
  const HeadView view = layered(whole, 3, 40);
  const HeadView rounded = rounded_view(view, Precision::kBf16);
  REQUIRE(rounded.group->keys[0]);
  CHECK(*rounded.group->keys[0] != *view.group->keys[0]);
  CHECK(rounded.group->keys[0] == rounded.group->keys[1]);  // one copy per kv head, shared as before
}

namespace {

// Head 1 of a layer of 4 query heads over 2 kv heads, its own slice `base`, the other heads' query rows `rows` (index
// 1 unused) and the other kv head's keys `other_keys`, cut to its last `last` rows (0: whole).
HeadView layer_of(const HeadView& base, const std::vector<MatrixF>& rows, const MatrixF& other_keys, int64_t last) {
  std::vector<const MatrixF*> members = {&rows[0], nullptr, &rows[2], &rows[3]};
  std::vector<const MatrixF*> keys = {nullptr, nullptr, &other_keys, &other_keys};
  HeadView whole = base;
  whole.group = prefix_group(members, 1, base.keys(), keys);
  return last > 0 ? last_rows(whole, last) : whole;
}

}  // namespace

TEST_CASE("shared kept sets read no later token of any head of their kv group or layer", "[selection][share][leak]") {
  // The conformance leak harness runs views without a group. Here every variant whose kept sets a kv group or the
  // layer share (Capabilities::shared_by) runs as head 1 of a 4-head, 2-kv-head layer, and the tokens from position j
  // on are replaced in every head's queries and in both kv heads' keys (and the view's values): the rows before j
  // must keep their bits. Causal forms over the whole slice; the methods that compress a prompt or replay a cache
  // over 48 decode rows after a prompt of 112.
  constexpr int64_t n = 160, kDecodeRows = 48;
  HeadView base = causal_slice(n, 8, 31);
  base.rope_inv_freq = std::make_shared<const std::vector<double>>(std::vector<double>{1.0, 0.1, 0.01, 0.001});
  const MatrixF other_keys = causal_slice(n, 8, 32).kf;
  std::vector<MatrixF> rows(4);
  for (const int m : {0, 2, 3}) rows[m] = 0.6f * base.qf + 0.8f * causal_slice(n, 8, 40 + m).qf;
  int64_t settings = 0;
  for (const EstimatorDef* def : registered_estimators())
    for (const std::string& spec : variants(*def)) {
      const Capabilities can = parse_spec(spec).capabilities();
      if (can.shared_by == SharedBy::kHead) continue;
      const bool whole = can.forms.has(Mask::kCausal);
      if (!whole && !(can.prompt && can.decode.has(Mask::kCausal))) continue;
      ++settings;
      const int64_t last = whole ? 0 : kDecodeRows, first_position = n - (whole ? n : kDecodeRows);
      const HeadView view = layer_of(base, rows, other_keys, last);
      const MatrixF out = run_estimator(spec, view);
      for (const int64_t j : whole ? std::vector<int64_t>{40, 101} : std::vector<int64_t>{125, 150}) {
        INFO(spec << ", tokens from " << j << " replaced");
        std::vector<MatrixF> changed_rows = rows;
        MatrixF changed_keys = other_keys;
        const HeadView noise = causal_slice(n, 8, 77 + j);
        for (const int m : {0, 2, 3}) changed_rows[m].bottomRows(n - j) = -1.5f * noise.qf.bottomRows(n - j);
        changed_keys.bottomRows(n - j) = 2.0f * noise.kf.bottomRows(n - j);
        const HeadView changed = layer_of(with_tokens_replaced(base, j, 91 + j), changed_rows, changed_keys, last);
        const MatrixF moved = run_estimator(spec, changed);
        CHECK(rows_identical(out, moved, j - first_position));
        CHECK_FALSE(rows_identical(out, moved, out.rows()));  // the replaced tokens reach the later rows
      }
    }
  CHECK(settings >= 20);  // observed 24: causal forms, and those that compress a prompt or replay a cache
}

TEST_CASE("a sweep gives tova(heads=layer) every head of the layer and the keys of every kv head",
          "[selection][share][cli]") {
  const std::string csv = temp_path("layer-share.csv");
  const Dump opened = Dump::open(sweep_gqa_layer("layer-share.h5", "tova(budget=20)", csv));
  std::vector<HeadView> heads;
  for (int h = 0; h < 4; ++h) heads.push_back(opened.read_slice(0, h, 0, 96));
  const auto written = values_by_head(csv, "mass_recall");  // heads=layer, the default
  REQUIRE(written.size() == 4);
  for (const int own : {1, 2}) {
    INFO("head " << own);
    HeadView whole = heads[own];
    whole.mask = Mask::kCausal;
    std::vector<const MatrixF*> rows, keys;
    for (int m = 0; m < 4; ++m) {
      rows.push_back(m == own ? nullptr : &heads[m].qf);
      keys.push_back(m / 2 == own / 2 ? nullptr : &heads[m].kf);
    }
    whole.group = prefix_group(rows, own, 96, keys);
    const HeadView view = last_rows(whole, 4);
    const std::vector<double> expected =
        selection_metrics(view, make_estimator(parse_spec("tova(budget=20)"), Device::kCpu)->kept_keys(view, {}),
                          parse_metrics("mass_recall"));
    CHECK(written.at(own) == Approx(expected[0]).epsilon(1e-12));  // observed: equal (the CSV's 17 digits)
  }
  // One kv head: the layer is the kv group, value for value.
  SynthOptions mqa = synth_options(1, 3, 1, 96, 16);
  mqa.kv_heads = 1;
  const std::string one = write_synth("layer-share-mqa.h5", mqa);
  const std::string a = temp_path("mqa-layer.csv"), b = temp_path("mqa-group.csv");
  for (const auto& [spec, out] : {std::pair{"tova(budget=20)", a}, std::pair{"tova(budget=20,heads=group)", b}})
    REQUIRE(run_attnprobe("sweep " + one + " -e '" + spec +
                          "' --mask causal --queries last:4 --metrics selection --overwrite -q -o " + out)
                .exit_code == 0);
  for (const std::string metric : {"mass_recall", "tail_pred", "kept_overlap"}) {
    INFO(metric);
    CHECK(values_by_head(a, metric) == values_by_head(b, metric));
  }
}

TEST_CASE("expected(stats=rope) un-rotates the prompt's queries and averages the rotation over future positions",
          "[selection][expected]") {
  // The spec's R_τ is Hugging Face's rotation: q·cos + rotate_half(q)·sin, rotate_half(x) = (−x₂, x₁).
  const std::vector<double> theta = {1.0, 0.3, 0.1, 0.03, 0.01, 0.003};  // p = 12
  const RowVectorD x = synth_slice(1, 12, 1.0, 5).q.row(0);
  const double tau = 37;
  RowVectorD hf(12);
  for (int f = 0; f < 6; ++f) {
    hf(f) = x(f) * std::cos(tau * theta[f]) - x(f + 6) * std::sin(tau * theta[f]);
    hf(f + 6) = x(f + 6) * std::cos(tau * theta[f]) + x(f) * std::sin(tau * theta[f]);
  }
  CHECK((rope_matrix(theta, tau) * x.transpose() - hf.transpose()).norm() < 1e-14);  // observed 2e-16

  HeadView whole = causal_slice(200, 12, 53);
  whole.rope_inv_freq = std::make_shared<const std::vector<double>>(theta);
  struct Case {
    std::string spec;
    int64_t budget, sink, future;
    bool cov, vnorm;
    int group;
  };
  for (const Case& c :
       {Case{"expected(budget=40,stats=rope,share=head)", 40, 4, 512, true, true, 1},
        Case{"expected(budget=24,sink=0,future=7,cov=0,vnorm=0,stats=rope,share=head)", 24, 0, 7, false, false, 1},
        Case{"expected(budget=30,sink=2,future=64,stats=rope)", 30, 2, 64, true, true, 3}}) {
    INFO(c.spec);
    HeadView view = c.group > 1 ? grouped(whole, c.group, false, 16) : last_rows(whole, 16);
    const std::vector<MatrixD> prompts =
        c.group > 1 ? group_queries(view, true) : std::vector<MatrixD>{view.prompt_qf.cast<double>()};
    const RopeStats rope{theta, c.future};
    const std::vector<int64_t> prompt = expected_prompt_set(view, prompts, c.budget, c.sink, c.cov, c.vnorm, &rope);
    const std::vector<int64_t> post = expected_prompt_set(view, prompts, c.budget, c.sink, c.cov, c.vnorm);
    int64_t mismatches = 0;
    for (int64_t i = 0; i < view.n(); ++i)
      mismatches += stated_set(c.spec, view, i) != with_decode_keys(prompt, view, i);
    CHECK(mismatches == 0);
    // The rotation moves the choice: observed 17, 10 and 16 of the kept prompt keys differ from stats=post's.
    std::vector<int64_t> moved;
    std::set_difference(prompt.begin(), prompt.end(), post.begin(), post.end(), std::back_inserter(moved));
    CHECK(moved.size() >= 5);
  }
  // Frequencies of 0 rotate nothing: stats=rope is stats=post, set for set.
  HeadView still = last_rows(whole, 16);
  still.rope_inv_freq = std::make_shared<const std::vector<double>>(6, 0.0);
  for (int64_t i = 0; i < still.n(); ++i)
    CHECK(stated_set("expected(budget=40,stats=rope)", still, i) == stated_set("expected(budget=40)", still, i));
  // No frequencies, or as many as another head dim needs: it says what to add.
  CHECK_THROWS_WITH(run_estimator("expected(stats=rope)", last_rows(causal_slice(200, 12, 53), 16)),
                    Catch::Contains("rope_inv_freq"));
  HeadView wrong = last_rows(whole, 16);
  wrong.rope_inv_freq = std::make_shared<const std::vector<double>>(4, 0.1);
  CHECK_THROWS_AS(run_estimator("expected(stats=rope)", wrong), InputError);
}

namespace {

// One causal layer of 2 query heads over 1 kv head, 120 tokens of p = 8, with `extra` arrays and root attributes.
std::string rope_dump(const std::string& name, const std::map<std::string, DumpArray>& extra,
                      const std::map<std::string, std::string>& attributes) {
  auto rows_of = [](const MatrixD& m) {
    std::vector<double> values;
    for (int64_t i = 0; i < m.rows(); ++i)
      for (int64_t j = 0; j < m.cols(); ++j) values.push_back(m(i, j));
    return values;
  };
  const HeadView a = synth_slice(120, 8, 0.3, 71), b = synth_slice(120, 8, 0.3, 72);
  DumpLayer l;
  l.name = "layer_00";
  l.causal = 1;
  MatrixD q(240, 8);
  q << a.q, b.q;
  l.datasets = {{"q", DumpArray{{1, 2, 120, 8}, rows_of(q)}},
                {"k", DumpArray{{1, 1, 120, 8}, rows_of(a.k)}},
                {"v", DumpArray{{1, 1, 120, 8}, rows_of(a.v)}}};
  for (const auto& [member, array] : extra) l.datasets[member] = array;
  DumpContents contents;
  contents.attributes = attributes;
  contents.layers.push_back(l);
  return write_test_dump(name, contents);
}

}  // namespace

TEST_CASE("a dump's rotary frequencies reach expected(stats=rope), and malformed ones are refused",
          "[selection][dump]") {
  const DumpArray theta{{4}, {1.0, 0.1, 0.01, 0.001}};
  const std::string path = rope_dump("rope.h5", {{"rope_inv_freq", theta}}, {{"rope_layout", "half"}});
  const Dump dump = Dump::open(path);
  REQUIRE(dump.layer(0).rope_inv_freq);
  CHECK(*dump.layer(0).rope_inv_freq == theta.values);
  const std::string csv = temp_path("rope.csv");
  const auto run = run_attnprobe("sweep " + path + " -e 'expected(budget=20,stats=rope,share=head)' --queries last:8 " +
                                 "--metrics mass_recall --overwrite -q -o " + csv);
  REQUIRE(run.exit_code == 0);
  HeadView whole = dump.read_slice(0, 1, 0, 120);
  whole.mask = Mask::kCausal;
  REQUIRE(whole.rope_inv_freq);
  const HeadView view = last_rows(whole, 8);
  REQUIRE(view.rope_inv_freq);
  const std::vector<double> expected = selection_metrics(
      view, make_estimator(parse_spec("expected(budget=20,stats=rope,share=head)"), Device::kCpu)->kept_keys(view, {}),
      parse_metrics("mass_recall"));
  CHECK(values_by_head(csv, "mass_recall").at(1) == Approx(expected[0]).epsilon(1e-12));  // observed: equal
  auto refused = [](const std::string& name, const std::map<std::string, DumpArray>& extra,
                    const std::map<std::string, std::string>& attributes, const std::string& says) {
    const auto r =
        run_attnprobe("sweep " + rope_dump(name, extra, attributes) +
                      " -e 'expected(stats=rope)' --queries last:8 --overwrite -q -o " + temp_path(name + ".csv"));
    INFO(r.output);
    CHECK(r.exit_code == 3);
    CHECK_THAT(r.output, Catch::Contains(says));
  };
  refused("rope-no-layout.h5", {{"rope_inv_freq", theta}}, {}, "rope_layout is missing");
  refused("rope-interleaved.h5", {{"rope_inv_freq", theta}}, {{"rope_layout", "interleaved"}},
          "rope_layout is 'interleaved'");
  refused("rope-shape.h5", {{"rope_inv_freq", DumpArray{{8}, std::vector<double>(8, 0.1)}}}, {{"rope_layout", "half"}},
          "one inverse frequency per pair of channels [4]");
  refused("rope-nan.h5", {{"rope_inv_freq", DumpArray{{4}, {1.0, NAN, 0.01, 0.001}}}}, {{"rope_layout", "half"}},
          "rope_inv_freq[1] = nan");
  refused("rope-none.h5", {}, {}, "does not carry");
}
