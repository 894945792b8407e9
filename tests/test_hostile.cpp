// Hostile and careless input (issue 12): every numbered case of the hostile pass that once hung,
// crashed, exhausted memory, passed a broken gate or reported a user's mistake as a bug (exit 4).
// Each test drives the binary (exit code and message) or the library in-process, and must end in a
// clean usage error (2), input error (3) or a gate failure (1), never in a hang, a crash or exit 4.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

#include "attnprobe/common/error.h"
#include "attnprobe/common/parallel.h"
#include "attnprobe/common/text.h"
#include "attnprobe/records/csv.h"
#include "attnprobe/sweep/sweep_run.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

namespace {

std::string hostile_dump() {
  static const std::string path = [] { return write_synth("hostile-demo.h5", synth_options(1, 2, 1, 64, 8, {0.5})); }();
  return path;
}

// The hostile cases run under a time limit (support.h run_attnprobe), so a hang fails instead of stalling CTest.
CommandResult run_bounded(const std::string& args, int seconds = 60) { return run_attnprobe(args, seconds); }

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// A one-layer float32 dump written with the HDF5 API, for the files write_dump cannot make.
struct H5File {
  hid_t id;
  explicit H5File(const std::string& path) : id(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)) {}
  ~H5File() { H5Fclose(id); }
};

hid_t make_group(hid_t file, const std::string& name) {
  return H5Gcreate2(file, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
}

void write_matrix(hid_t group, const char* name, const std::vector<hsize_t>& shape, double value,
                  hid_t dcpl = H5P_DEFAULT, hid_t type = H5T_IEEE_F32LE) {
  hid_t space = H5Screate_simple(static_cast<int>(shape.size()), shape.data(), nullptr);
  hid_t ds = H5Dcreate2(group, name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  size_t total = 1;
  for (hsize_t d : shape) total *= d;
  std::vector<double> values(total);
  for (size_t i = 0; i < total; ++i) values[i] = value * (1.0 + 0.001 * static_cast<double>(i % 97));
  H5Dwrite(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
  H5Dclose(ds);
  H5Sclose(space);
}

void write_qkv(hid_t group, int64_t n = 16, int64_t p = 4, double value = 0.1) {
  for (const char* name : {"q", "k", "v"})
    write_matrix(group, name, {static_cast<hsize_t>(n), static_cast<hsize_t>(p)}, value);
}

// An attribute of any type: a scalar double, a string, or a double array.
void add_double_attribute(hid_t object, const char* name, std::vector<double> values, bool scalar = true) {
  hsize_t size = values.size();
  hid_t space = scalar ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &size, nullptr);
  hid_t attr = H5Acreate2(object, name, H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(attr, H5T_NATIVE_DOUBLE, values.data());
  H5Aclose(attr);
  H5Sclose(space);
}

void add_string_attribute(hid_t object, const char* name, const std::string& text) {
  hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, text.size());
  hid_t space = H5Screate(H5S_SCALAR);
  hid_t attr = H5Acreate2(object, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(attr, type, text.data());
  H5Aclose(attr);
  H5Sclose(space);
  H5Tclose(type);
}

// A dump whose layer_00 group gets `decorate` applied after q, k, v are written.
std::string dump_with(const std::string& name, const std::function<void(hid_t group)>& decorate, double value = 0.1) {
  const std::string path = temp_path(name);
  H5File file(path);
  hid_t group = make_group(file.id, "layer_00");
  write_qkv(group, 16, 4, value);
  decorate(group);
  H5Gclose(group);
  return path;
}

}  // namespace

// 1. A thread count the machine cannot start is refused or clamped with a message, never a hang.
TEST_CASE("a --threads count beyond what can be started is refused, not a hang", "[hostile][threads]") {
  const auto r = run_bounded("eval " + hostile_dump() + " -e softmax --length 16 --threads 100000", 60);
  INFO(r.output);
  CHECK(r.exit_code == exit_code::kUsage);
  CHECK_THAT(r.output, Catch::Contains("--threads"));
}

TEST_CASE("a thread pool that cannot start its threads throws and does not deadlock", "[hostile][threads]") {
#if defined(__SANITIZE_ADDRESS__)
  SKIP_TEST("an address-space limit cannot be combined with AddressSanitizer's shadow memory");
#else
  // In a child process, cap the address space so that thread stacks (8 MiB each) cannot be mapped,
  // then ask for 512 threads: the constructor must throw InputError and return, within the alarm.
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    alarm(30);  // a deadlock ends as SIGALRM
    rlimit limit{};
    getrlimit(RLIMIT_AS, &limit);
    limit.rlim_cur = 512ull << 20;
    setrlimit(RLIMIT_AS, &limit);
    try {
      ThreadPool pool(512);
      _exit(pool.size() == 512 ? 3 : 4);  // could not provoke a failure: inconclusive, reported below
    } catch (const InputError&) {
      _exit(0);
    } catch (...) {
      _exit(2);
    }
  }
  int status = 0;
  waitpid(child, &status, 0);
  INFO("child status " << status);
  REQUIRE(WIFEXITED(status));  // not killed by SIGALRM (a deadlock) or a crash
  CHECK(WEXITSTATUS(status) == 0);
#endif
}

// 2. Lists and grids cannot grow without bound; --dry-run says what a grid needs.
TEST_CASE("ranges near the int64 limit end without overflow", "[hostile][grid][inproc]") {
  // Before the fix each of these overflowed int64 (undefined behaviour) and grew a list without end.
  const std::vector<int64_t> doubling = parse_int_list("1..4611686018427387904:x2", "--samples");
  CHECK(doubling.size() == 63);
  CHECK(doubling.back() == int64_t{1} << 62);
  CHECK(parse_int_list("1..9223372036854775807:x3", "--samples").size() == 40);  // 3^39 < 2^63 - 1 < 3^40
  CHECK(parse_int_list("9223372036854775800..9223372036854775807:+4", "--samples") ==
        std::vector<int64_t>{9223372036854775800, 9223372036854775804});
  CHECK_THROWS_AS(parse_int_list("0..9223372036854775807:+1", "--lengths"), UsageError);
  CHECK_THROWS_AS(parse_int_list("0..999999,0..999999", "--lengths"), UsageError);  // 2 million values in all
  CHECK(parse_int_list("1..64:x2", "--lengths") == std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64});
}

