// Strict spec parsing and typed, ranged, canonical parameter values (the walk over every registered
// estimator is the conformance harness, test_conformance.cpp).
#include <fstream>

#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/io/dump.h"
#include "attnprobe/sweep/plan.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

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

TEST_CASE("an unknown estimator name or spec key suggests the nearest one", "[registry][did-you-mean]") {
  CHECK_THROWS_WITH(parse_spec("performr"),
                    Catch::Contains("unknown estimator 'performr'") && Catch::Contains("Did you mean 'performer'?"));
  CHECK_THROWS_WITH(parse_spec("Performer(M=16)"), Catch::Contains("Did you mean 'performer'?"));
  // Keys are case-sensitive; the suggestion is not, so the usual slip (m for M) finds its key.
  CHECK_THROWS_WITH(parse_spec("performer(m=16)"), Catch::Contains("no parameter 'm'") &&
                                                       Catch::Contains("Did you mean 'M'?") &&
                                                       Catch::Contains("valid keys of 'performer'"));
  // Nothing near: no suggestion, only the list.
  CHECK_THROWS_WITH(parse_spec("nosuch"), !Catch::Contains("Did you mean"));
  CHECK_THROWS_WITH(parse_spec("yoso(bogus=1)"), !Catch::Contains("Did you mean"));
}

namespace {
// A registration used only by this test: one parameter of each kind, to test values and ranges.
class ZeroEstimator final : public Estimator {
 public:
  void estimate(const HeadView& view, const EstimateContext&, MatrixF& out) const override {
    out = MatrixF::Zero(view.n(), view.pv());
  }
};
[[maybe_unused]] const bool kTestRegistered = register_estimator(EstimatorDef{
    .name = "test-params",
    .family = "test",
    .summary = "test only",
    .params = {{"m", ParamKind::kInt, "8", 1, 1024, {}, "samples"},
               {"beta", ParamKind::kReal, "1", 0, 10, {}, "a real"},
               {"hash", ParamKind::kChoice, "gauss", 0, 0, {"gauss", "hadamard"}, "a choice"}},
    .samples_knob = "m",
    .capabilities = {.random = false},
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
