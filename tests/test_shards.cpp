// Shards and merge in-process (sweep/shard.h, sweep/merge.h): on a grid with uneven lengths the
// shards' union, merged, is the single-process CSV byte for byte for any shard count; the deal keeps
// every shard near the mean cost; and merge refuses every way a set of shards can be wrong, saying
// which. Also the refusal of an MPI launch in a build without MPI (sweep/mpi_sweep.h).
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <numeric>

#include "attnprobe/common/error.h"
#include "attnprobe/metrics/catalogue.h"
#include "attnprobe/records/csv.h"
#include "attnprobe/sweep/merge.h"
#include "attnprobe/sweep/mpi_sweep.h"
#include "attnprobe/sweep/shard.h"
#include "attnprobe/sweep/sweep_run.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

namespace {

// Lengths out of order and of very different cost: the deal must balance n² against n.
SweepRequest uneven_request(uint64_t seed = 5, std::vector<int64_t> lengths = {16, 96, 40, 24, 64}) {
  SweepRequest request;
  request.estimators = {"vmean", "yoso(m=4)", "performer(M=8)"};
  request.lengths = std::move(lengths);
  request.trials = 2;
  request.seed = seed;
  return request;
}

const Dump& uneven_dump() {
  static const Dump dump = Dump::open(write_synth("shards.h5", synth_options(2, 3, 2, 96, 8)));
  return dump;
}

// One process of a sweep, as `sweep [--shard I/N] -o csv` runs it.
void run_part(const Dump& dump, const SweepRequest& request, ShardSpec shard, const std::string& csv) {
  const SweepPlan plan = plan_sweep(dump, request);
  ShardPlan part = plan_shard(dump, plan, unit_costs(dump, plan), shard);
  RunInfo info;
  info.dump = dump.path();
  info.seed = request.seed;
  info.plan = part.record;
  SweepRun(dump, std::move(part.plan), csv, OutputMode::kOverwrite, RunOptions{.threads = 2}, info).run();
}

std::vector<std::string> run_shards(const SweepRequest& request, int count, const std::string& stem) {
  std::vector<std::string> files;
  for (int i = 0; i < count; ++i) {
    files.push_back(temp_path(fmt::format("{}-{}.csv", stem, i)));
    run_part(uneven_dump(), request, ShardSpec{i, count}, files.back());
  }
  return files;
}

// The message of the InputError that merging `files` throws ("" when it merges).
std::string merge_error(const std::vector<std::string>& files) {
  try {
    merge_shards(files, temp_path("rejected.csv"), true, RunInfo{});
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("the merged shards of an uneven grid are the single-process CSV byte for byte", "[shards]") {
  const std::string single = temp_path("single.csv");
  run_part(uneven_dump(), uneven_request(), ShardSpec{}, single);
  const std::string expected = read_text(single);
  // 2 layers × 3 heads × 2 items × 5 lengths = 60 units, (1 + 2 + 2) trials × 9 metrics each.
  REQUIRE(read_csv(single).trials.size() == 60 * 5 * 9);
  for (int count : {1, 2, 3, 7}) {
    INFO(count << " shards");
    const std::vector<std::string> files = run_shards(uneven_request(), count, fmt::format("even{}", count));
    std::vector<std::string> shuffled(files.rbegin(), files.rend());  // the input order does not matter
    const std::string merged = temp_path(fmt::format("merged{}.csv", count));
    const MergeResult result = merge_shards(shuffled, merged, false, RunInfo{});
    CHECK(result.shards == count);
    CHECK(result.units == 60);
    CHECK(read_text(merged) == expected);
    const auto json = nlohmann::json::parse(read_text(result.info_path));
    CHECK(json["plan"]["shard"]["count"] == 1);
    CHECK(json["plan"]["units"].size() == 60);
    CHECK(json["merged_from"].size() == static_cast<size_t>(count));
  }
}

TEST_CASE("merged shards keep the case rows (trial -1) where one process writes them", "[shards]") {
  SweepRequest request = uneven_request();
  request.metrics = parse_metrics("all,case");
  const std::string single = temp_path("case-single.csv");
  run_part(uneven_dump(), request, ShardSpec{}, single);
  const CsvContents contents = read_csv(single);
  // 60 units × (5 trials × 9 metrics + 2 random settings × 3 case metrics).
  REQUIRE(contents.trials.size() == 60 * (5 * 9 + 2 * 3));
  const std::vector<std::string> files = run_shards(request, 3, "case");
  const std::string merged = temp_path("case-merged.csv");
  merge_shards(files, merged, false, RunInfo{});
  CHECK(read_text(merged) == read_text(single));
}

TEST_CASE("the deal keeps every shard within 15% of the mean estimated cost", "[shards]") {
  const Dump& dump = uneven_dump();
  const SweepPlan plan = plan_sweep(dump, uneven_request());
  const std::vector<int64_t> costs = unit_costs(dump, plan);
  REQUIRE(costs.size() == 60);
  // n = 96 costs more than n = 16 by more than the length ratio (the references are n²).
  CHECK(costs[1] > 6 * costs[0]);
  const double total = static_cast<double>(std::accumulate(costs.begin(), costs.end(), int64_t{0}));
  for (int count : {2, 3, 7}) {
    const auto deal = deal_units(costs, count);
    std::vector<size_t> all;
    double largest = 0;
    for (const auto& units : deal) {
      CHECK(std::is_sorted(units.begin(), units.end()));
      all.insert(all.end(), units.begin(), units.end());
      double cost = 0;
      for (size_t u : units) cost += static_cast<double>(costs[u]);
      largest = std::max(largest, cost);
    }
    std::sort(all.begin(), all.end());
    std::vector<size_t> expected(costs.size());
    std::iota(expected.begin(), expected.end(), size_t{0});
    CHECK(all == expected);  // every unit dealt exactly once
    // Observed largest/mean: 1.000 (2 and 3 shards), 1.013 (7 shards: 60 units, 8-9 each).
    INFO(count << " shards: largest/mean = " << std::setprecision(6) << largest / (total / count));
    CHECK(largest / (total / count) <= 1.15);
    CHECK(deal == deal_units(costs, count));  // deterministic
  }
}

TEST_CASE("shard options take I/N with 0 <= I < N", "[shards]") {
  CHECK(ShardSpec::parse("2/3").index == 2);
  CHECK(ShardSpec::parse("0/1").count == 1);
  for (const char* bad : {"3/3", "-1/3", "1", "a/3", "1/0", "1/3/4"})
    CHECK_THROWS_AS(ShardSpec::parse(bad), UsageError);
}

TEST_CASE("merge rejects missing, duplicated, foreign and truncated shards, naming the problem", "[shards]") {
  const std::vector<std::string> files = run_shards(uneven_request(), 3, "bad");
  REQUIRE(merge_error(files).empty());

  SECTION("a missing shard") { CHECK_THAT(merge_error({files[0], files[2]}), Catch::Contains("shard 1/3 is missing")); }
  SECTION("a duplicated shard") {
    const std::string copy = temp_path("copy-1.csv");
    std::filesystem::copy_file(files[1], copy, std::filesystem::copy_options::overwrite_existing);
    std::filesystem::copy_file(run_info_path(files[1]), run_info_path(copy),
                               std::filesystem::copy_options::overwrite_existing);
    CHECK_THAT(merge_error({files[0], files[1], copy, files[2]}),
               Catch::Contains("shard 1/3 is given twice") && Catch::Contains("duplicated shard"));
  }
  SECTION("a shard of another seed") {
    const std::vector<std::string> other = run_shards(uneven_request(6), 3, "seed6");
    CHECK_THAT(merge_error({files[0], other[1], files[2]}), Catch::Contains("the seed differs (5 vs 6)"));
  }
  SECTION("a shard of another grid") {
    const std::vector<std::string> other = run_shards(uneven_request(5, {16, 96, 40, 24, 32}), 3, "grid");
    CHECK_THAT(merge_error({files[0], other[1], files[2]}), Catch::Contains("the grid") && Catch::Contains("differs"));
  }
  SECTION("a truncated shard: cut inside a row") {
    const std::string text = read_text(files[1]);
    std::ofstream(files[1], std::ios::binary) << text.substr(0, text.size() / 2 + 3);
    CHECK_THAT(merge_error(files), Catch::Contains("truncated shard") && Catch::Contains("bad-1.csv"));
  }
  SECTION("a truncated shard: whole rows missing") {
    const std::string text = read_text(files[2]);
    std::ofstream(files[2], std::ios::binary) << text.substr(0, text.rfind('\n', text.size() - 2) + 1);
    CHECK_THAT(merge_error(files), Catch::Contains("bad-2.csv' (shard 2/3) lacks rows") && Catch::Contains("case "));
  }
  SECTION("a shard that never finished") {
    auto json = nlohmann::json::parse(read_text(run_info_path(files[0])));
    json["finished"] = nullptr;
    std::ofstream(run_info_path(files[0])) << json.dump(2);
    CHECK_THAT(merge_error(files), Catch::Contains("never finished") && Catch::Contains("truncated shard"));
  }
  SECTION("a duplicated row and a foreign row") {
    const std::string text = read_text(files[0]);
    const std::string last = text.substr(text.rfind('\n', text.size() - 2) + 1);
    std::ofstream(files[0], std::ios::binary | std::ios::app) << last;
    CHECK_THAT(merge_error(files), Catch::Contains("duplicated row") && Catch::Contains("case layer="));
    std::ofstream(files[0], std::ios::binary) << text << read_text(files[1]).substr(read_text(files[1]).find('\n') + 1);
    CHECK_THAT(merge_error(files), Catch::Contains("holds a row of shard 1/3"));
  }
  SECTION("a shard without run.json") {
    std::filesystem::remove(run_info_path(files[1]));
    CHECK_THAT(merge_error(files), Catch::Contains("has no run.json beside it"));
  }
}

TEST_CASE("a build without MPI refuses an MPI launch of several ranks", "[shards][mpi]") {
  const MpiLaunch three{1, 3, "OMPI_COMM_WORLD_SIZE"};
  CHECK_THAT(mpi_refusal(three, false),
             Catch::Contains("built without MPI") && Catch::Contains("rank 1 of 3") && Catch::Contains("--shard I/N"));
  CHECK(mpi_refusal(three, true).empty());
  CHECK(mpi_refusal(MpiLaunch{0, 1, "PMI_SIZE"}, false).empty());  // mpirun -n 1 is one process
  CHECK(mpi_refusal(std::nullopt, false).empty());
  setenv("PMI_SIZE", "4", 1);
  setenv("PMI_RANK", "2", 1);
  const std::optional<MpiLaunch> launch = mpi_launch_from_environment();
  unsetenv("PMI_SIZE");
  unsetenv("PMI_RANK");
  if (std::getenv("OMPI_COMM_WORLD_SIZE")) SKIP_TEST("this test itself runs under mpirun");
  REQUIRE(launch);
  CHECK(launch->size == 4);
  CHECK(launch->rank == 2);
  CHECK(launch->variable == "PMI_SIZE");
}

TEST_CASE("sweep --shard and merge on the command line", "[shards][cli]") {
  const std::string dump = write_synth("shards-cli.h5", synth_options(1, 2, 2, 64, 8));
  const std::string grid = " -e vmean -e 'yoso(m=4)' --lengths 16,64,32 --trials 2 -q ";
  const auto dry = run_attnprobe("sweep " + dump + grid + "--dry-run --shard 1/2 -o " + temp_path("unused.csv"));
  INFO(dry.output);
  REQUIRE(dry.exit_code == 0);
  CHECK_THAT(dry.output, Catch::Contains("shard 0/2: ") && Catch::Contains("shard 1/2: ") &&
                             Catch::Contains("units of shard 1/2:") && Catch::Contains("layer=0 head="));
  CHECK(!std::filesystem::exists(temp_path("unused.csv")));
  CHECK(run_attnprobe("sweep " + dump + grid + "--shard 2/2 -o " + temp_path("x.csv")).exit_code == 2);

  const std::string single = temp_path("cli-single.csv");
  REQUIRE(run_attnprobe("sweep " + dump + grid + "-o " + single).exit_code == 0);
  std::string shards;
  for (int i = 0; i < 2; ++i) {
    const std::string shard = temp_path(fmt::format("cli-shard-{}.csv", i));
    fmt::format_to(std::back_inserter(shards), " {}", shard);  // not " " + text: a GCC 12 -Wrestrict false alarm
    REQUIRE(run_attnprobe(fmt::format("sweep {}{}--shard {}/2 -o {}", dump, grid, i, shard)).exit_code == 0);
  }
  const std::string merged = temp_path("cli-merged.csv");
  const auto ok = run_attnprobe("merge -o " + merged + shards);
  INFO(ok.output);
  REQUIRE(ok.exit_code == 0);
  CHECK_THAT(ok.output, Catch::Contains("merged 2 shards (12 units"));
  CHECK(read_text(merged) == read_text(single));
  CHECK(run_attnprobe("merge -o " + merged + shards).exit_code == 2);  // exists: --overwrite
  const auto missing = run_attnprobe("merge --overwrite -o " + merged + " " + temp_path("cli-shard-0.csv"));
  CHECK(missing.exit_code == 3);
  CHECK_THAT(missing.output, Catch::Contains("shard 1/2 is missing"));
}