TEST_CASE("a huge grid is a usage error and --dry-run says what a grid needs", "[hostile][grid]") {
  const auto lengths = run_bounded("sweep " + hostile_dump() +
                                       " -e softmax --lengths 1..4611686018427387904:x2 "
                                       "--dry-run -o " +
                                       temp_path("never.csv"),
                                   30);
  INFO(lengths.output);
  CHECK((lengths.exit_code == exit_code::kUsage || lengths.exit_code == exit_code::kInput));
  const auto trials = run_bounded(
      "sweep " + hostile_dump() + " -e 'yoso(m=4)' --trials 1000000000 --dry-run -o " + temp_path("never.csv"), 30);
  INFO(trials.output);
  CHECK(trials.exit_code == exit_code::kUsage);
  CHECK_THAT(trials.output, Catch::Contains("rows"));
  const auto dry =
      run_bounded("sweep " + hostile_dump() + " -e 'yoso(m=4)' --trials 3 --dry-run -o " + temp_path("never.csv"), 30);
  INFO(dry.output);
  CHECK(dry.exit_code == 0);
  CHECK_THAT(dry.output, Catch::Contains("rows") && Catch::Contains("memory") && Catch::Contains("GFLOP"));
}

TEST_CASE("lengths below 1 are usage errors, a repeated length counts once, and a plan of no rows is refused",
          "[hostile][grid][inproc]") {
  const Dump dump = Dump::open(hostile_dump());
  SweepRequest request;
  request.estimators = {"yoso(m=4)"};
  request.trials = 1;
  // A 0 or negative length was an input error saying it was "longer than" the dump.
  for (const int64_t bad : {int64_t{0}, int64_t{-8}}) {
    request.lengths = {16, bad};
    CHECK_THROWS_WITH(plan_sweep(dump, request), Catch::Contains("lengths must be at least 1"));
  }
  // 16,8,16: the cases of 16 were planned (and written) twice, which check refuses as two runs in one file.
  request.lengths = {16, 8, 16};
  const SweepPlan plan = plan_sweep(dump, request);
  std::vector<int64_t> planned;
  for (const SliceRef& slice : plan.slices)
    if (slice.layer == plan.slices[0].layer && slice.head == 0 && slice.batch == 0) planned.push_back(slice.n);
  CHECK(planned == std::vector<int64_t>{16, 8});
  // Only case metrics and one trial: every estimator would run and no row would be written.
  request.lengths = {16};
  request.metrics = case_metrics();
  CHECK_THROWS_WITH(plan_sweep(dump, request), Catch::Contains("would write no row"));
  request.trials = 2;
  CHECK_NOTHROW(plan_sweep(dump, request));
}

