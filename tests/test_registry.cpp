// The registry walk (every estimator: spec round trip, determinism under a fixed key, shape,
// finiteness) and strict spec parsing.
#include <fstream>

#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/io/dump.h"
#include "attnprobe/sweep/plan.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

namespace {
// pv ≠ p catches estimators that confuse the two.
HeadView small_slice(int64_t n = 96, int p = 16) { return synth_slice(n, p, 0.3, 0, p + 3); }
}  // namespace

TEST_CASE("every registered estimator round-trips its spec and is deterministic per key with the right shape",
          "[registry]") {
  const HeadView view = small_slice();
  const auto defs = registered_estimators();
  REQUIRE(defs.size() >= 2);
  for (const EstimatorDef* def : defs) {
    INFO("estimator " << def->name);
    const Spec spec = parse_spec(def->name);
    CHECK(parse_spec(spec.canonical()) == spec);
    CHECK(parse_spec(spec.canonical()).canonical() == spec.canonical());
    CHECK(!def->summary.empty());
    for (const ParamDef& p : def->params) CHECK(!p.help.empty());
    if (spec.has_samples_knob()) {
      const Spec more = spec.with_samples(5);
      CHECK(more.samples() == 5);
      CHECK(parse_spec(more.canonical()) == more);
    }
    const Spec target = parse_spec(spec.target());
    CHECK_FALSE(target.random());  // a target must be usable as a reference

    const auto estimator = spec.make();
    MatrixF a, b, c;
    estimator->estimate(view, EstimateContext{make_random_key(1, "walk", 0), nullptr}, a);
    estimator->estimate(view, EstimateContext{make_random_key(1, "walk", 0), nullptr}, b);
    REQUIRE(a.rows() == view.n());
    REQUIRE(a.cols() == view.pv());
    CHECK(a.allFinite());
    CHECK(a == b);
    estimator->estimate(view, EstimateContext{make_random_key(1, "walk", 1), nullptr}, c);
    if (spec.random())
      CHECK(a != c);
    else
      CHECK(a == c);
  }
}

TEST_CASE("every registered estimator counts its flops, so bench shows where it sits under the roofline",
          "[registry][bench]") {
  // bench's GFLOP/s and %peak columns are blank for an estimator whose flops() is the default 0.
  for (const EstimatorDef* def : registered_estimators()) {
    if (def->family == "test") continue;  // this file's own registration, which computes nothing
    INFO("estimator " << def->name);
    const auto estimator = parse_spec(def->name).make();
    const double at_1024 = estimator->flops(1024, 64, 64), at_4096 = estimator->flops(4096, 64, 64);
    CHECK(at_1024 > 0);
    CHECK(at_4096 > at_1024);                          // work grows with n
    CHECK(estimator->flops(1024, 64, 128) > at_1024);  // and with the value width
  }
}

TEST_CASE("every estimator gives the same bits with and without a pool inside the call", "[registry][threads]") {
  // What lets `bench --threads` and a sweep with fewer tasks than threads hand the pool to one call
  // (sweep/runner.cpp) without changing a number. n = 1300 spans several row blocks (256 and 128 rows)
  // and key chunks (1024 keys) of every blocked estimator; every variant (`list --variants`), full and,
  // where there is one, causal.
  HeadView view = synth_slice(1300, 16, 0.7, 21, 12);
  int compared = 0;
  for (const EstimatorDef* def : registered_estimators()) {
    if (def->family == "test") continue;
    for (const std::string& text : variants(*def)) {
      const Spec spec = parse_spec(text);
      for (const Mask mask : {Mask::kFull, Mask::kCausal}) {
        if (mask == Mask::kCausal && !spec.causal()) continue;
        view.mask = mask;
        INFO(text << " mask " << mask_name(mask));
        const PooledEstimates runs = estimate_with_pools(text, view, make_random_key(3, text, 0));
        CHECK(runs.alone == runs.one_thread);
        CHECK(runs.alone == runs.two_threads);
        ++compared;
      }
    }
  }
  // 57 variants (list --variants), 17 of them with a causal form: observed 74.
  CHECK(compared >= 57);
}

TEST_CASE("deterministic references agree with their float32 estimate", "[registry]") {
  const HeadView view = small_slice(64, 8);
  for (const EstimatorDef* def : registered_estimators()) {
    if (parse_spec(def->name).random()) continue;
    const auto estimator = parse_spec(def->name).make();
    const auto ref = estimator->reference(view, nullptr);
    if (!ref) continue;
    MatrixF out;
    estimator->estimate(view, EstimateContext{}, out);
    INFO("estimator " << def->name);
    // float32 vs float64 evaluation of the same formula: ~1e-7 relative; observed 9e-8 (softmax),
    // 2e-8 (vmean).
    CHECK((*ref - out.cast<double>()).norm() <= 1e-5 * ref->norm());
  }
}

