// The query-rows axis of a sweep (docs/specs.md "Geometry", docs/csv.md): --queries all|last:W and
// --mask window:W through planning, the runner, the CSV, run.json, resume and merge.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <map>

#include "attnprobe/common/atomic_file.h"
#include "attnprobe/records/csv.h"
#include "attnprobe/sweep/plan.h"
#include "support.h"

namespace attnprobe {
namespace {

// A 2-head dump of 96 tokens, written once per test binary.
const std::string& causal_dump() {
  static const std::string path = test::write_synth("decode-sweep.h5", test::synth_options(1, 2, 1, 96, 16));
  return path;
}

// (spec, queries, metric) → value of the rows of one head.
std::map<std::tuple<std::string, std::string, std::string>, double> values_of(const CsvContents& csv, int head) {
  std::map<std::tuple<std::string, std::string, std::string>, double> out;
  for (const TrialRow& r : csv.trials)
    if (r.key.head.value() == head && r.trial == 0)
      out[{r.key.spec, query_rows_text(r.key.queries), r.metric}] = r.value;
  return out;
}

}  // namespace

TEST_CASE("a last:W case draws what its all case draws, and only its id says which rows it has", "[decode][sweep]") {
  const SliceRef all{0, 1, 0, 96, Mask::kCausal, 0, QueryRows{}};
  SliceRef last = all;
  last.queries = QueryRows{QueryRows::Kind::kLast, 16};
  CHECK(case_id(all, "uniform_keys(b=8)") == "layer=0;head=1;batch=0;n=96;spec=uniform_keys(b=8);mask=causal");
  CHECK(case_id(last, "uniform_keys(b=8)") ==
        "layer=0;head=1;batch=0;n=96;spec=uniform_keys(b=8);mask=causal;queries=last:16");
  CHECK(case_key(7, all, "uniform_keys(b=8)", 3).value == case_key(7, last, "uniform_keys(b=8)", 3).value);
  // A full-mask self-attention case keeps the id it had before masks and query rows existed.
  CHECK(case_id(SliceRef{0, 0, 0, 64}, "vmean") == "layer=0;head=0;batch=0;n=64;spec=vmean");
  SliceRef window = all;
  window.mask = Mask::kWindow;
  window.window = 24;
  CHECK(case_id(window, "vmean") == "layer=0;head=1;batch=0;n=96;spec=vmean;mask=window:24");
}

TEST_CASE("sweep --queries all,last:W writes both cases, the queries column, and a resumable run.json",
          "[decode][sweep][cli]") {
  const std::string csv = test::temp_path("decode-sweep.csv");
  const std::string command = fmt::format(
      "sweep {} -e softmax -e vmean -e 'uniform_keys(b=16)' -e performer --lengths 48,96 --queries all,last:16 "
      "--trials 2 --metrics spec_rel,fro_rel,row_tv,topk_recall --seed 5 --mask causal -q -o {}",
      causal_dump(), csv);
  const auto run = test::run_attnprobe(command + " --overwrite");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  const CsvContents rows = read_csv(csv);
  CHECK(test::read_text(csv).rfind("dump,layer,head,batch,n,p,mask,queries,precision,estimator", 0) == 0);
  // 2 heads × 2 lengths × 2 query sets × (softmax 1 + vmean 1 + 2 + 2 trials) × 4 metrics.
  CHECK(rows.trials.size() == 2 * 2 * 2 * 6 * 4);
  const auto head1 = values_of(rows, 1);
  // The exact decode rows against the float64 reference: float32 rounding only (observed 1.3e-7).
  CHECK(head1.at({"softmax", "last:16", "spec_rel"}) < 1e-6);
  CHECK(head1.at({"softmax", "last:16", "row_tv"}) == 0);
  // vmean's last rows are the running means of a long prefix: a different error than the whole slice's.
  CHECK(head1.at({"vmean", "last:16", "spec_rel"}) != head1.at({"vmean", "all", "spec_rel"}));
  for (const TrialRow& r : rows.trials) CHECK(std::isfinite(r.value));

  // run.json records the axis, so --resume of a cut file completes it to the same bytes.
  const std::string whole = test::read_text(csv);
  std::string cut = whole.substr(0, whole.size() * 3 / 5);
  cut = cut.substr(0, cut.rfind('\n') + 1);
  write_file_atomically(csv, cut);
  const auto resumed = test::run_attnprobe(command + " --resume");
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  CHECK(test::read_text(csv) == whole);
  // ... and refuses another query axis.
  write_file_atomically(csv, cut);
  const std::string other = fmt::format(
      "sweep {} -e softmax -e vmean -e 'uniform_keys(b=16)' -e performer --lengths 48,96 --queries all,last:8 "
      "--trials 2 --metrics spec_rel,fro_rel,row_tv,topk_recall --seed 5 --mask causal -q -o {} --resume",
      causal_dump(), csv);
  const auto refused = test::run_attnprobe(other);
  CHECK(refused.exit_code == 2);
  CHECK_THAT(refused.output, Catch::Contains("query rows"));
}

TEST_CASE("shards of a decode sweep merge into the single run's file", "[decode][sweep][cli]") {
  const std::string single = test::temp_path("decode-single.csv"), merged = test::temp_path("decode-merged.csv");
  const std::string grid = fmt::format(
      "sweep {} -e vmean -e 'uniform_keys(b=8)' --lengths 64,96 --queries last:1,last:16,all --trials 2 "
      "--metrics spec_rel --mask window:20 -q --overwrite",
      causal_dump());
  REQUIRE(test::run_attnprobe(grid + " -o " + single).exit_code == 0);
  for (int s = 0; s < 3; ++s)
    REQUIRE(test::run_attnprobe(
                grid + fmt::format(" --shard {}/3 -o {}", s, test::temp_path(fmt::format("decode-shard-{}.csv", s))))
                .exit_code == 0);
  const auto merge =
      test::run_attnprobe(fmt::format("merge -o {} {} {} {} --overwrite", merged, test::temp_path("decode-shard-0.csv"),
                                      test::temp_path("decode-shard-1.csv"), test::temp_path("decode-shard-2.csv")));
  INFO(merge.output);
  REQUIRE(merge.exit_code == 0);
  CHECK(test::read_text(merged) == test::read_text(single));
  CHECK_THAT(test::read_text(single), Catch::Contains(",window:20,last:16,"));
}

TEST_CASE("impossible query rows, and estimators or metrics without a decode form, exit 2 saying why",
          "[decode][sweep][cli]") {
  const auto too_many =
      test::run_attnprobe(fmt::format("sweep {} -e softmax --lengths 32 --queries last:40 -q -o {} --overwrite",
                                      causal_dump(), test::temp_path("decode-refused.csv")));
  CHECK(too_many.exit_code == 2);
  CHECK_THAT(too_many.output, Catch::Contains("the 32 keys") && Catch::Contains("up to 32"));
  for (const char* bad : {"last:0", "last:x", "first:4", "dump", ""}) {
    INFO(bad);
    const auto run = test::run_attnprobe(fmt::format("eval {} -e softmax --queries '{}' -q", causal_dump(), bad));
    CHECK(run.exit_code == 2);
  }
  const auto informer =
      test::run_attnprobe(fmt::format("eval {} -e informer --mask full --queries last:4 -q", causal_dump()));
  CHECK(informer.exit_code == 2);
  CHECK_THAT(informer.output,
             Catch::Contains("no decode form") && Catch::Contains("softmax, ") && Catch::Contains("uniform_keys"));
  const auto gradients = test::run_attnprobe(
      fmt::format("eval {} -e vmean --queries last:4 --metrics spec_rel,grad_v_fro_rel -q", causal_dump()));
  CHECK(gradients.exit_code == 2);
  CHECK_THAT(gradients.output, Catch::Contains("self-attention only"));
  const auto window = test::run_attnprobe(fmt::format("eval {} -e nystrom --mask window:8 -q", causal_dump()));
  CHECK(window.exit_code == 2);
  CHECK_THAT(window.output, Catch::Contains("no window form"));
  CHECK(test::run_attnprobe(fmt::format("eval {} -e vmean --mask window:0 -q", causal_dump())).exit_code == 2);
}

TEST_CASE("CSVs written before the queries column read as all", "[decode][csv]") {
  const std::string path = test::temp_path("before-queries.csv");
  write_file_atomically(path,
                        "dump,layer,head,batch,n,p,mask,estimator,spec,samples,reference,trial,seed,metric,value\n"
                        "decode-sweep.h5,0,0,0,32,16,window:8,vmean,vmean,,softmax,0,0,spec,0.5\n");
  const CsvContents old = read_csv(path);
  REQUIRE(old.trials.size() == 1);
  CHECK(old.trials[0].key.mask == Mask::kWindow);
  CHECK(old.trials[0].key.window == 8);
  CHECK(old.trials[0].key.queries.all());
  CHECK(test::run_attnprobe("summarize " + path).exit_code == 0);
  // A sweep does not append today's layout to it.
  const auto append = test::run_attnprobe(fmt::format(
      "sweep {} -e vmean --lengths 32 --mask window:8 --metrics spec -q --resume -o {}", causal_dump(), path));
  CHECK(append.exit_code != 0);
  CHECK_THAT(append.output, Catch::Contains("older attnprobe"));
}

}  // namespace attnprobe
