// summarize --compare A B (report/compare.h): paired differences over heads, from summaries made up here so that
// every statistic is known by hand, and on the command line from a real sweep.
#include <cmath>

#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"
#include "attnprobe/report/compare.h"
#include "attnprobe/report/spec_text.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

namespace {

SummaryRow summary(const std::string& spec, int head, int batch, const std::string& metric, double mean,
                   double stderr_ = 0) {
  SummaryRow row;
  row.key.dump = "d.h5";
  row.key.layer = 0;
  row.key.head = head;
  row.key.batch = batch;
  row.key.n = 64;
  row.key.estimator = spec.substr(0, spec.find('('));
  row.key.spec = written_spec(spec);  // as a CSV holds it: canonical for a registered estimator
  row.key.reference = "softmax";
  row.metric = metric;
  row.mean = mean;
  row.stderr_ = stderr_;
  row.count = 4;
  return row;
}

// Binomial(m, 1/2) two-sided tail by direct counting (for the sign test's check).
double two_sided_by_counting(int k, int m) {
  double tail = 0;
  for (int i = 0; i <= m; ++i) {
    double coefficient = 1;
    for (int j = 1; j <= i; ++j) coefficient = coefficient * (m - i + j) / j;
    if (std::abs(i - m / 2.0) >= std::abs(k - m / 2.0)) tail += coefficient / std::pow(2.0, m);
  }
  return std::min(1.0, tail);
}

}  // namespace

TEST_CASE("the sign test is the two-sided binomial tail", "[compare]") {
  CHECK(sign_test_p(0, 8) ==
        Approx(2.0 / 256).epsilon(1e-12));  // every one of 8 heads one way: the smallest p 8 heads can give
  CHECK(sign_test_p(1, 8) == Approx(18.0 / 256).epsilon(1e-12));  // 2·(1 + 8)/2⁸
  CHECK(sign_test_p(4, 8) == 1.0);
  CHECK(sign_test_p(0, 0) == 1.0);
  for (const auto& [k, m] : {std::pair{26, 40}, {7, 40}, {3, 11}, {0, 40}, {60, 100}})
    CHECK(sign_test_p(k, m) == Approx(two_sided_by_counting(k, m)).epsilon(1e-12));
  // Hundreds of heads: no underflow in the coefficients.
  CHECK(sign_test_p(200, 400) == Approx(1.0).epsilon(1e-12));
  CHECK(sign_test_p(150, 400) > 0);  // observed 6.5e-7
}

TEST_CASE("summarize --compare pairs two settings per slice with the head as the replicate", "[compare]") {
  // Three heads, two batch items each. Per head, A − B per item: head 0 (−0.2, −0.4), head 1 (−0.1, −0.1),
  // head 2 (+0.3, +0.1): head differences −0.3, −0.1, +0.2; A better (lower) on heads 0 and 1.
  const std::string a = "topk(k=8)", b = "streaming(sink=2,window=6)";
  const double a_values[3][2] = {{0.1, 0.2}, {0.3, 0.3}, {0.6, 0.4}};
  const double b_values[3][2] = {{0.3, 0.6}, {0.4, 0.4}, {0.3, 0.3}};
  std::vector<SummaryRow> rows;
  for (int h = 0; h < 3; ++h)
    for (int item = 0; item < 2; ++item) {
      rows.push_back(summary(a, h, item, "spec_rel", a_values[h][item], 0.01));
      rows.push_back(summary(b, h, item, "spec_rel", b_values[h][item], 0.02));
      // A larger-is-better metric: the same numbers, so "better" flips.
      rows.push_back(summary(a, h, item, "mass_recall", a_values[h][item]));
      rows.push_back(summary(b, h, item, "mass_recall", b_values[h][item]));
    }
  rows.push_back(summary(a, 3, 0, "spec_rel", 0.9));  // a slice without B: left out
  const std::vector<ComparisonRow> result = compare_paired(rows, a, b);
  REQUIRE(result.size() == 2);
  const ComparisonRow& error = result[0];
  CHECK(error.metric == "spec_rel");
  CHECK(error.key.layer.is_all());
  CHECK(error.key.n == Coordinate(64));
  CHECK(error.heads == 3);
  CHECK(error.slices == 6);
  CHECK(error.mean_a == Approx((0.15 + 0.3 + 0.5) / 3));
  CHECK(error.mean_b == Approx((0.45 + 0.4 + 0.3) / 3));
  CHECK(error.diff == Approx(-0.2 / 3));
  CHECK(error.a_better == 2);
  CHECK(error.b_better == 1);
  CHECK(error.ties == 0);
  CHECK(error.sign_p == 1.0);                 // 2 of 3 cannot tell
  CHECK(error.median_ratio == Approx(0.75));  // ratios 1/3, 0.75, 5/3
  // Heads' differences −0.3, −0.1, 0.2: mean −1/15, sd √(Σ(d − mean)²/2).
  const double sd =
      std::sqrt((std::pow(-0.3 + 1 / 15.0, 2) + std::pow(-0.1 + 1 / 15.0, 2) + std::pow(0.2 + 1 / 15.0, 2)) / 2);
  CHECK(error.head_sd == Approx(sd));
  // Monte-Carlo: each slice's difference has variance 0.01² + 0.02²; a head averages 2 items (÷ 2), the mean of 3
  // heads divides by 3 again: stderr √(0.0005 / 2 / 3) = 0.0091.
  CHECK(error.mc_stderr == Approx(std::sqrt(0.0005 / 6)));
  // The bootstrap interval of a mean of 3 values lies within their range, and holds the mean; its ends are means of
  // resamples, hence of the form (i·(−0.3) + j·(−0.1) + k·0.2)/3.
  CHECK(error.ci_low >= -0.3 - 1e-15);  // observed [−0.3, 0.2]: resamples of one head thrice reach both ends
  CHECK(error.ci_high <= 0.2 + 1e-15);
  CHECK(error.ci_low < error.diff);
  CHECK(error.diff < error.ci_high);
  const ComparisonRow& recall = result[1];
  CHECK(recall.metric == "mass_recall");
  CHECK(recall.a_better == 1);  // larger is better: A only on head 2
  CHECK(recall.b_better == 2);
  CHECK(recall.mc_stderr == 0);  // deterministic settings: no Monte-Carlo term
  // The same input gives the same interval (a fixed key), and swapping A and B mirrors it.
  const std::vector<ComparisonRow> again = compare_paired(rows, a, b);
  CHECK(again[0].ci_low == error.ci_low);
  CHECK(again[0].ci_high == error.ci_high);
  const ComparisonRow swapped = compare_paired(rows, b, a)[0];
  CHECK(swapped.diff == Approx(-error.diff));
  CHECK(swapped.ci_low == Approx(-error.ci_high));
  CHECK(swapped.a_better == error.b_better);
}