// 3. Layer group names: no exception through libhdf5's callback; ambiguous or out-of-range names.
TEST_CASE("out-of-range and ambiguous layer names are input errors naming them", "[hostile][dump]") {
  const std::string big = temp_path("biglayer.h5");
  {
    H5File file(big);
    hid_t group = make_group(file.id, "layer_99999999999");
    write_qkv(group);
    H5Gclose(group);
  }
  const auto r = run_bounded("info " + big);
  INFO(r.output);
  CHECK(r.exit_code == exit_code::kInput);
  CHECK_THAT(r.output, Catch::Contains("layer_99999999999"));

  const std::string twice = temp_path("twice.h5");
  {
    H5File file(twice);
    for (const char* name : {"layer_0", "layer_00"}) {
      hid_t group = make_group(file.id, name);
      write_qkv(group);
      H5Gclose(group);
    }
  }
  const auto t = run_bounded("info " + twice);
  INFO(t.output);
  CHECK(t.exit_code == exit_code::kInput);
  CHECK_THAT(t.output, Catch::Contains("layer_0") && Catch::Contains("layer_00"));
}

// 4. One seed type end to end.
TEST_CASE("negative or too large seeds are usage errors and 2^64-1 works end to end", "[hostile][seed]") {
  for (const char* seed : {"-1", "18446744073709551616", "1e3", "x"}) {
    const auto r = run_bounded("sweep " + hostile_dump() + " -e vmean --seed " + std::string(seed) + " -q -o " +
                               temp_path("seed-bad.csv"));
    INFO(seed << ": " << r.output);
    CHECK(r.exit_code == exit_code::kUsage);
    CHECK_THAT(r.output, Catch::Contains("--seed"));
  }
  const std::string csv = temp_path("seed-max.csv");
  const std::string grid = " -e 'yoso(m=4)' --lengths 16,32 --trials 2 --seed 18446744073709551615 -q -o " + csv;
  const auto r = run_bounded("sweep " + hostile_dump() + grid);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(read_csv(csv).trials.front().seed == std::numeric_limits<uint64_t>::max());
  CHECK(run_bounded("summarize " + csv).exit_code == 0);
  CHECK(run_bounded("check " + csv + " --baseline " + csv).exit_code == 0);
  const auto resumed = run_bounded("sweep " + hostile_dump() + grid + " --resume");
  INFO(resumed.output);
  CHECK(resumed.exit_code == 0);
}

// 5. One writer per output; a resume must continue the same grid.
TEST_CASE("a second writer of the same CSV is refused while the first runs", "[hostile][resume]") {
  const Dump dump = Dump::open(hostile_dump());
  SweepRequest request;
  request.estimators = {"yoso(m=4)"};
  request.lengths = {16};
  request.trials = 2;
  request.seed = 5;
  const std::string csv = temp_path("locked.csv");
  RunInfo info;
  info.seed = 5;
  SweepRun first(dump, plan_sweep(dump, request), csv, OutputMode::kCreate, RunOptions{.threads = 1}, info);
  std::string message = "(not refused)";
  try {
    SweepRun second(dump, plan_sweep(dump, request), csv, OutputMode::kResume, RunOptions{.threads = 1}, info);
  } catch (const InputError& e) {
    message = e.what();
  }
  CHECK_THAT(message, Catch::Contains("in use by process " + std::to_string(getpid())));
  first.run();
}

