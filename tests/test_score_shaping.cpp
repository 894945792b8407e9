// Score shaping (docs/dumps.md, "Score shaping"): an additive bias, ALiBi slopes and a soft-cap change the
// logits before the softmax. Exact attention in float64 and float32 against a scalar float64 loop written from
// the definition, for every mask and decode rows; the last rows alone equal the whole slice's bit for bit; dumps
// carry the shaping to the reference; estimators that cannot honour it are refused (exit 2), and a malformed
// bias, slope or cap is a clear input error (exit 3).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>

#include "attnprobe/estimators/registry.h"
#include "attnprobe/exact/exact_attention.h"
#include "attnprobe/io/dump.h"
#include "attnprobe/io/dump_writer.h"
#include "attnprobe/records/csv.h"
#include "attnprobe/rng/random_matrix.h"
#include "attnprobe/sweep/runner.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

namespace {

MatrixD gaussian(int64_t rows, int64_t cols, uint32_t tag) {
  return normal_rows(RandomStream(make_random_key(43, "score-shaping", tag), Purpose::kGeneric), rows, cols);
}

// The definition, one row at a time: logit_ij = S_ij with S = s·q_i·k_j, then (cap c > 0) c·tanh(S/c) + b_ij, or
// c·tanh((S + b_ij)/c) when the bias comes first, where b_ij = bias_ij + m·(j − t_i); softmax over keys lo..hi−1.
MatrixD naive_shaped(const MatrixD& q, const MatrixD& k, const MatrixD& v, double scale, int64_t first_position,
                     Mask mask, int64_t window, const MatrixD* bias, double slope, double cap, bool bias_first) {
  MatrixD out = MatrixD::Zero(q.rows(), v.cols());
  for (int64_t i = 0; i < q.rows(); ++i) {
    const int64_t t = first_position + i;
    const int64_t hi = mask == Mask::kFull ? k.rows() : t + 1;
    const int64_t lo = mask == Mask::kWindow ? std::max<int64_t>(0, t - window + 1) : 0;
    std::vector<double> logits;
    double top = -INFINITY;
    for (int64_t j = lo; j < hi; ++j) {
      const double s = scale * q.row(i).dot(k.row(j));
      const double b = (bias ? (*bias)(i, j) : 0.0) + slope * static_cast<double>(j - t);
      double logit = s + b;
      if (cap > 0) logit = bias_first ? cap * std::tanh((s + b) / cap) : cap * std::tanh(s / cap) + b;
      logits.push_back(logit);
      top = std::max(top, logit);
    }
    double total = 0;
    for (double l : logits) total += std::exp(l - top);
    for (int64_t j = lo; j < hi; ++j) out.row(i) += std::exp(logits[j - lo] - top) / total * v.row(j);
  }
  return out;
}

double relative(const MatrixD& a, const MatrixD& b) { return (a - b).norm() / b.norm(); }

struct ShapingCase {
  bool bias = false;
  double slope = 0, cap = 0;
  bool bias_first = false;
};

}  // namespace

