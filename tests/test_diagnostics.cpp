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
  CHECK_THAT(text, Catch::StartsWith("dump,layer,head,batch,n,p,diagnostic,value\n"));
  CHECK(std::count(text.begin(), text.end(), '\n') == 1 + 2 * 2 * 7);  // 2 heads × 2 lengths × 7 diagnostics
  CHECK(run_attnprobe("diagnose " + dump + " --lengths 65 -q").exit_code == 3);
}
