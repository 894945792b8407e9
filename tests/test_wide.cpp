// summarize --wide and --metrics (report/wide.h), and Spec::brief, the names people read in tables.
#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/report/spec_text.h"
#include "attnprobe/report/wide.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

namespace {

SummaryRow summary(const std::string& spec, std::optional<int64_t> samples, int64_t n, const std::string& metric,
                   double mean, int64_t count = 3) {
  SummaryRow row;
  row.key.dump = "d.h5";
  row.key.layer = row.key.head = row.key.batch = Coordinate::all();
  row.key.n = n;
  row.key.estimator = spec.substr(0, spec.find('('));
  row.key.spec = parse_spec(spec).canonical();
  row.key.samples = samples;
  row.key.reference = "softmax";
  row.metric = metric;
  row.mean = mean;
  row.stderr_ = mean / 10;
  row.count = count;
  return row;
}

}  // namespace

TEST_CASE("Spec::brief names a setting by its non-default keys", "[wide]") {
  CHECK(parse_spec("topk").brief() == "topk");
  CHECK(parse_spec("topk(k=64)").brief() == "topk(k=64)");
  CHECK(parse_spec("topk(window=8,k=64)").brief() == "topk(k=64,window=8)");  // registration order
  const Spec performer = parse_spec("performer");                             // M=64 is its default
  CHECK(performer.brief(Spec::Knob::kAlways) == "performer(M=64)");
  CHECK(parse_spec("performer(M=16,ortho=0)").brief(Spec::Knob::kNever) == "performer(ortho=0)");
  CHECK(brief_spec("py:mine") == "py:mine");  // not a registered spec: as it is
}

TEST_CASE("summarize --wide: settings as rows, lengths or samples as columns", "[wide]") {
  // Two lengths: the n axis, the samples knob in the label; a setting missing at one length leaves its cell empty.
  const std::vector<SummaryRow> by_length = {
      summary("performer(M=16)", 16, 128, "spec_rel", 0.5), summary("performer(M=16)", 16, 256, "spec_rel", 0.25),
      summary("performer(M=64)", 64, 128, "spec_rel", 0.2), summary("topk(k=8)", 8, 256, "spec_rel", 0.1, 1)};
  const WideTable lengths = wide_summary(by_length, true);
  CHECK(lengths.axis == "n");
  CHECK(lengths.header == std::vector<std::string>{"dump", "layer", "head", "batch", "estimator", "reference", "metric",
                                                   "n=128", "n=256"});
  REQUIRE(lengths.rows.size() == 3);
  CHECK(lengths.rows[0][4] == "performer(M=16)");
  CHECK(lengths.rows[0][7] == "0.5 ± 0.05");
  CHECK(lengths.rows[0][8] == "0.25 ± 0.025");
  CHECK(lengths.rows[1][4] == "performer(M=64)");  // the default M shown: the rows differ in it
  CHECK(lengths.rows[1][8].empty());
  CHECK(lengths.rows[2][8] == "0.1");  // one value: no stderr
  CHECK(wide_summary(by_length, false).rows[0][7] == "0.5");
  // One length, several samples: the samples axis, the knob left out of the label.
  const std::vector<SummaryRow> by_samples = {summary("yoso(m=8)", 8, 256, "spec_rel", 0.4),
                                              summary("yoso(m=32)", 32, 256, "spec_rel", 0.2),
                                              summary("yoso(m=32)", 32, 256, "angle", 0.3)};
  const WideTable samples = wide_summary(by_samples, false);
  CHECK(samples.axis == "samples");
  CHECK(samples.header.back() == "samples=32");
  REQUIRE(samples.rows.size() == 2);  // yoso's spec_rel and its angle
  CHECK(samples.rows[0][4] == "yoso");
  CHECK(samples.rows[0][7] == "0.4");
  CHECK(samples.rows[0][8] == "0.2");
  CHECK(samples.rows[1][6] == "angle");
  CHECK(samples.rows[1][7].empty());
  // Estimators with other samples values (topk's k beside yoso's m): no shared columns, so rows of one length.
  std::vector<SummaryRow> mixed = by_samples;
  mixed.push_back(summary("topk(k=64)", 64, 256, "spec_rel", 0.05));
  const WideTable rows = wide_summary(mixed, false);
  CHECK(rows.axis == "n");
  CHECK(rows.header.back() == "n=256");
  CHECK(rows.rows.size() == 4);
  CHECK(rows.rows[3][4] == "topk(k=64)");
}

TEST_CASE("summarize --wide --metrics on a sweep", "[wide][cli]") {
  const std::string dump = write_synth("wide.h5", synth_options(1, 2, 1, 128, 16));
  const std::string csv = temp_path("wide.csv");
  REQUIRE(run_attnprobe("sweep " + dump + " -e performer --samples 8,32 --lengths 64,128 --trials 2 " +
                        "--metrics spec_rel,angle --overwrite -q -o " + csv)
              .exit_code == 0);
  const auto table = run_attnprobe("summarize " + csv + " --over layer,head,batch --wide --metrics angle --table");
  INFO(table.output);
  REQUIRE(table.exit_code == 0);
  const std::vector<std::string> lines = split(trim(table.output), '\n');
  REQUIRE(lines.size() == 3);  // the header, performer(M=8) and performer(M=32), angle only
  CHECK_THAT(lines[0], Catch::Contains("n=64") && Catch::Contains("n=128"));
  CHECK_THAT(lines[1], Catch::Contains("performer(M=8)") && Catch::Contains(" angle "));
  CHECK_THAT(table.output, !Catch::Contains("spec_rel") && !Catch::Contains("ortho="));
  // The CSV form: the means, one column per length.
  const auto wide_csv = run_attnprobe("summarize " + csv + " --over layer,head,batch --wide");
  CHECK(split(trim(wide_csv.output), '\n').size() == 5);  // 2 settings × 2 metrics
  // The plain table names settings briefly too; the CSV keeps canonical specs.
  CHECK_THAT(run_attnprobe("summarize " + csv + " --table").output, !Catch::Contains("ortho="));
  CHECK_THAT(run_attnprobe("summarize " + csv).output, Catch::Contains("ortho="));
  // --metrics of a name the input lacks, and --wide with another layout: usage errors.
  const auto missing = run_attnprobe("summarize " + csv + " --metrics mse");
  CHECK(missing.exit_code == 2);
  CHECK_THAT(missing.output, Catch::Contains("spec_rel,angle"));
  CHECK(run_attnprobe("summarize " + csv + " --over layer,head,batch --wide --slopes").exit_code == 2);
}