TEST_CASE("exact attention with a bias, ALiBi and a soft-cap matches the definition", "[shaping][exact]") {
  double worst64 = 0, worst32 = 0;
  const std::vector<ShapingCase> cases = {{true, 0, 0, false},       {false, 0.25, 0, false},
                                          {false, 0, 2.0, false},    {true, 0.0625, 1.5, false},
                                          {true, 0.0625, 1.5, true}, {false, -0.125, 50, false}};
  for (const int64_t keys : {97, 1025})
    for (const int p : {50, 64})
      for (const int64_t rows : {int64_t{1}, int64_t{7}, keys})
        for (const ShapingCase& c : cases)
          for (const auto& [mask, window] :
               std::vector<std::pair<Mask, int64_t>>{{Mask::kFull, 0}, {Mask::kCausal, 0}, {Mask::kWindow, 33}}) {
            INFO("keys " << keys << " p " << p << " rows " << rows << " " << mask_text(mask, window) << " bias "
                         << c.bias << " slope " << c.slope << " cap " << c.cap << " bias first " << c.bias_first);
            // Logits of a few units (|S| up to ~6), so the cap at 1.5–2 bends them and ALiBi moves the weights.
            const MatrixD q = 1.5 * gaussian(rows, p, 1), k = 1.5 * gaussian(keys, p, 2), v = gaussian(keys, p, 3);
            const double scale = 1 / std::sqrt(double(p));
            const MatrixD bias = 2.0 * gaussian(rows, keys, 4);
            ScoreShaping shaping;
            if (c.bias) shaping.bias = std::make_shared<const MatrixD>(bias);
            shaping.alibi_slope = c.slope;
            shaping.softcap = c.cap;
            shaping.bias_before_softcap = c.bias_first;
            const QueryGeometry geometry{mask, window, keys - rows, nullptr};
            const MatrixD naive = naive_shaped(q, k, v, scale, keys - rows, mask, window, c.bias ? &bias : nullptr,
                                               c.slope, c.cap, c.bias_first);
            const MatrixD f64 = exact_attention_f64(q, k, v, scale, nullptr, geometry, &shaping);
            CHECK(relative(f64, naive) < 1e-12);
            worst64 = std::max(worst64, relative(f64, naive));
            MatrixF f32;
            exact_attention_f32(q.cast<float>(), k.cast<float>(), v.cast<float>(), float(scale), f32, nullptr, geometry,
                                &shaping);
            // float32 rounding of each logit is about 2^-24 of its size, and ALiBi makes them large: m·(j − t)
            // reaches 128 at m = 0.125 over 1024 keys. The bound grows with the logits' span L.
            const double span = std::fabs(c.slope) * double(keys) + (c.cap > 0 ? c.cap : 8.0) + (c.bias ? 8.0 : 0.0);
            CHECK(relative(f32.cast<double>(), naive) < 1e-6 + 1.2e-7 * span);
            worst32 = std::max(worst32, relative(f32.cast<double>(), naive) / (1e-6 + 1.2e-7 * span));
            // The weights the metrics compare with: rows of softmax over the shaped logits, summing to 1.
            const MatrixD a = attention_rows_f64(q, k, scale, 0, rows, geometry, &shaping);
            CHECK((a * v - naive).norm() / naive.norm() < 1e-12);
            // Shaping that does something: the plain softmax differs.
            CHECK(relative(exact_attention_f64(q, k, v, scale, nullptr, geometry), naive) > 1e-3);
          }
  // Observed: float64 ≤ 5.3e-15 against the loop; float32 at most 0.40 of its bound.
  WARN("largest float64 error " << worst64 << ", float32 error / bound " << worst32);
}

TEST_CASE("shaped last rows evaluated alone equal the whole slice's rows bit for bit", "[shaping][exact]") {
  const int64_t n = 700, p = 64, rows = 16;
  HeadView whole = make_head_view(SliceId{0, 0, 0, n, 0}, 0.125, gaussian(n, p, 5), gaussian(n, p, 6),
                                  gaussian(n, p, 7), Mask::kCausal);
  whole.shaping.bias = std::make_shared<const MatrixD>(gaussian(n, n, 8));
  whole.shaping.alibi_slope = 0.03;
  whole.shaping.softcap = 5;
  const HeadView last = last_rows(whole, rows);
  REQUIRE(last.shaping.bias->rows() == rows);
  CHECK(*last.shaping.bias == whole.shaping.bias->bottomRows(rows));
  MatrixF all_rows, some_rows;
  exact_attention_f32(whole.qf, whole.kf, whole.vf, float(whole.scale), all_rows, nullptr, whole.geometry(),
                      &whole.shaping);
  exact_attention_f32(last.qf, last.kf, last.vf, float(last.scale), some_rows, nullptr, last.geometry(), &last.shaping);
  CHECK(rows_identical(some_rows, all_rows.bottomRows(rows), rows));
  const MatrixD all64 =
      exact_attention_f64(whole.q, whole.k, whole.v, whole.scale, nullptr, whole.geometry(), &whole.shaping);
  const MatrixD some64 =
      exact_attention_f64(last.q, last.k, last.v, last.scale, nullptr, last.geometry(), &last.shaping);
  CHECK((some64 - all64.bottomRows(rows)).norm() < 1e-14 * all64.norm());
}