TEST_CASE("a --resume with another seed, grid or estimator set is refused", "[hostile][resume]") {
  const std::string base = " -e 'yoso(m=4)' --lengths 16,32 --trials 2 -q -o ";
  const std::string csv = temp_path("mixed.csv");
  REQUIRE(run_bounded("sweep " + hostile_dump() + base + csv + " --seed 1").exit_code == 0);
  const std::string before = read_text(csv);
  for (const std::string& other :
       {base + csv + " --seed 2", " -e 'yoso(m=8)' --lengths 16,32 --trials 2 -q -o " + csv + " --seed 1",
        " -e 'yoso(m=4)' --lengths 16,64 --trials 2 -q -o " + csv + " --seed 1"}) {
    const auto r = run_bounded("sweep " + hostile_dump() + other + " --resume");
    INFO(other << "\n" << r.output);
    CHECK(r.exit_code == exit_code::kUsage);
    CHECK_THAT(r.output, Catch::Contains("--resume"));
    CHECK(read_text(csv) == before);
  }
  // Without run.json the rows' seed column still tells.
  std::filesystem::remove(temp_path("mixed.csv.run.json"));
  const auto r = run_bounded("sweep " + hostile_dump() + base + csv + " --seed 2 --resume");
  INFO(r.output);
  CHECK(r.exit_code == exit_code::kUsage);
  CHECK(read_text(csv) == before);
  // The same command resumes.
  CHECK(run_bounded("sweep " + hostile_dump() + base + csv + " --seed 1 --resume").exit_code == 0);
}

TEST_CASE("summarize says what is wrong with a CSV of no rows or no lines", "[hostile][check]") {
  // A header without rows was "already a summary; add --over" (exit 2); bytes without a newline were
  // "empty".
  const std::string header_only = temp_path("header-only.csv"), no_line = temp_path("no-line.csv");
  write_text(header_only, csv_header(trial_columns()) + "\n");
  write_text(no_line, std::string(300, 'x'));
  const auto rows = run_bounded("summarize " + header_only);
  INFO(rows.output);
  CHECK(rows.exit_code == exit_code::kInput);
  CHECK_THAT(rows.output, Catch::Contains("a header but no rows"));
  const auto lines = run_bounded("summarize " + no_line);
  INFO(lines.output);
  CHECK(lines.exit_code == exit_code::kInput);
  CHECK_THAT(lines.output, Catch::Contains("300 bytes without a newline"));
}

TEST_CASE("a negative value of an attnprobe metric is refused by every reader", "[hostile][check]") {
  // Every metric attnprobe computes is >= 0; merge copied a hand-edited -0.5 into its output and check
  // held the next run to it.
  const std::string csv = temp_path("negative.csv"), summary = temp_path("negative-summary.csv");
  REQUIRE(
      run_bounded("sweep " + hostile_dump() + " -e vmean --lengths 16 --metrics spec_rel,mse -q -o " + csv).exit_code ==
      0);
  const std::string whole = read_text(csv);
  const std::string prefix = whole.substr(0, whole.rfind(',') + 1);
  write_text(csv, prefix + "-0.5\n");
  for (const std::string& command : {"summarize " + csv, "check " + csv + " --baseline " + csv,
                                     "merge -o " + temp_path("negative-merged.csv") + " " + csv}) {
    const auto r = run_bounded(command);
    INFO(command << ": " << r.output);
    CHECK(r.exit_code == exit_code::kInput);
    CHECK_THAT(r.output, Catch::Contains("is -0.5, but mse is never negative") && Catch::Contains("line"));
  }
  // The same in a summary's mean; and a metric attnprobe does not compute (a team's own, signed) passes.
  write_text(csv, whole);
  REQUIRE(run_bounded("summarize " + csv + " -o " + summary).exit_code == 0);
  std::string text = read_text(summary);
  const size_t mean_at = text.find(",mse,1,") + std::string(",mse,1,").size();
  text.insert(mean_at, "-");
  write_text(summary, text);
  CHECK(run_bounded("check " + csv + " --baseline " + summary).exit_code == exit_code::kInput);
  std::string own = prefix + "-0.5\n";
  own.replace(own.rfind(",mse,"), 5, ",log_gap,");
  write_text(csv, own);
  CHECK(read_csv(csv).trials.back().value == -0.5);
}