TEST_CASE("summarize --compare: equal heads are ties, and the interval of equal differences is that difference",
          "[compare]") {
  std::vector<SummaryRow> rows;
  for (int h = 0; h < 5; ++h) {
    rows.push_back(summary("a(k=1)", h, 0, "spec_rel", 0.5));
    rows.push_back(summary("b(k=1)", h, 0, "spec_rel", h < 2 ? 0.5 : 0.25));
  }
  const ComparisonRow row = compare_paired(rows, "a(k=1)", "b(k=1)")[0];
  CHECK(row.ties == 2);
  CHECK(row.b_better == 3);
  CHECK(row.sign_p == Approx(0.25).epsilon(1e-12));  // 3 of 3 decided heads one way: 2/2³
  CHECK(row.ci_low >= 0);                            // observed [0.05, 0.25]
  CHECK(row.ci_high <= 0.25);
  std::vector<SummaryRow> all_tie;
  for (int h = 0; h < 4; ++h) {
    all_tie.push_back(summary("a(k=1)", h, 0, "spec_rel", 0.5));
    all_tie.push_back(summary("b(k=1)", h, 0, "spec_rel", 0.5));
  }
  const ComparisonRow tied = compare_paired(all_tie, "a(k=1)", "b(k=1)")[0];
  CHECK(std::isnan(tied.sign_p));  // no head decides: no test
  CHECK(tied.ci_low == 0);
  CHECK(tied.ci_high == 0);
}

TEST_CASE("summarize --compare refuses what it cannot pair", "[compare]") {
  std::vector<SummaryRow> rows = {summary("a(k=1)", 0, 0, "spec_rel", 0.5), summary("b(k=1)", 0, 0, "spec_rel", 0.4)};
  CHECK_THROWS_AS(compare_paired(rows, "a(k=1)", "a(k=1)"), UsageError);
  CHECK_THROWS_WITH(compare_paired(rows, "a(k=1)", "c(k=1)"), Catch::Contains("a(k=1), b(k=1)"));
  std::vector<SummaryRow> other_n = rows;
  other_n[1].key.n = 32;
  CHECK_THROWS_WITH(compare_paired(other_n, "a(k=1)", "b(k=1)"), Catch::Contains("no slice has both"));
  std::vector<SummaryRow> pooled = rows;
  pooled[0].key.head = Coordinate::all();
  CHECK_THROWS_WITH(compare_paired(pooled, "a(k=1)", "b(k=1)"), Catch::Contains("not a summary pooled"));
}

TEST_CASE("summarize --compare on a sweep", "[compare][cli]") {
  const std::string dump = write_synth("compare.h5", synth_options(1, 3, 2, 64, 16));
  const std::string csv = temp_path("compare.csv");
  REQUIRE(run_attnprobe("sweep " + dump + " -e performer -e nystrom --samples 16 --trials 3 --lengths 64 " +
                        "--metrics spec_rel --overwrite -q -o " + csv)
              .exit_code == 0);
  // Specs as a user types them (defaults left out) match the canonical specs the CSV holds.
  const auto result = run_attnprobe("summarize " + csv + " --compare 'performer(M=16)' 'nystrom(L=16)'");
  INFO(result.output);
  REQUIRE(result.exit_code == 0);
  const std::vector<std::string> lines = split(trim(result.output), '\n');
  REQUIRE(lines.size() == 2);
  CHECK_THAT(lines[0],
             Catch::StartsWith("dump,n,p,mask,queries,precision,reference,metric,a,b,heads,slices,mean_a,mean_b,diff"));
  CHECK_THAT(lines[1], Catch::Contains(",spec_rel,\"performer(M=16,"));
  CHECK_THAT(lines[1], Catch::Contains(",3,6,"));  // 3 heads, 6 slices (2 batch items each)
  const auto table = run_attnprobe("summarize " + csv + " --compare 'performer(M=16)' 'nystrom(L=16)' --table");
  CHECK(table.exit_code == 0);
  CHECK_THAT(table.output, Catch::Contains("95% interval"));
  CHECK(run_attnprobe("summarize " + csv + " --compare performer").exit_code == 2);
  CHECK(run_attnprobe("summarize " + csv + " --compare 'performer(M=16)' 'yoso(m=16)'").exit_code == 2);
  CHECK(run_attnprobe("summarize " + csv + " --compare 'performer(M=16)' 'nystrom(L=16)' --over head").exit_code == 2);
  CHECK(run_attnprobe("summarize " + csv + " --compare 'performer(M=16)' 'nystrom(L=16)' --slopes").exit_code == 2);
}