TEST_CASE("the oracle selections rank and attend by the shaped logits", "[shaping][selection]") {
  const int64_t n = 300, p = 32, rows = 9;
  HeadView whole = make_head_view(SliceId{0, 0, 0, n, 0}, 1 / std::sqrt(32.0), gaussian(n, p, 21), gaussian(n, p, 22),
                                  gaussian(n, p, 23), Mask::kCausal);
  const MatrixD bias = 2.0 * gaussian(n, n, 24);
  whole.shaping.bias = std::make_shared<const MatrixD>(bias);
  whole.shaping.alibi_slope = 0.05;
  whole.shaping.softcap = 4;
  const HeadView view = last_rows(whole, rows);
  // A budget covering every key is exact attention of the shaped logits.
  const MatrixD exact =
      exact_attention_f64(view.q, view.k, view.v, view.scale, nullptr, view.geometry(), &view.shaping);
  for (const char* spec : {"topk(k=1000)", "topp(p=1)"}) {
    const double error = relative(run_estimator(spec, view).cast<double>(), exact);
    CHECK(error < 2e-6);  // float32 rounding of logits of a few units: observed 1.6e-7 for both
    WARN(spec << " against the shaped exact attention: " << error);
  }
  // topk(k=8) keeps the 8 largest shaped logits of each row, computed here from the definition.
  const std::unique_ptr<Estimator> topk = parse_spec("topk(k=8)").make();
  const Estimator::KeptRows keep = topk->kept_keys(view, EstimateContext{});
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t t = view.position(i);
    std::vector<std::pair<double, int64_t>> logits;
    for (int64_t j = 0; j <= t; ++j) {
      const double s = view.scale * view.qf.row(i).cast<double>().dot(view.kf.row(j).cast<double>());
      logits.push_back({-(4 * std::tanh(s / 4) + bias(n - rows + i, j) + 0.05 * double(j - t)), j});
    }
    std::sort(logits.begin(), logits.end());
    std::vector<int64_t> want;
    for (int r = 0; r < 8; ++r) want.push_back(logits[r].second);
    std::sort(want.begin(), want.end());
    CHECK(keep(i).keys == want);
  }
  // A group-shared kept set scores the other heads' rows, whose shaping the view does not hold: refused.
  CHECK_FALSE(parse_spec("topk(k=8,share=group)").capabilities().shaping);
  CHECK(parse_spec("topk(k=8)").capabilities().shaping);
}

namespace {

// One layer of H = 4 query heads over Hkv = 2, B = 2, N = 40 tokens, p = 16, with the given shaping members.
struct ShapedDump {
  int64_t batch = 2, heads = 4, kv_heads = 2, n = 40, p = 16;
  MatrixD q_all, k_all, v_all;  // rows (b, h, token) stacked
  MatrixD bias;                 // [1, H, N, N] stacked as H·N rows
  std::vector<double> slopes = {0.5, 0.25, 0.125, 0.0625};

  ShapedDump()
      : q_all(gaussian(2 * 4 * 40, 16, 11)),
        k_all(gaussian(2 * 2 * 40, 16, 12)),
        v_all(gaussian(2 * 2 * 40, 16, 13)),
        bias(gaussian(4 * 40, 40, 14)) {}