TEST_CASE("a resumed sweep keeps a row written twice once and refuses two values of one row", "[hostile][resume]") {
  const std::string args = "sweep " + hostile_dump() + " -e 'yoso(m=4)' --lengths 16 --trials 2 -q -o ";
  const std::string csv = temp_path("twice-resumed.csv");
  REQUIRE(run_bounded(args + csv).exit_code == 0);
  const std::string whole = read_text(csv);
  const std::string last = whole.substr(whole.rfind('\n', whole.size() - 2) + 1);
  // The same row again: it was kept twice, and summarize/check then refused the file.
  write_text(csv, whole + last);
  CHECK(run_bounded(args + csv + " --resume").exit_code == 0);
  CHECK(read_text(csv) == whole);
  // Another value for that row: which one is right cannot be told.
  write_text(csv, whole + last.substr(0, last.rfind(',')) + ",123\n");
  const auto r = run_bounded(args + csv + " --resume");
  INFO(r.output);
  CHECK(r.exit_code == exit_code::kInput);
  CHECK_THAT(r.output, Catch::Contains("appears twice with different values"));
}

TEST_CASE("merge refuses to write onto one of its shards", "[hostile][shards]") {
  std::string shards;
  for (int i = 0; i < 2; ++i) {
    const std::string csv = temp_path(fmt::format("onto-{}.csv", i));
    REQUIRE(run_bounded(fmt::format("sweep {} -e vmean --lengths 16 -q --shard {}/2 -o {}", hostile_dump(), i, csv))
                .exit_code == 0);
    shards += " " + csv;
  }
  const std::string first = temp_path("onto-0.csv"), before = read_text(first);
  // Under its own name and through a ./ alias: with --overwrite it replaced the shard and its run.json.
  for (const std::string& output : {first, temp_dir().string() + "/./onto-0.csv"}) {
    const auto r = run_bounded("merge --overwrite -o " + output + shards);
    INFO(r.output);
    CHECK(r.exit_code == exit_code::kUsage);
    CHECK_THAT(r.output, Catch::Contains("is the shard"));
  }
  CHECK(read_text(first) == before);
  CHECK(run_bounded("merge -o " + temp_path("onto-merged.csv") + shards).exit_code == 0);
}

