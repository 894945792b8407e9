// Causal forms (docs/specs.md "Masks", docs/estimators/*.md "Causal form"): the exact causal
// reference against an independent float64 loop, the causality-leak harness over every estimator
// that declares a causal form, and the statistical checks of the random causal forms.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <numbers>
#include <tuple>

#include "attnprobe/common/atomic_file.h"
#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/exact/exact_attention.h"
#include "attnprobe/records/csv.h"
#include "attnprobe/rng/random_stream.h"
#include "support.h"

namespace attnprobe {
namespace {

using test::rows_identical;
using test::run_estimator;
using test::synth_slice;
using test::with_tokens_replaced;

HeadView causal(HeadView view) {
  view.mask = Mask::kCausal;
  return view;
}

// Causal softmax attention by its definition, one scalar loop per (i, j ≤ i): the independent reference.
MatrixD naive_causal_softmax(const HeadView& view) {
  MatrixD out = MatrixD::Zero(view.n(), view.pv());
  for (int64_t i = 0; i < view.n(); ++i) {
    std::vector<double> logits(i + 1);
    double top = -INFINITY, total = 0;
    for (int64_t j = 0; j <= i; ++j) {
      logits[j] = view.scale * view.q.row(i).dot(view.k.row(j));
      top = std::max(top, logits[j]);
    }
    for (int64_t j = 0; j <= i; ++j) total += std::exp(logits[j] - top);
    for (int64_t j = 0; j <= i; ++j) out.row(i) += std::exp(logits[j] - top) / total * view.v.row(j);
  }
  return out;
}

}  // namespace

TEST_CASE("causal exact attention matches the masked softmax by its definition", "[causal][exact]") {
  for (const int64_t n : {1, 7, 150, 700}) {  // one row; within one block; across 128/512 blocks
    const HeadView view = causal(synth_slice(n, 16, 0.2, 5));
    const MatrixD naive = naive_causal_softmax(view);
    const MatrixD f64 = exact_attention_f64(view.q, view.k, view.v, view.scale, nullptr, Mask::kCausal);
    MatrixF f32;
    exact_attention_f32(view.qf, view.kf, view.vf, static_cast<float>(view.scale), f32, nullptr, Mask::kCausal);
    const double f64_error = (f64 - naive).norm() / naive.norm();
    const double f32_error = (f32.cast<double>() - naive).norm() / naive.norm();
    INFO("n " << n << " f64 " << f64_error << " f32 " << f32_error);
    CHECK(f64_error < 1e-13);  // observed < 5e-11 as Catch prints it (0.0): summation order only
    CHECK(f32_error < 2e-6);   // observed 7.0e-8, 1.0e-7, 1.4e-7 for n = 7, 150, 700 (float32 rounding)
    // Row 0 sees only key 0: its output is v_0 exactly; the last row sees every key, as full attention does.
    CHECK((f64.row(0) - view.v.row(0)).norm() < 1e-12 * view.v.row(0).norm());
    const MatrixD full = exact_attention_f64(view.q, view.k, view.v, view.scale);
    CHECK((f64.row(n - 1) - full.row(n - 1)).norm() < 1e-12 * full.row(n - 1).norm());
  }
}

TEST_CASE("causal exact attention does not depend on the thread count, bit for bit", "[causal][exact]") {
  const HeadView view = causal(synth_slice(1100, 32, 0.3, 9));
  ThreadPool one(1), two(2);
  MatrixF a, b;
  exact_attention_f32(view.qf, view.kf, view.vf, 0.17f, a, &one, Mask::kCausal);
  exact_attention_f32(view.qf, view.kf, view.vf, 0.17f, b, &two, Mask::kCausal);
  CHECK(rows_identical(a, b, a.rows()));
}

TEST_CASE("the causal attention matrix has zeros above the diagonal and unit row sums", "[causal][exact]") {
  const HeadView view = causal(synth_slice(40, 8, 0.5, 3));
  const MatrixD a = attention_rows_f64(view.q, view.k, view.scale, 5, 30, Mask::kCausal);
  for (int64_t i = 0; i < a.rows(); ++i) {
    CHECK(std::abs(a.row(i).sum() - 1.0) < 1e-14);
    CHECK(a.row(i).tail(view.n() - (5 + i + 1)).norm() == 0.0);
  }
}

// The leak harness: for every estimator with a causal form and every variant of it that has one,
// replacing the tokens from position j on (same key, same trial) leaves rows 0..j−1 of the
// estimate, and of its float64 reference where it has one, bit-identical. Several shapes (inside
// and across the kernels' 64/128/256/512-row blocks) and several j.
TEST_CASE("causal vmean is the running mean of the values", "[causal][vmean]") {
  const HeadView view = causal(synth_slice(50, 8, 0.5, 4));
  const MatrixF out = run_estimator("vmean", view);
  for (const int64_t i : {0, 1, 17, 49}) {
    const RowVectorD expected = view.v.topRows(i + 1).colwise().mean();
    CHECK((out.row(i).cast<double>() - expected).norm() <
          1e-6 * expected.norm());  // observed 0 (row 0) to 2.8e-8 relative (float32 cast)
  }
}

TEST_CASE("causal yoso-e is masked yoso-e by its definition", "[causal][yoso]") {
  const HeadView view = causal(synth_slice(90, 16, 0.3, 6));
  const int tau = 4;
  MatrixD y = MatrixD::Zero(view.n(), view.pv());
  for (int64_t i = 0; i < view.n(); ++i)
    for (int64_t j = 0; j <= i; ++j) {
      const double c = view.q.row(i).normalized().dot(view.k.row(j).normalized());
      y.row(i) += std::pow(1.0 - std::acos(std::clamp(c, -1.0, 1.0)) / std::numbers::pi, tau) * view.v.row(j);
    }
  for (int64_t i = 0; i < y.rows(); ++i) y.row(i).normalize();
  const MatrixD reference = *parse_spec("yoso-e(tau=4)").make()->reference(view, nullptr);
  const MatrixF estimate = run_estimator("yoso-e(tau=4)", view);
  CHECK((reference - y).norm() / y.norm() < 1e-13);               // observed < 5e-11 (Catch prints 0.0)
  CHECK((estimate.cast<double>() - y).norm() / y.norm() < 1e-5);  // observed 1.05e-7 (float32, fast acos 2e-8)
}

TEST_CASE("causal yoso with Gaussian hashing is unbiased for causal yoso-e before normalisation",
          "[causal][yoso][statistics]") {
  const HeadView view = causal(synth_slice(48, 8, 0.3, 12));
  const int tau = 3;
  MatrixD target = MatrixD::Zero(view.n(), view.pv());  // W·V with W_ij = 0 for j > i
  for (int64_t i = 0; i < view.n(); ++i)
    for (int64_t j = 0; j <= i; ++j) {
      const double c = view.q.row(i).normalized().dot(view.k.row(j).normalized());
      target.row(i) += std::pow(1.0 - std::acos(std::clamp(c, -1.0, 1.0)) / std::numbers::pi, tau) * view.v.row(j);
    }
  double mean_error = 0;
  const auto z = test::weighted_z_scores("yoso(m=4,tau=3,norm=none)", view, target, 1500, &mean_error);
  for (double value : z) CHECK(std::abs(value) < 4);
  // Observed: z = 0.54, 0.18, 0.17, 1.20; mean error of 1500 seeds 0.0118 (the 1/sqrt(m·seeds) noise level).
  INFO("z " << z[0] << " " << z[1] << " " << z[2] << " " << z[3] << " mean error " << mean_error);
  CHECK(mean_error < 0.06);
  // hash=hadamard under the same mask is measurably biased (as in the full case): the test has power.
  const auto z_hadamard = test::weighted_z_scores("yoso(m=4,tau=3,norm=none,hash=hadamard)", view, target, 1500);
  double worst = 0;
  for (double value : z_hadamard) worst = std::max(worst, std::abs(value));
  CHECK(worst > 4);  // observed: largest |z| 12.96
}

TEST_CASE("causal RA is unbiased for causal softmax attention", "[causal][random-features][statistics]") {
  const HeadView view = causal(synth_slice(24, 8, 0.5, 2));
  const MatrixD target = naive_causal_softmax(view);
  double mean_error = 0;
  const auto z = test::weighted_z_scores("ra(S=1,variant=unbiased,noise=scaled)", view, target, 3000, &mean_error);
  INFO("z " << z[0] << " " << z[1] << " " << z[2] << " " << z[3] << " mean error " << mean_error);
  for (double value : z) CHECK(std::abs(value) < 4);  // observed z = 0.011, 0.081, 1.08, 0.23
  const auto z_raw = test::weighted_z_scores("ra(S=1,variant=unbiased,noise=raw)", view, target, 3000);
  double worst = 0;
  for (double value : z_raw) worst = std::max(worst, std::abs(value));
  CHECK(worst > 4);  // noise=raw stays biased under the mask (observed largest |z| 8.94): the test has power
}

TEST_CASE("causal performer's row i is the full performer of the prefix 0..i with the same draws",
          "[causal][random-features]") {
  // ω is drawn from the key alone (not from n), so the causal prefix sums must reproduce the full
  // estimator run on each prefix. The full form is float32 (blocked, per-feature shifts), the causal
  // form float64 then rounded: they agree to float32 accumulation. Observed: 2.1e-7 (M=32), 1.9e-7
  // (M=48, ortho=0) of the row norm.
  const HeadView view = causal(synth_slice(300, 16, 0.3, 14));
  for (const std::string spec : {"performer(M=32)", "performer(M=48,ortho=0)"}) {
    const MatrixF causal_out = run_estimator(spec, view, 2);
    double worst = 0;
    for (const int64_t i : {0, 1, 63, 256, 299}) {
      const HeadView prefix =
          make_head_view(view.id, view.scale, view.q.topRows(i + 1), view.k.topRows(i + 1), view.v.topRows(i + 1));
      const MatrixF full = run_estimator(spec, prefix, 2);
      worst = std::max(worst, static_cast<double>((full.row(i) - causal_out.row(i)).norm() / full.row(i).norm()));
    }
    INFO(spec << " worst row gap " << worst);
    CHECK(worst < 1e-5);
  }
  // Large logits (row norms ~30 at s = 1/4): the running shifts keep every prefix finite.
  HeadView peaked = causal(synth_slice(200, 8, 0.3, 15));
  peaked = make_head_view(peaked.id, peaked.scale, 30.0 * peaked.q, 30.0 * peaked.k, peaked.v, Mask::kCausal);
  CHECK(run_estimator("performer", peaked).allFinite());
}

TEST_CASE("an estimator without a causal form is refused under a causal mask, naming those with one",
          "[causal][registry]") {
  try {
    require_mask_support(parse_spec("linformer"), Mask::kCausal);
    FAIL("linformer accepted a causal mask");
  } catch (const UsageError& e) {
    const std::string message = e.what();
    CHECK(message.find("linformer") != std::string::npos);
    CHECK(message.find("yoso-e") != std::string::npos);
    CHECK(message.find("--mask full") != std::string::npos);
  }
  CHECK_THROWS_AS(require_mask_support(parse_spec("yoso(input=lift)"), Mask::kCausal), UsageError);
  CHECK_NOTHROW(require_mask_support(parse_spec("yoso"), Mask::kCausal));
  CHECK_NOTHROW(require_mask_support(parse_spec("linformer"), Mask::kFull));
  // On a device, only the versions registered with their causal form.
  CHECK_FALSE(causal_on(parse_spec("yoso-e(input=lift)"), Device::kCuda));
  CHECK(causal_devices_of(*find_estimator("linformer")).empty());
  CHECK(causal_devices_of(*find_estimator("ra")) == std::vector<Device>{Device::kCpu});
  // Device versions and their forms are declared with the CPU version, so every build knows them.
  CHECK(causal_devices_of(*find_estimator("vmean")) == std::vector<Device>{Device::kCpu, Device::kCuda});
  CHECK_NOTHROW(require_mask_support(parse_spec("softmax"), Mask::kCausal, Device::kCuda));
  CHECK_NOTHROW(require_mask_support(parse_spec("vmean"), Mask::kCausal, Device::kCuda));
  try {
    require_mask_support(parse_spec("yoso"), Mask::kCausal, Device::kCuda);
    FAIL("yoso's CUDA version accepted a causal mask");
  } catch (const UsageError& e) {
    CHECK(std::string(e.what()).find("no causal form on cuda") != std::string::npos);
    CHECK(std::string(e.what()).find(join(causal_estimators(Device::kCuda), ", ")) != std::string::npos);
    CHECK(std::string(e.what()).find("--device cpu") != std::string::npos);
  }
  if (!device_compiled(Device::kCuda))  // without the backend, make_estimator refuses ("no cuda backend")
    CHECK_THROWS_WITH(make_estimator(parse_spec("softmax"), Device::kCuda), Catch::Contains("no cuda backend"));
}

TEST_CASE("sweep --mask: auto follows the dump's attribute, the CSV says the mask, old CSVs read as full",
          "[causal][cli]") {
  DumpContents contents = make_synthetic_dump(test::synth_options(2, 1, 1, 64, 8));
  contents.layers[0].causal = 1;  // layer 0 causal, layer 1 without the attribute (full)
  const std::string dump = test::temp_path("causal_attr.h5");
  write_dump(dump, contents, DumpWriteOptions{});
  const std::string csv = test::temp_path("causal_auto.csv");
  const auto run = test::run_attnprobe(fmt::format(
      "sweep {} -e softmax -e vmean -e yoso-e -e 'yoso(m=8)' -e ra --trials 2 -q --overwrite -o {}", dump, csv));
  REQUIRE(run.exit_code == 0);
  const CsvContents rows = read_csv(csv);
  int causal_rows = 0, full_rows = 0;
  for (const TrialRow& r : rows.trials) (r.key.mask == Mask::kCausal ? causal_rows : full_rows) += 1;
  for (const TrialRow& r : rows.trials) CHECK((r.key.mask == Mask::kCausal) == (r.key.layer.value() == 0));
  CHECK(causal_rows > 0);
  CHECK(full_rows == causal_rows);
  CHECK(test::read_text(csv).find(",causal,") != std::string::npos);

  // --mask full measures both layers bidirectionally; the full-mask rows of layer 1 are unchanged.
  const std::string full_csv = test::temp_path("causal_full.csv");
  REQUIRE(test::run_attnprobe(fmt::format("sweep {} -e softmax -e vmean -e yoso-e -e 'yoso(m=8)' -e ra --trials 2 "
                                          "--mask full -q --overwrite -o {}",
                                          dump, full_csv))
              .exit_code == 0);
  std::map<std::tuple<std::string, int64_t, std::string>, double> layer1;
  for (const TrialRow& r : read_csv(full_csv).trials)
    if (r.key.layer.value() == 1) layer1[{r.key.spec, r.trial, r.metric}] = r.value;
  for (const TrialRow& r : rows.trials)
    if (r.key.layer.value() == 1) CHECK(layer1.at({r.key.spec, r.trial, r.metric}) == r.value);

  // An estimator without a causal form under the causal layer: exit 2, naming those with one.
  const auto refused = test::run_attnprobe(fmt::format("sweep {} -e linformer -q --overwrite -o {}", dump, csv));
  CHECK(refused.exit_code == 2);
  CHECK(refused.output.find("--mask full") != std::string::npos);
  CHECK(test::run_attnprobe(fmt::format("eval {} -e linformer --mask full -q -o {}", dump, csv)).exit_code == 0);
  CHECK(test::run_attnprobe(fmt::format("eval {} -e vmean --mask sideways -q -o {}", dump, csv)).exit_code == 2);
  // Weight metrics of causal cases: every causal form states its weights (softmax's are A itself; the
  // refusal for one that does not is tested in test_weights.cpp); so does every backward pass (the refusal
  // for one that does not is tested in test_gradients.cpp).
  CHECK(test::run_attnprobe(fmt::format("eval {} -e softmax --mask causal --metrics row_tv -q -o {}", dump, csv))
            .exit_code == 0);
  for (const CsvContents rows = read_csv(csv); const TrialRow& r : rows.trials) CHECK(r.value == 0);
  CHECK(test::run_attnprobe(fmt::format("eval {} -e yoso -e ra --mask causal --metrics weights -q -o {}", dump, csv))
            .exit_code == 0);
  const std::string gradients = "grad_q_fro_rel,grad_q_angle,grad_v_fro_rel";
  CHECK(test::run_attnprobe(fmt::format("eval {} -e softmax --mask causal --metrics {} -q -o {}", dump, gradients, csv))
            .exit_code == 0);
  // Its own gradient: fro 0; angle the acos of a cosine 1 − ulps (observed 3.7e-9, where a zero row 0 had
  // counted π/2/n = 0.0245 before zero reference rows were left out).
  for (const CsvContents rows = read_csv(csv); const TrialRow& r : rows.trials)
    CHECK(r.value <= (r.metric == "grad_q_angle" ? 1e-7 : 0.0));
  CHECK(test::run_attnprobe(fmt::format("eval {} -e vmean -e performer -e yoso -e 'yoso(grad=sparse)' -e yoso-e "
                                        "--mask causal --metrics {} -q -o {}",
                                        dump, gradients, csv))
            .exit_code == 0);
  for (const CsvContents rows = read_csv(csv); const TrialRow& r : rows.trials) {
    INFO(r.key.spec << " " << r.metric);
    // yoso-e's backward form ("yoso") is not its reference softmax's ("out"): NaN, as in full-mask cases.
    if (r.key.estimator == "yoso-e")
      CHECK(std::isnan(r.value));
    else
      CHECK(r.value > 0);
  }

  // A CSV written before the mask column existed reads as mask=full.
  std::string legacy =
      "dump,layer,head,batch,n,p,estimator,spec,samples,reference,trial,seed,metric,value\n"
      "d.h5,0,0,0,64,8,vmean,vmean,,softmax,0,0,mse,0.5\n";
  const std::string legacy_path = test::temp_path("legacy.csv");
  write_file_atomically(legacy_path, legacy);
  const CsvContents old = read_csv(legacy_path);
  REQUIRE(old.trials.size() == 1);
  CHECK(old.trials[0].key.mask == Mask::kFull);
  CHECK(test::run_attnprobe("summarize " + legacy_path).exit_code == 0);
}

TEST_CASE("bench --mask causal runs the causal forms and refuses the others", "[causal][cli]") {
  const auto run = test::run_attnprobe(
      "bench -e softmax -e vmean --mask causal --lengths 256 --threads 1 --repeat 1 "
      "--no-sgemm");
  CHECK(run.exit_code == 0);
  CHECK(
      test::run_attnprobe("bench -e nystrom --mask causal --lengths 256 --threads 1 --repeat 1 --no-sgemm").exit_code ==
      2);
}

}  // namespace attnprobe
