// summarize --pareto (report/pareto.h): each estimator's error-vs-cost front per case, from summaries made up here
// so that the front is known by hand, and from a real decode sweep on the command line.
#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"
#include "attnprobe/report/pareto.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

namespace {

SummaryRow summary(const std::string& estimator, int64_t samples, const std::string& metric, double mean,
                   int head = 0) {
  SummaryRow row;
  row.key.dump = "d.h5";
  row.key.layer = 0;
  row.key.head = head;
  row.key.batch = 0;
  row.key.n = 64;
  row.key.estimator = estimator;
  row.key.spec = estimator + "(k=" + std::to_string(samples) + ")";
  row.key.samples = samples;
  row.key.reference = "softmax";
  row.metric = metric;
  row.mean = mean;
  row.count = 1;
  return row;
}

}  // namespace

TEST_CASE("a Pareto front keeps the settings no cheaper setting beats", "[pareto]") {
  // topk at densities 0.1, 0.2, 0.3, 0.4 with errors 0.5, 0.6 (dominated by the cheaper 0.5), 0.3, 0.3 (a tie in
  // error at a higher cost: not an improvement); mass_recall is larger-is-better: 0.7, 0.9, 0.8 (dominated), 0.95.
  std::vector<SummaryRow> rows;
  const double density[] = {0.1, 0.2, 0.3, 0.4}, error[] = {0.5, 0.6, 0.3, 0.3}, recall[] = {0.7, 0.9, 0.8, 0.95};
  for (int i = 0; i < 4; ++i) {
    rows.push_back(summary("topk", 10 * (i + 1), "density", density[i]));
    rows.push_back(summary("topk", 10 * (i + 1), "spec_rel", error[i]));
    rows.push_back(summary("topk", 10 * (i + 1), "mass_recall", recall[i]));
  }
  // Another estimator and another head are fronts of their own; a setting without the axis is left out.
  rows.push_back(summary("moba", 1, "density", 0.5));
  rows.push_back(summary("moba", 1, "spec_rel", 0.9));
  rows.push_back(summary("topk", 10, "density", 0.1, 1));
  rows.push_back(summary("topk", 10, "spec_rel", 0.2, 1));
  rows.push_back(summary("topk", 99, "spec_rel", 0.01));  // no density
  rows.push_back(summary("topk", 50, "density", 0.05));
  rows.push_back(summary("topk", 50, "spec_rel", std::nan("")));  // NaN mean: left out
  const std::vector<ParetoRow> fronts = pareto_fronts(rows, "density");
  auto front = [&](const std::string& estimator, int head, const std::string& metric) {
    std::vector<std::pair<double, double>> points;
    for (const ParetoRow& r : fronts)
      if (r.key.estimator == estimator && r.key.head == Coordinate(head) && r.metric == metric)
        points.emplace_back(r.axis, r.value);
    return points;
  };
  using Points = std::vector<std::pair<double, double>>;
  CHECK(front("topk", 0, "spec_rel") == Points{{0.1, 0.5}, {0.3, 0.3}});
  CHECK(front("topk", 0, "mass_recall") == Points{{0.1, 0.7}, {0.2, 0.9}, {0.4, 0.95}});
  CHECK(front("topk", 1, "spec_rel") == Points{{0.1, 0.2}});
  CHECK(front("moba", 0, "spec_rel") == Points{{0.5, 0.9}});
  CHECK(fronts.size() == 7);
  // The CSV names the axis column after the axis.
  CHECK_THAT(pareto_csv_text(fronts, "density"), Catch::Contains(",metric,density,value"));
  // No summary holds the axis: a usage error that says how to get it.
  CHECK_THROWS_WITH(pareto_fronts({summary("topk", 10, "spec_rel", 0.1)}, "density"),
                    Catch::Contains("--metrics selection"));
}

TEST_CASE("summarize --pareto density on a decode sweep", "[pareto][cli]") {
  const std::string dump = write_synth("pareto.h5", synth_options(1, 2, 1, 128, 16));
  const std::string csv = temp_path("pareto.csv");
  REQUIRE(run_attnprobe("sweep " + dump + " -e topk --samples 4,16,64 -e 'streaming(sink=2,window=14)' " +
                        "--mask causal --queries last:8 --metrics spec_rel,selection --overwrite -q -o " + csv)
              .exit_code == 0);
  const auto table = run_attnprobe("summarize " + csv + " --over layer,head,batch --pareto density --table");
  INFO(table.output);
  CHECK(table.exit_code == 0);
  // topk's error falls with every k: all three settings are on its front, pooled over the two heads.
  int topk_rows = 0;
  for (const std::string& line : split(table.output, '\n'))
    topk_rows += line.find("topk(k=") != std::string::npos && line.find(" spec_rel ") != std::string::npos;
  CHECK(topk_rows == 3);
  const auto refused = run_attnprobe("summarize " + csv + " --pareto density --slopes");
  CHECK(refused.exit_code == 2);
}