// 6. The gate fails closed.
TEST_CASE("check fails closed on empty, malformed and non-finite inputs and on bad options", "[hostile][check]") {
  const std::string good = temp_path("gate-good.csv");
  REQUIRE(
      run_bounded("sweep " + hostile_dump() + " -e 'yoso(m=4)' --lengths 16,32 --trials 4 -q -o " + good).exit_code ==
      0);
  const std::string summary = temp_path("gate-good-summary.csv");
  REQUIRE(run_bounded("summarize " + good + " -o " + summary).exit_code == 0);
  const std::string text = read_text(summary);
  const std::string header = text.substr(0, text.find('\n') + 1);
  const std::string first_row = text.substr(header.size(), text.find('\n', header.size()) + 1 - header.size());
  const std::string rest = text.substr(header.size() + first_row.size());
  // The summary with its first row replaced by `row` (the other cases unchanged, so none is missing).
  auto with_row = [&](const std::string& name, const std::string& row, bool keep_rest = true) {
    const std::string path = temp_path(name);
    write_text(path, header + row + (keep_rest ? rest : ""));
    return path;
  };
  // The summary columns end in metric,count,mean,std,stderr,median,min,max: replace count, mean, stderr.
  std::vector<std::string> fields = split(first_row.substr(0, first_row.size() - 1), ',');
  const size_t n = fields.size();
  auto row_with = [&](const std::string& count, const std::string& mean, const std::string& se) {
    std::vector<std::string> f = fields;
    f[n - 7] = count;
    f[n - 6] = mean;
    f[n - 4] = se;
    return join(f, ",") + "\n";
  };

  struct Case {
    std::string what, args;
    int code;
  };
  const std::vector<Case> cases = {
      {"header-only baseline", good + " --baseline " + with_row("empty.csv", "", false), exit_code::kInput},
      {"header-only new file", with_row("empty-new.csv", "", false) + " --baseline " + good, exit_code::kInput},
      {"NaN baseline mean", good + " --baseline " + with_row("nanmean.csv", row_with("4", "nan", "0.1")),
       exit_code::kInput},
      {"inf baseline mean", good + " --baseline " + with_row("infmean.csv", row_with("4", "inf", "0.1")),
       exit_code::kInput},
      {"count 0", good + " --baseline " + with_row("count0.csv", row_with("0", "0.5", "0.1")), exit_code::kInput},
      {"hex float mean", good + " --baseline " + with_row("hexmean.csv", row_with("4", "0x1p3", "0.1")),
       exit_code::kInput},
      {"negative mean in the new file",
       with_row("negmean.csv", row_with("4", "-0.5", "0.1")) + " --baseline " + summary, exit_code::kInput},
      {"-inf in the new file", with_row("neginf.csv", row_with("4", "-inf", "0.1")) + " --baseline " + summary,
       exit_code::kInput},
      {"negative stderr", with_row("negse.csv", row_with("4", "0.5", "-0.1")) + " --baseline " + summary,
       exit_code::kInput},
      {"duplicated rows", with_row("dup.csv", first_row + first_row) + " --baseline " + summary, exit_code::kInput},
      {"last line without newline",
       with_row("nonl.csv", first_row + rest.substr(0, rest.size() - 1)) + " --baseline " + summary, exit_code::kInput},
      {"misspelt --metrics", good + " --baseline " + good + " --metrics spec_rell", exit_code::kUsage},
      {"--z nan", good + " --baseline " + good + " --z nan", exit_code::kUsage},
      {"--rtol inf", good + " --baseline " + good + " --rtol inf", exit_code::kUsage},
      {"--atol -inf", good + " --baseline " + good + " --atol -inf", exit_code::kUsage},
  };
  for (const Case& c : cases) {
    const auto r = run_bounded("check " + c.args);
    INFO(c.what << "\n" << r.output);
    CHECK(r.exit_code == c.code);
  }
  // Trial CSVs: a duplicated trial row and a negative error value are malformed too.
  const std::string trials = read_text(good);
  const size_t line1 = trials.find('\n') + 1, line2 = trials.find('\n', line1) + 1;
  const std::string dup_trials = temp_path("dup-trials.csv");
  write_text(dup_trials, trials + trials.substr(line1, line2 - line1));
  const auto d = run_bounded("check " + dup_trials + " --baseline " + good);
  INFO(d.output);
  CHECK(d.exit_code == exit_code::kInput);
  CHECK(run_bounded("check " + good + " --baseline " + good).exit_code == exit_code::kOk);
}

