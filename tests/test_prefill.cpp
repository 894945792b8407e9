// --prefill P (docs/estimators/selection.md, "Prefill"): the prompt of the estimators that compress it once or replay
// a cache from it ends at P instead of at the first evaluated row; the rows between are decode steps that are not
// evaluated. The identity a test can hold it to: the last W rows of a case with its prompt ending at P are the last
// W rows of the last:(N − P) case, whose prompt ends there by default, bit for bit.
#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/records/csv.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

TEST_CASE("a lowered prefill gives the rows of the longer decode case", "[prefill][selection]") {
  HeadView whole = synth_slice(160, 12, 0.3, 71, 15);
  whole.mask = Mask::kCausal;
  const int64_t W = 8, P = 100;  // 52 decode steps, the last 8 measured
  HeadView lowered = last_rows(whole, W);
  lowered.prefill = P;
  const HeadView longer = last_rows(whole, 160 - P);
  for (const std::string spec :
       {"snapkv(window=8,budget=40)", "expected(budget=30,share=head)", "streaming(sink=2,window=10,roll=0)",
        "tova(budget=20)", "tova(budget=20,mode=prefill)", "h2o(heavy=10,window=6)",
        "magicpig(K=4,L=20,sink=2,window=5)", "topk(k=12)"}) {
    INFO(spec);
    const MatrixF a = run_estimator(spec, lowered), b = run_estimator(spec, longer);
    CHECK(rows_identical(a, b.bottomRows(W), W));
    // And the prompt really moved: the default prompt (ending at 152) gives other rows, except for topk (class A).
    const bool moved = !rows_identical(a, run_estimator(spec, last_rows(whole, W)), W);
    CHECK(moved == (spec.substr(0, 4) != "topk"));
  }
  // A prefill beyond the first evaluated row is no prompt of this case: the estimators refuse what they cannot
  // compress (the planner refuses it earlier, on the command line).
  HeadView none = last_rows(whole, W);
  none.prefill = 0;
  CHECK_THROWS_AS(run_estimator("snapkv(window=8,budget=40)", none), InputError);
}

TEST_CASE("sweep --prefill writes its cases apart and refuses what it cannot lower", "[prefill][cli]") {
  const std::string dump = write_synth("prefill.h5", synth_options(1, 1, 1, 160, 16));
  const std::string csv = temp_path("prefill.csv");
  const std::string base = "sweep " + dump + " -e 'tova(budget=20)' --mask causal --lengths 160 --metrics spec_rel ";
  REQUIRE(run_attnprobe(base + "--queries last:8 --prefill 100 --overwrite -q -o " + csv).exit_code == 0);
  const CsvContents lowered = read_csv(csv);
  REQUIRE(lowered.trials.size() == 1);
  CHECK(query_rows_text(lowered.trials[0].key.queries) == "last:8;prefill=100");
  CHECK(run_attnprobe(base + "--queries last:8 --prefill 100 --resume -q -o " + csv).exit_code == 0);
  // P = N − W is the default prompt: the plain last:8 case.
  const std::string plain = temp_path("prefill-plain.csv");
  REQUIRE(run_attnprobe(base + "--queries last:8 --prefill 152 --overwrite -q -o " + plain).exit_code == 0);
  CHECK(query_rows_text(read_csv(plain).trials[0].key.queries) == "last:8");
  for (const std::string bad :
       {"--queries last:8 --prefill 153", "--queries all --prefill 10", "--queries last:8 --prefill -2"}) {
    INFO(bad);
    const auto run = run_attnprobe(base + bad + " --overwrite -q -o " + temp_path("prefill-bad.csv"));
    CHECK(run.exit_code == 2);
    CHECK_THAT(run.output, Catch::Contains("--prefill"));
  }
}
