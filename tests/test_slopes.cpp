// summarize --slopes (report/slopes.h): the fitted exponent of error against samples.
#include <cmath>

#include "attnprobe/report/slopes.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

namespace {
SummaryRow row(int64_t samples, double mean, int layer = 0) {
  SummaryRow r;
  r.key = CaseKey{"d.h5",  layer,   0, 0, 256, 32, Mask::kFull, 0, {}, "yoso", fmt::format("yoso(m={},tau=8)", samples),
                  samples, "yoso-e"};
  r.metric = "spec_rel";
  r.count = 8;
  r.mean = mean;
  return r;
}
}  // namespace

TEST_CASE("slopes recover a power law and group the sample counts of one setting", "[slopes]") {
  std::vector<SummaryRow> rows;
  for (int64_t m : {8, 16, 32, 64, 128}) {
    rows.push_back(row(m, 0.9 * std::pow(m, -0.5)));                                   // layer 0: pure variance
    rows.push_back(row(m, 0.2 + 0.9 * std::pow(m, -0.5) * (m == 32 ? 1.1 : 1.0), 1));  // layer 1: a bias floor
  }
  const std::vector<SlopeRow> slopes = fit_slopes(rows);
  REQUIRE(slopes.size() == 2);
  CHECK(slopes[0].key.spec == "yoso(m=*,tau=8)");
  CHECK(!slopes[0].key.samples);
  CHECK(slopes[0].points == 5);
  CHECK(slopes[0].slope == Approx(-0.5).margin(1e-12));
  CHECK(slopes[0].stderr_ < 1e-12);  // an exact line
  CHECK(slopes[0].min_samples == 8);
  CHECK(slopes[0].max_samples == 128);
  // With a floor of 0.2 the error falls more slowly than -1/2 (observed -0.30), with a residual spread.
  CHECK(slopes[1].slope > -0.4);
  CHECK(slopes[1].slope < -0.2);
  CHECK(slopes[1].stderr_ > 0);
  // One sample count, or non-positive errors, give no slope.
  CHECK(fit_slopes({row(8, 0.3)}).empty());
  CHECK(fit_slopes({row(8, 0.0), row(16, 0.0)}).empty());
  CHECK_THAT(slopes_csv_text(slopes),
             Catch::StartsWith("dump,layer,head,batch,n,p,mask,queries,precision,estimator,spec,reference,metric,"
                               "points,slope,stderr"));
}

TEST_CASE("summarize --slopes on a sweep of sample counts", "[slopes][cli]") {
  const std::string dump = write_synth("slopes.h5", synth_options(1, 1, 1, 128, 16));
  const std::string csv = temp_path("slopes.csv");
  REQUIRE(run_attnprobe("sweep " + dump + " -e performer --samples 8..128:x2 --trials 8 -q -o " + csv).exit_code == 0);
  const auto r = run_attnprobe("summarize " + csv + " --slopes");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("performer(M=*,ortho=1)"));
  const auto none = run_attnprobe("summarize " + csv + " --slopes --over layer");  // still 5 sample counts
  CHECK(none.exit_code == 0);
  const auto flat = run_attnprobe("sweep " + dump + " -e vmean -q -o " + temp_path("flat.csv"));
  REQUIRE(flat.exit_code == 0);
  CHECK(run_attnprobe("summarize " + temp_path("flat.csv") + " --slopes").exit_code == 2);
}