  static DumpArray array(const MatrixD& m, std::vector<hsize_t> shape) {
    DumpArray a{std::move(shape), {}};
    for (int64_t i = 0; i < m.rows(); ++i)
      for (int64_t j = 0; j < m.cols(); ++j) a.values.push_back(m(i, j));
    return a;
  }
  DumpLayer layer() const {
    DumpLayer l;
    l.name = "layer_00";
    l.causal = 1;
    l.datasets = {
        {"q", array(q_all, {2, 4, 40, 16})}, {"k", array(k_all, {2, 2, 40, 16})}, {"v", array(v_all, {2, 2, 40, 16})}};
    return l;
  }
  std::string write(const std::string& name, const DumpLayer& l) const {
    DumpContents contents;
    contents.layers.push_back(l);
    return write_test_dump(name, contents);
  }
  MatrixD q(int b, int h) const { return q_all.middleRows((b * heads + h) * n, n); }
  MatrixD k(int b, int g) const { return k_all.middleRows((b * kv_heads + g) * n, n); }
  MatrixD v(int b, int g) const { return v_all.middleRows((b * kv_heads + g) * n, n); }
};

}  // namespace

TEST_CASE("a dump's bias, ALiBi slopes and soft-cap reach the reference", "[shaping][dump]") {
  const ShapedDump d;
  DumpLayer l = d.layer();
  l.datasets["bias"] = ShapedDump::array(d.bias, {1, 4, 40, 40});
  l.datasets["alibi_slopes"] = DumpArray{{4}, d.slopes};
  l.real_attributes["softcap"] = 3.0;
  const std::string path = d.write("shaped.h5", l);
  const Dump dump = Dump::open(path);
  REQUIRE(dump.layer(0).shaped());
  for (int b : {0, 1})
    for (int h : {0, 3})
      for (int64_t length : {int64_t{40}, int64_t{25}}) {
        INFO("batch " << b << " head " << h << " length " << length);
        const HeadView view = dump.read_slice(0, h, b, length);
        REQUIRE(view.shaping.bias);
        CHECK(view.shaping.bias->rows() == length);
        CHECK(view.shaping.alibi_slope == d.slopes[h]);
        CHECK(view.shaping.softcap == 3.0);
        const MatrixD bias = d.bias.middleRows(h * 40, 40).topLeftCorner(length, length);
        const MatrixD naive =
            naive_shaped(d.q(b, h).topRows(length), d.k(b, h / 2).topRows(length), d.v(b, h / 2).topRows(length), 0.25,
                         0, Mask::kCausal, 0, &bias, d.slopes[h], 3.0, false);
        // The reader's view is unmasked (the planner applies the layer's causal attribute): causal here.
        const MatrixD ref = exact_attention_f64(view.q, view.k, view.v, view.scale, nullptr,
                                                QueryGeometry{Mask::kCausal}, &view.shaping);
        CHECK(relative(ref, naive) < 1e-12);
      }
  // A sweep reads the longest prefix once and cuts the shorter ones from it (view_of_case): the cut keeps the
  // shaping of its rows and keys, and its last rows too.
  HeadView read = dump.read_slice(0, 3, 1, 40), storage;
  for (const QueryRows rows : {QueryRows{}, QueryRows{QueryRows::Kind::kLast, 5}}) {
    const HeadView& cut = view_of_case(read, SliceRef{0, 3, 1, 25, Mask::kCausal, 0, rows}, storage);
    const int64_t evaluated = rows.all() ? 25 : 5;
    const MatrixD bias = d.bias.middleRows(3 * 40, 40).block(25 - evaluated, 0, evaluated, 25);
    REQUIRE(cut.shaping.bias);
    CHECK(*cut.shaping.bias == bias);
    const MatrixD naive =
        naive_shaped(d.q(1, 3).middleRows(25 - evaluated, evaluated), d.k(1, 1).topRows(25), d.v(1, 1).topRows(25),
                     0.25, 25 - evaluated, Mask::kCausal, 0, &bias, d.slopes[3], 3.0, false);
    CHECK(relative(exact_attention_f64(cut.q, cut.k, cut.v, cut.scale, nullptr, cut.geometry(), &cut.shaping), naive) <
          1e-12);
  }
  // Through the CLI: the softmax estimator against the shaped reference sits at the float32 floor (it would be
  // ~0.3 off against the unshaped one); estimators that cannot honour the shaping are refused with the list of
  // those that can; the gradient metrics too.
  const std::string csv = temp_path("shaped.csv");
  const CommandResult eval = run_attnprobe("eval " + path + " -e softmax --metrics spec_rel -q -o " + csv);
  INFO(eval.output);
  REQUIRE(eval.exit_code == 0);
  const CommandResult refused = run_attnprobe("eval " + path + " -e performer -q -o " + temp_path("refused.csv"));
  CHECK(refused.exit_code == 2);
  CHECK_THAT(refused.output, Catch::Contains("a soft-cap of 3, ALiBi and an additive bias") &&
                                 Catch::Contains("Estimators that honour it: softmax, topk, topp"));
  const CommandResult gradients =
      run_attnprobe("eval " + path + " -e softmax --metrics grad_q_fro_rel -q -o " + temp_path("gradients.csv"));
  CHECK(gradients.exit_code == 2);
  CHECK_THAT(gradients.output, Catch::Contains("backward passes"));
}