// 7. Attribute types and values, virtual and external storage, overflow.
TEST_CASE("bad attribute types, overflowing values and unreadable storage are input errors", "[hostile][dump]") {
  struct Case {
    std::string what, path;
    std::string needle;
  };
  std::vector<Case> cases = {
      {"scale as a string", dump_with("scale-str.h5", [](hid_t g) { add_string_attribute(g, "scale", "0.5"); }),
       "scale"},
      {"scale as an array",
       dump_with("scale-arr.h5",
                 [](hid_t g) {
                   add_double_attribute(g, "scale", {0.5, 0.5}, false);
                 }),
       "scale"},
      {"scale 1e300", dump_with("scale-big.h5", [](hid_t g) { add_double_attribute(g, "scale", {1e300}); }), "scale"},
      {"causal NaN", dump_with("causal-nan.h5", [](hid_t g) { add_double_attribute(g, "causal", {NAN}); }), "causal"},
      {"causal 0.5", dump_with("causal-half.h5", [](hid_t g) { add_double_attribute(g, "causal", {0.5}); }), "causal"},
  };
  {  // float64 values near 1e200: finite, but every score overflows
    const std::string path = temp_path("huge-values.h5");
    H5File file(path);
    hid_t group = make_group(file.id, "layer_00");
    for (const char* name : {"q", "k", "v"}) write_matrix(group, name, {16, 4}, 1e200, H5P_DEFAULT, H5T_IEEE_F64LE);
    H5Gclose(group);
    cases.push_back({"values near 1e200", path, "overflow"});
  }
  {  // a virtual dataset whose source file is missing
    const std::string path = temp_path("virtual.h5");
    H5File file(path);
    hid_t group = make_group(file.id, "layer_00");
    write_matrix(group, "q", {16, 4}, 0.1);
    write_matrix(group, "k", {16, 4}, 0.1);
    hsize_t dims[2] = {16, 4};
    hid_t space = H5Screate_simple(2, dims, nullptr);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_virtual(dcpl, space, temp_path("absent-source.h5").c_str(), "/v", space);
    hid_t ds = H5Dcreate2(group, "v", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    H5Dclose(ds);
    H5Pclose(dcpl);
    H5Sclose(space);
    H5Gclose(group);
    cases.push_back({"virtual dataset without its source", path, "absent-source.h5"});
  }
  {  // external storage in a file shorter than the dataset
    const std::string path = temp_path("external.h5");
    const std::string raw = temp_path("external.raw");
    write_text(raw, std::string(10, '\0'));
    H5File file(path);
    hid_t group = make_group(file.id, "layer_00");
    write_matrix(group, "q", {16, 4}, 0.1);
    write_matrix(group, "k", {16, 4}, 0.1);
    hsize_t dims[2] = {16, 4};
    hid_t space = H5Screate_simple(2, dims, nullptr);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_external(dcpl, raw.c_str(), 0, H5F_UNLIMITED);
    hid_t ds = H5Dcreate2(group, "v", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    H5Dclose(ds);
    H5Pclose(dcpl);
    H5Sclose(space);
    H5Gclose(group);
    write_text(raw, std::string(10, '\0'));  // HDF5 does not write external data until asked
    cases.push_back({"external file shorter than the dataset", path, "external.raw"});
  }
  for (const Case& c : cases) {
    for (const char* command : {"info ", "eval "}) {
      const std::string args =
          std::string(command) + c.path + (std::string(command) == "eval " ? " -e softmax -e vmean" : "");
      const auto r = run_bounded(args);
      INFO(c.what << " / " << command << "\n" << r.output);
      CHECK(r.exit_code == exit_code::kInput);
      CHECK_THAT(r.output, Catch::Contains(c.needle));
    }
  }
  // In range: a float64 scale, an integer scale and causal 1 are read as before.
  const std::string fine = dump_with("fine-attrs.h5", [](hid_t g) {
    add_double_attribute(g, "scale", {0.25});
    add_double_attribute(g, "causal", {1});
  });
  CHECK(run_bounded("eval " + fine + " -e softmax").exit_code == 0);
}

// 8 and 10. Declared sizes and in-range parameters that cannot fit are refused before allocating.
TEST_CASE("a tiny file declaring huge sizes is refused quickly, without exit 4", "[hostile][memory]") {
  for (const auto& shape :
       std::vector<std::vector<hsize_t>>{{10000000, 4}, {1000000000, 4}, {4, 1000000000}, {1000000, 1000000, 2, 2}}) {
    const std::string path = temp_path("declared.h5");
    {
      H5File file(path);
      hid_t group = make_group(file.id, "layer_00");
      hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
      std::vector<hsize_t> chunk(shape.size(), 1);
      chunk.back() = std::min<hsize_t>(shape.back(), 4);
      H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data());
      for (const char* name : {"q", "k", "v"}) {
        hid_t space = H5Screate_simple(static_cast<int>(shape.size()), shape.data(), nullptr);
        hid_t ds = H5Dcreate2(group, name, H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
        H5Dclose(ds);
        H5Sclose(space);
      }
      H5Pclose(dcpl);
      H5Gclose(group);
    }
    CHECK(std::filesystem::file_size(path) < 100000);
    for (const std::string& args : {"info " + path, "eval " + path + " -e softmax"}) {
      const auto r = run_bounded(args, 60);
      INFO(args << "\n" << r.output);
      CHECK(r.exit_code == exit_code::kInput);
    }
  }
}

TEST_CASE("the --max-memory limit refuses a case that needs more, with the figure and the limit", "[hostile][memory]") {
  const auto r = run_bounded("eval " + hostile_dump() + " -e 'performer(M=1048576)' --length 64 --max-memory 1G");
  INFO(r.output);
  CHECK(r.exit_code == exit_code::kInput);
  CHECK_THAT(r.output, Catch::Contains("performer(M=1048576") && Catch::Contains("GiB") && Catch::Contains("1 GiB"));
  const auto small = run_bounded("eval " + hostile_dump() + " -e softmax --length 64 --max-memory 1K");
  INFO(small.output);
  CHECK(small.exit_code == exit_code::kInput);
  CHECK(run_bounded("eval " + hostile_dump() + " -e 'performer(M=64)' --length 64 --max-memory 1G").exit_code == 0);
  const auto bad = run_bounded("eval " + hostile_dump() + " -e softmax --max-memory lots");
  CHECK(bad.exit_code == exit_code::kUsage);
}

TEST_CASE("a subnormal real in a spec is a valid value, not 'not finite'", "[hostile][spec]") {
  const auto r = run_bounded("eval " + hostile_dump() + " -e 'lara(beta=1e-320)' --length 32 --trials 1");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  double v = 0;
  CHECK(parse_real("1e-320", v));
  CHECK(v > 0);
  CHECK_FALSE(parse_real("1e400", v));
}

// 9. Output problems are input errors naming the path, leaving nothing behind.
TEST_CASE("unwritable outputs are input errors with the path and leave nothing over", "[hostile][output]") {
  const std::string file = temp_path("plain-file");
  write_text(file, "x");
  const std::string dir = temp_path("a-dir");
  std::filesystem::create_directories(dir);
  for (const std::string& out : {file + "/under.csv", dir, std::string("/dev/full")}) {
    const auto r = run_bounded("sweep " + hostile_dump() + " -e vmean --lengths 16 -q -o " + out);
    INFO(out << "\n" << r.output);
    CHECK(r.exit_code == exit_code::kInput);
    CHECK_THAT(r.output, Catch::Contains(out));
  }
  // NAME.run.json that cannot be written: no CSV and no temporary file are left.
  const std::string folder = temp_path("runjson-blocked");
  std::filesystem::create_directories(folder + "/out.csv.run.json/inside");
  const auto r = run_bounded("sweep " + hostile_dump() + " -e vmean --lengths 16 -q -o " + folder + "/out.csv");
  INFO(r.output);
  CHECK(r.exit_code == exit_code::kInput);
  CHECK_THAT(r.output, Catch::Contains("out.csv.run.json"));
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(folder)) left.push_back(entry.path().filename());
  CHECK(left == std::vector<std::string>{"out.csv.run.json"});
}

// 11. Messages that say what the problem is.
TEST_CASE("a directory as the dump and a missing filter plugin are named as such", "[hostile][dump]") {
  const std::string dir = temp_path("dump-dir.h5");
  std::filesystem::create_directories(dir);
  const auto r = run_bounded("info " + dir);
  INFO(r.output);
  CHECK(r.exit_code == exit_code::kInput);
  CHECK_THAT(r.output, Catch::Contains("is a directory"));

  // A dataset written through a filter that only this process registers: the reader lacks it.
  const std::string path = temp_path("plugin.h5");
  {
    static const H5Z_class2_t kFilter = {
        H5Z_CLASS_T_VERS,
        static_cast<H5Z_filter_t>(32123),
        1,
        1,
        "attnprobe-test-filter",
        nullptr,
        nullptr,
        [](unsigned, size_t, const unsigned[], size_t nbytes, size_t*, void**) { return nbytes; }};
    H5Zregister(&kFilter);
    H5File file(path);
    hid_t group = make_group(file.id, "layer_00");
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    hsize_t chunk[2] = {16, 4};
    H5Pset_chunk(dcpl, 2, chunk);
    H5Pset_filter(dcpl, 32123, H5Z_FLAG_MANDATORY, 0, nullptr);
    for (const char* name : {"q", "k", "v"}) write_matrix(group, name, {16, 4}, 0.1, dcpl);
    H5Pclose(dcpl);
    H5Gclose(group);
  }
  const auto f = run_bounded("info " + path);
  INFO(f.output);
  CHECK(f.exit_code == exit_code::kInput);
  CHECK_THAT(f.output, Catch::Contains("filter") && Catch::Contains("32123") && Catch::Contains("HDF5_PLUGIN_PATH"));
  CHECK_THAT(f.output, !Catch::Contains("damaged"));
}
