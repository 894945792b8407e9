// Head diagnostics (metrics/head_diagnostics.h) on attention with closed-form answers.
#include <cmath>

#include "attnprobe/metrics/head_diagnostics.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

TEST_CASE("diagnostics of uniform and of one-hot attention", "[diagnostics]") {
  const int64_t n = 300, p = 8;
  SECTION("uniform: q = 0") {
    const HeadView view =
        make_head_view(SliceId{0, 0, 0, n}, 0.5, MatrixD::Zero(n, p), MatrixD::Random(n, p), MatrixD::Random(n, p));
    const HeadDiagnostics d = diagnose_head(view);
    CHECK(d.entropy == Approx(std::log(300.0)).epsilon(1e-12));
    CHECK(d.effective_support == 270);                // exactly 0.9·300 keys of mass 1/300 each
    CHECK(d.stable_rank == Approx(1).epsilon(1e-9));  // rank one
    // Σ_j |i − j| / n averaged over i: (n² − 1)/(3n) = 99.9989
    CHECK(d.mean_distance == Approx((300.0 * 300 - 1) / (3 * 300)).epsilon(1e-12));
    CHECK(d.max_logit == 0);
    CHECK(d.q_norm_cv == 0);
    CHECK(d.sink_mass == Approx(4.0 / 300).epsilon(1e-12));  // 4 sink keys of weight 1/300
  }
  SECTION("uniform over the visible keys: the last 8 rows of a causal slice, and of a window") {
    const HeadView whole = make_head_view(SliceId{0, 0, 0, n}, 0.5, MatrixD::Zero(n, p), MatrixD::Random(n, p),
                                          MatrixD::Random(n, p), Mask::kCausal);
    const HeadDiagnostics d = diagnose_head(last_rows(whole, 8));
    // Rows at t = 292..299 see t + 1 keys each, uniformly: entropy ln(t + 1), sinks 4/(t + 1), distance t/2.
    double entropy = 0, sinks = 0, distance = 0;
    for (int t = 292; t < 300; ++t) {
      entropy += std::log(t + 1.0) / 8;
      sinks += 4.0 / (t + 1) / 8;
      distance += t / 2.0 / 8;
    }
    CHECK(d.entropy == Approx(entropy).epsilon(1e-12));
    CHECK(d.sink_mass == Approx(sinks).epsilon(1e-12));
    CHECK(d.mean_distance == Approx(distance).epsilon(1e-12));
    HeadView window = whole;
    window.mask = Mask::kWindow;
    window.window = 10;
    const HeadDiagnostics w = diagnose_head(last_rows(window, 8));
    CHECK(w.entropy == Approx(std::log(10.0)).epsilon(1e-12));
    CHECK(w.sink_mass == 0);                               // the first keys are outside every window
    CHECK(w.mean_distance == Approx(4.5).epsilon(1e-12));  // (0 + 1 + ... + 9) / 10
    CHECK(w.effective_support == 9);
  }
  SECTION("one-hot: each query sees only its own key") {
    MatrixD q = MatrixD::Zero(n, n);
    q.diagonal().setConstant(10);  // s·q_i·k_j = 0.5·100 on the diagonal, 0 elsewhere: e^-50 off it
    const HeadView view = make_head_view(SliceId{0, 0, 0, n}, 0.5, q, q, MatrixD::Random(n, 4));
    const HeadDiagnostics d = diagnose_head(view);
    CHECK(d.entropy < 1e-15);  // 299·e^-50·50 ≈ 2.9e-18
    CHECK(d.effective_support == 1);
    CHECK(d.stable_rank == Approx(300).epsilon(1e-9));  // A ≈ I
    CHECK(d.mean_distance < 1e-15);
    CHECK(d.max_logit == Approx(50));
  }
}

TEST_CASE("diagnostics do not depend on the thread count", "[diagnostics]") {
  const HeadView view = synth_slice(700, 16, 0.3, 4);
  ThreadPool one(1), two(2);
  CHECK(diagnostic_values(diagnose_head(view, &one)) == diagnostic_values(diagnose_head(view, &two)));
  CHECK(diagnostic_values(diagnose_head(view, nullptr)) == diagnostic_values(diagnose_head(view, &two)));
  CHECK(mean_attention_entropy(view) == Approx(diagnose_head(view).entropy).epsilon(1e-12));
}

TEST_CASE("diagnose writes one long row per slice, length and diagnostic", "[diagnostics][cli]") {
  const std::string dump = write_synth("diag.h5", synth_options(1, 2, 1, 64, 8));
  const auto r = run_attnprobe("diagnose " + dump + " --lengths 32,64 -q -o " + temp_path("diag.csv"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::string text = read_text(temp_path("diag.csv"));
  CHECK_THAT(text, Catch::StartsWith("dump,layer,head,batch,n,p,mask,queries,diagnostic,value\n"));
  CHECK(std::count(text.begin(), text.end(), '\n') == 1 + 2 * 2 * 8);  // 2 heads × 2 lengths × 8 diagnostics
  CHECK(run_attnprobe("diagnose " + dump + " --lengths 65 -q").exit_code == 3);
  const auto decode = run_attnprobe("diagnose " + dump + " --lengths 32,64 --mask causal --queries all,last:4 -q -o " +
                                    temp_path("diag-decode.csv"));
  REQUIRE(decode.exit_code == 0);
  const std::string rows = read_text(temp_path("diag-decode.csv"));
  CHECK(std::count(rows.begin(), rows.end(), '\n') == 1 + 2 * 2 * 2 * 8);  // × 2 query sets
  CHECK_THAT(rows, Catch::Contains(",64,8,causal,last:4,sink_mass,"));
  CHECK(run_attnprobe("diagnose " + dump + " --lengths 32 --queries last:33 -q").exit_code == 2);
}