TEST_CASE("the softmax estimator of a shaped dump sits at the float32 floor of the shaped reference",
          "[shaping][dump]") {
  const ShapedDump d;
  DumpLayer l = d.layer();
  l.datasets["alibi_slopes"] = DumpArray{{4}, d.slopes};
  const std::string path = d.write("alibi.h5", l);
  const std::string csv = temp_path("alibi.csv");
  REQUIRE(run_attnprobe("eval " + path + " -e softmax --metrics spec_rel -q -o " + csv).exit_code == 0);
  const std::vector<TrialRow> rows = read_csv(csv).trials;
  REQUIRE(rows.size() == 8);
  double worst = 0;
  for (const TrialRow& row : rows) worst = std::max(worst, row.value);
  CHECK(worst < 1e-6);  // float32 against float64 of logits of a few units: observed 1.2e-7
  WARN("largest spec_rel of softmax on the ALiBi dump " << worst);
}

TEST_CASE("malformed score shaping is a clear input error", "[shaping][dump][hostile]") {
  const ShapedDump d;
  auto refused = [&](const std::string& name, const DumpLayer& l, const std::string& says) {
    const CommandResult r = run_attnprobe("info " + d.write(name, l));
    INFO(r.output);
    CHECK(r.exit_code == 3);
    CHECK_THAT(r.output, Catch::Contains(says));
  };
  DumpLayer wrong_shape = d.layer();
  wrong_shape.datasets["bias"] = ShapedDump::array(d.bias.topRows(40), {40, 40, 1});
  refused("bias-shape.h5", wrong_shape, "must be a floating-point additive bias of shape");
  DumpLayer too_few_slopes = d.layer();
  too_few_slopes.datasets["alibi_slopes"] = DumpArray{{2}, {0.5, 0.25}};
  refused("slopes.h5", too_few_slopes, "one ALiBi slope per query head [4]");
  DumpLayer negative_cap = d.layer();
  negative_cap.real_attributes["softcap"] = -1;
  refused("cap.h5", negative_cap, "the softcap attribute is -1");
  DumpLayer nan_bias = d.layer();
  MatrixD bad = d.bias.topRows(40);
  bad(3, 5) = NAN;
  nan_bias.datasets["bias"] = ShapedDump::array(bad, {40, 40});
  refused("nan-bias.h5", nan_bias, "has a non-finite value (nan) at layer 0, head 0, batch item 0, query row 3, key 5");
}