TEST_CASE("spec parsing is strict and its errors list what is valid", "[registry]") {
  CHECK(parse_spec("softmax").canonical() == "softmax");
  CHECK(parse_spec("  vmean  ").canonical() == "vmean");
  CHECK(parse_spec("vmean()").canonical() == "vmean");
  CHECK_THROWS_AS(parse_spec("nosuch"), UsageError);  // a spec is command line: exit 2
  CHECK_THROWS_WITH(parse_spec("nosuch(m=3)"), Catch::Contains("unknown estimator 'nosuch'") &&
                                                   Catch::Contains("softmax") && Catch::Contains("vmean"));
  CHECK_THROWS_WITH(parse_spec("vmean(d=3)"),
                    Catch::Contains("no parameter 'd'") && Catch::Contains("takes no parameters"));
  CHECK_THROWS_WITH(parse_spec("vmean(d=3"), Catch::Contains("malformed spec"));
  CHECK_THROWS_WITH(parse_spec("vmean(x)"), Catch::Contains("malformed spec"));
  CHECK_THROWS_WITH(parse_spec("vmean)("), Catch::Contains("unknown estimator"));
  // A 120 KB name was quoted twice in a 240 KB message; the message is short whatever the spec.
  try {
    parse_spec(std::string(120000, 'x'));
    FAIL("a 120000-character spec was accepted");
  } catch (const UsageError& e) {
    CHECK_THAT(e.what(), Catch::Contains("a spec of 120000 characters"));
    CHECK(std::string(e.what()).size() < 300);  // observed 164 characters
  }
}

namespace {
// A registration used only by this test: one parameter of each kind, to test values and ranges.
class ZeroEstimator final : public Estimator {
 public:
  void estimate(const HeadView& view, const EstimateContext&, MatrixF& out) const override {
    out = MatrixF::Zero(view.n(), view.pv());
  }
};
[[maybe_unused]] const bool kTestRegistered = register_estimator({
    .name = "test-params",
    .family = "test",
    .summary = "test only",
    .params = {{"m", ParamKind::kInt, "8", 1, 1024, {}, "samples"},
               {"beta", ParamKind::kReal, "1", 0, 10, {}, "a real"},
               {"hash", ParamKind::kChoice, "gauss", 0, 0, {"gauss", "hadamard"}, "a choice"}},
    .samples_knob = "m",
    .random = false,
    .target = nullptr,
    .make = [](const Spec&) { return std::make_unique<ZeroEstimator>(); },
});
}  // namespace

TEST_CASE("parameter values are typed and ranged and printed canonically", "[registry]") {
  CHECK(parse_spec("test-params").canonical() == "test-params(m=8,beta=1,hash=gauss)");
  CHECK(parse_spec("test-params(hash=hadamard, m=16)").canonical() == "test-params(m=16,beta=1,hash=hadamard)");
  CHECK(parse_spec("test-params(beta=2.50)").canonical() == "test-params(m=8,beta=2.5,hash=gauss)");
  CHECK(parse_spec("test-params(beta=0.02)").get_real("beta") == 0.02);
  CHECK(parse_spec("test-params(m=4)").with_samples(64).canonical() == "test-params(m=64,beta=1,hash=gauss)");
  CHECK(parse_spec("test-params").target() == "softmax");
  CHECK_THROWS_WITH(parse_spec("test-params(m=2.5)"), Catch::Contains("not an integer") && Catch::Contains("1..1024"));
  CHECK_THROWS_WITH(parse_spec("test-params(m=0)"), Catch::Contains("out of range"));
  CHECK_THROWS_WITH(parse_spec("test-params(beta=abc)"), Catch::Contains("not a finite number"));
  CHECK_THROWS_WITH(parse_spec("test-params(beta=nan)"), Catch::Contains("not a finite number"));
  CHECK_THROWS_WITH(parse_spec("test-params(hash=lsh)"), Catch::Contains("gauss|hadamard"));
  CHECK_THROWS_WITH(parse_spec("test-params(m=4,m=5)"), Catch::Contains("given twice"));
  CHECK_THROWS_WITH(parse_spec("test-params(q=1)"),
                    Catch::Contains("valid keys") && Catch::Contains("m (integer") && Catch::Contains("hash ("));
  CHECK_THROWS_AS(parse_spec("test-params").with_samples(0), UsageError);
}

TEST_CASE("README's list of CUDA estimators is the registry's", "[registry][gpu]") {
  if (!device_compiled(Device::kCuda)) SKIP_TEST("built without the CUDA backend: no CUDA versions are registered");
  std::ifstream readme(std::string(ATTNPROBE_SOURCE_DIR) + "/README.md");
  const std::string marker = "CUDA versions (`attnprobe list`): ";
  std::string line, listed;
  while (std::getline(readme, line))
    if (const size_t at = line.find(marker); at != std::string::npos) {
      listed = line.substr(at + marker.size());
      listed = listed.substr(0, listed.find_first_of(";|"));
      break;
    }
  INFO("README.md must say: " << marker << join(estimators_on(Device::kCuda), ", "));
  CHECK(trim(listed) == join(estimators_on(Device::kCuda), ", "));
}
