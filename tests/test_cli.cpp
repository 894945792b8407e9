// The attnprobe binary end to end: exit codes and messages for bad input, identical CSV for any
// thread count, resume after an interruption, no half-written rows, summarize.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "attnprobe/bench/bench.h"
#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/records/csv.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

namespace {
std::string demo_dump() {
  static const std::string path = [] {
    return write_synth("cli-demo.h5", synth_options(2, 2, 2, 96, 16, {0.2, 2.0}));
  }();
  return path;
}

std::string quote(const std::string& s) { return "'" + s + "'"; }

size_t count_lines(const std::string& text) { return std::count(text.begin(), text.end(), '\n'); }
}  // namespace

TEST_CASE("sweep writes the long CSV schema and run.json", "[cli]") {
  const std::string out = temp_path("schema.csv");
  const auto r = run_attnprobe("sweep " + demo_dump() + " -e softmax -e vmean --lengths 32,96 -q -o " + out);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const CsvContents csv = read_csv(out);
  // 2 layers × 2 heads × 2 items × 2 lengths × 2 estimators × 1 trial × 9 metrics.
  CHECK(csv.trials.size() == 2 * 2 * 2 * 2 * 2 * 9);
  CHECK(csv.trials[0].key.dump == "cli-demo.h5");
  CHECK(csv.trials[0].key.p == 16);
  const std::string info = read_text(temp_path("schema.csv.run.json"));
  CHECK_THAT(info, Catch::Contains("\"command_line\"") && Catch::Contains("\"git_hash\"") &&
                       Catch::Contains("\"threads\"") && Catch::Contains("\"seed\": 0") &&
                       Catch::Contains("\"finished\": \"20"));
  // The build's commit, read at build time: a hash read when CMake configured stayed at that commit
  // through every later one, and `merge` compares these hashes.
  std::string head;
  if (FILE* git = popen("git -C " ATTNPROBE_SOURCE_DIR " rev-parse --short=12 HEAD 2>/dev/null", "r")) {
    char line[64] = {};
    if (fgets(line, sizeof line, git) != nullptr) head = trim(line);
    pclose(git);
  }
  const std::string recorded = nlohmann::json::parse(info).at("git_hash").get<std::string>();
  if (head.empty())
    CHECK(recorded == "unknown");
  else {
    INFO("run.json says the binary was built from " << recorded << ", the tree is at " << head
                                                    << ": rebuild after committing");
    CHECK(recorded.substr(0, recorded.find('-')) == head);  // "-dirty" when tracked files had changes
  }
}

TEST_CASE("the CSV is identical for --threads 1 and --threads 2", "[cli][determinism]") {
  const std::string one = temp_path("t1.csv"), two = temp_path("t2.csv");
  const std::string grid =
      " -e softmax -e vmean -e 'yoso(m=8)' -e 'yoso(m=4,hash=hadamard)' --lengths 17,64,96 --trials 3 -q ";
  REQUIRE(run_attnprobe("sweep " + demo_dump() + grid + "--threads 1 -o " + one).exit_code == 0);
  REQUIRE(run_attnprobe("sweep " + demo_dump() + grid + "--threads 2 -o " + two).exit_code == 0);
  CHECK(read_text(one) == read_text(two));
  CHECK(count_lines(read_text(one)) > 100);
}

TEST_CASE("a filtered rerun reproduces the same rows", "[cli][determinism]") {
  const std::string all = temp_path("all.csv"), part = temp_path("part.csv");
  REQUIRE(run_attnprobe("sweep " + demo_dump() + " -e softmax --lengths 64 -q -o " + all).exit_code == 0);
  REQUIRE(
      run_attnprobe("sweep " + demo_dump() + " -e softmax --lengths 64 --layers 1 --heads 0 --batch 1 -q -o " + part)
          .exit_code == 0);
  const auto whole = read_csv(all).trials;
  const auto subset = read_csv(part).trials;
  REQUIRE(subset.size() == 9);
  for (const TrialRow& r : subset) {
    auto match = std::find_if(whole.begin(), whole.end(), [&](const TrialRow& w) {
      return w.key == r.key && w.metric == r.metric && w.trial == r.trial;
    });
    REQUIRE(match != whole.end());
    CHECK(match->value == r.value);
  }
}

TEST_CASE("an interrupted sweep resumes to the same CSV as an uninterrupted one", "[cli][resume]") {
  const std::string clean = temp_path("clean.csv"), cut = temp_path("cut.csv");
  const std::string grid = " -e softmax -e vmean --lengths 32,64 -q ";
  REQUIRE(run_attnprobe("sweep " + demo_dump() + grid + "-o " + clean).exit_code == 0);
  const std::string full = read_text(clean);
  // Simulate a kill mid-write: keep 40% of the bytes, ending inside a row.
  const size_t keep = full.size() * 2 / 5;
  REQUIRE(full[keep - 1] != '\n');
  std::ofstream(cut, std::ios::binary) << full.substr(0, keep);
  const auto refused = run_attnprobe("sweep " + demo_dump() + grid + "-o " + cut);
  CHECK(refused.exit_code == 2);
  CHECK_THAT(refused.output, Catch::Contains("--resume"));
  const auto resumed = run_attnprobe("sweep " + demo_dump() + grid + "--resume -o " + cut);
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  CHECK_THAT(resumed.output, Catch::Contains("kept"));
  CHECK(read_text(cut) == full);
  // Resuming a finished sweep runs nothing and changes nothing.
  REQUIRE(run_attnprobe("sweep " + demo_dump() + grid + "--resume -o " + cut).exit_code == 0);
  CHECK(read_text(cut) == full);
}

namespace {
// Lines of `path` that end in a newline (0 while it does not exist).
int64_t complete_lines(const std::string& path) {
  const std::string text = std::filesystem::exists(path) ? read_text(path) : std::string();
  return std::count(text.begin(), text.end(), '\n');
}

// Starts `attnprobe sweep DUMP ARGS... -o out` as a child of this process (so SIGINT is not ignored as in a
// shell's background job), its output in out + ".log", and returns once its CSV holds `rows` rows past the
// header: a test that signals it must know that trials have begun, as on a loaded machine (CTest -j2 under a
// sanitizer) the time from run.json to the first trial is not bounded by any fixed wait.
pid_t start_sweep(const std::string& dump, const std::vector<std::string>& args, const std::string& out, int64_t rows) {
  const std::string binary = attnprobe_binary(), log = out + ".log";
  std::vector<std::string> argv = {binary, "sweep", dump};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), {"-o", out});
  const pid_t child = fork();
  if (child == 0) {
    alarm(120);  // survives exec: a sweep that ignored the signal ends here, not in a CTest hang
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    std::vector<char*> raw;
    for (std::string& a : argv) raw.push_back(a.data());
    raw.push_back(nullptr);
    execv(binary.c_str(), raw.data());
    _exit(127);
  }
  const std::string info = out + ".run.json";
  int status = 0;
  for (int i = 0; i < 1200 && child > 0 && (!std::filesystem::exists(info) || complete_lines(out) < 1 + rows); ++i) {
    if (waitpid(child, &status, WNOHANG) == child) FAIL("the sweep ended before its first rows: " << read_text(log));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (complete_lines(out) < 1 + rows)
    FAIL("the sweep wrote fewer than " << rows << " rows in 60 s: " << read_text(log));
  return child;
}
}  // namespace

TEST_CASE("Ctrl-C or SIGTERM stops a sweep after its running trials, writes them and exits 130", "[cli][resume]") {
  // Rows are written per slice (one length here), so the signal must land inside a slice with trials finished:
  // 5000 short trials at n = 16 (~0.25 s on 2 threads, ~10 s under ASan beside a busy core) are written first, then
  // the signal goes 0.3 s into n = 1024's (~1.5 s; its float64 reference takes ~10 ms). Where before the handler the
  // running slice's finished trials were lost, they must be in the CSV: more rows than n = 16's alone.
  const int64_t trials = 5000;
  const std::string dump = write_synth("stopped.h5", synth_options(1, 1, 1, 1024, 32));
  for (const int signal : {SIGINT, SIGTERM}) {
    INFO("signal " << signal);
    const std::string out = temp_path(fmt::format("stopped-{}.csv", signal));
    const std::string info = temp_path(fmt::format("stopped-{}.csv.run.json", signal));
    const pid_t child = start_sweep(
        dump, {"-e", "performer(M=16)", "--lengths", "16,1024", "--trials", std::to_string(trials), "--threads", "2"},
        out, 9 * trials);
    REQUIRE(child > 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    kill(child, signal);
    int status = 0;
    waitpid(child, &status, 0);
    INFO(read_text(out + ".log"));
    REQUIRE(WIFEXITED(status));  // not killed: by the signal itself or the alarm
    CHECK(WEXITSTATUS(status) == exit_code::kInterrupted);
    CHECK_THAT(read_text(out + ".log"), Catch::Contains("rerun the same command with --resume"));
    const auto json = nlohmann::json::parse(read_text(info));
    CHECK(json["finished"].is_null());
    CHECK(json["interrupted"].is_string());
    const CsvContents rows = read_csv(out);                        // whole trials only: 9 metric rows each
    CHECK(static_cast<int64_t>(rows.trials.size()) > 9 * trials);  // observed: 1171 and 1467 of n = 1024's trials
    CHECK(static_cast<int64_t>(rows.trials.size()) < 18 * trials);
    CHECK(rows.trials.size() % 9 == 0);
    CHECK(json["rows_written"] == rows.trials.size());
  }
}

TEST_CASE("a second signal of either kind ends a stopping sweep at once", "[cli][resume]") {
  // ra(S=1024) at n = 1024 takes ~2.4 s per trial: after the first signal the sweep waits for it, and the
  // second (Ctrl-C, then a scheduler's SIGTERM, or the other way round) must not wait too. The first signal must
  // find one of n = 1024's trials running: it goes after n = 64's four trials are written (36 rows), but the time
  // from there to n = 1024's first trial (its float64 reference) has no bound on a loaded machine (CTest -j2 under a
  // sanitizer: a fixed 0.3 s fell short twice). A sweep that ends within 0.3 s of the first signal had no trial to
  // wait for (or finished it): it is run again, the first signal sent twice as late.
  const std::string dump = write_synth("slow.h5", synth_options(1, 1, 1, 1024, 32));
  for (const auto& [first, second] :
       {std::pair{SIGINT, SIGTERM}, std::pair{SIGTERM, SIGINT}, std::pair{SIGINT, SIGINT}}) {
    INFO("signals " << first << " then " << second);
    bool measured = false;
    for (int attempt = 0; attempt < 5 && !measured; ++attempt) {
      const std::string out = temp_path(fmt::format("second-{}-{}-{}.csv", first, second, attempt));
      const pid_t child = start_sweep(dump,
                                      {"-e", "ra(S=1024)", "--lengths", "64,1024", "--trials", "4", "--layers", "0",
                                       "--heads", "0", "--threads", "1"},
                                      out, 36);
      REQUIRE(child > 0);
      std::this_thread::sleep_for(std::chrono::milliseconds(300 << attempt));
      kill(child, first);
      int status = 0;
      bool ended = false;
      for (int wait = 0; wait < 30 && !ended; ++wait) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        ended = waitpid(child, &status, WNOHANG) == child;
      }
      if (ended) continue;  // no trial held it: run again, later
      const auto sent = std::chrono::steady_clock::now();
      kill(child, second);
      waitpid(child, &status, 0);
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
      INFO(read_text(out + ".log") << "waited " << waited << " s, attempt " << attempt);
      REQUIRE(WIFSIGNALED(status));
      CHECK(WTERMSIG(status) == second);
      CHECK(waited < 1);  // observed ~0.01 s; a trial takes ~2.4 s
      measured = true;
    }
    CHECK(measured);  // observed: the first attempt; under ASan beside a busy core, the first or the second
  }
}

TEST_CASE("a failure mid-sweep keeps earlier rows whole and the CSV parseable", "[cli][errors]") {
  // Layer 1 has a NaN in head 1: layer 0 (and layer 1 head 0) finish first and must stay.
  DumpContents c = make_synthetic_dump(synth_options(2, 2, 1, 40, 8));
  c.layers[1].datasets["q"].values[(1 * 40 + 7) * 8 + 2] = std::nan("");  // head 1, token 7
  const std::string dump = temp_path("nan-mid.h5");
  write_dump(dump, c, {});
  const std::string out = temp_path("partial.csv");
  const auto r = run_attnprobe("sweep " + dump + " -e vmean -q -o " + out);
  CHECK(r.exit_code == 3);
  CHECK_THAT(r.output, Catch::Contains("layer 1") && Catch::Contains("head 1") && Catch::Contains("batch item 0") &&
                           Catch::Contains("token 7"));
  const CsvContents csv = read_csv(out);
  CHECK_FALSE(csv.truncated_tail);
  CHECK(csv.trials.size() == 3 * 9);  // layer 0 heads 0 and 1, layer 1 head 0
}

TEST_CASE("bad input exits 3 and bad usage exits 2 with messages that say what to do", "[cli][errors]") {
  const std::string dump = demo_dump();
  struct Case {
    std::string args;
    int code;
    std::string says;
  };
  const std::string not_hdf5 = temp_path("plain.txt");
  std::ofstream(not_hdf5) << "hello\n";
  const std::vector<Case> cases = {
      {"info " + temp_path("missing.h5"), 3, "No such file"},
      {"info " + not_hdf5, 3, "not an HDF5 file"},
      // Estimator specs are part of the command line: usage errors (exit 2) that list the valid keys.
      {"eval " + dump + " -e nosuch", 2, "unknown estimator 'nosuch'"},
      {"eval " + dump + " -e " + quote("vmean(k=1)"), 2, "no parameter 'k'"},
      {"eval " + dump + " -e " + quote("vmean(k"), 2, "malformed spec"},
      {"eval " + dump + " -e " + quote("yoso(bogus=1)"), 2, "valid keys of 'yoso': m (integer"},
      {"eval " + dump + " -e " + quote("yoso(m=0)"), 2, "out of range. m (integer 1..65536"},
      {"eval " + dump + " -e " + quote("yoso(hash=sha)"), 2, "gauss|hadamard"},
      {"eval " + dump + " -e vmean --length 97", 3, "96 valid tokens"},
      {"sweep " + dump + " -e vmean --lengths 8..200:x2 -o " + temp_path("long.csv"), 3, "longer than"},
      {"sweep " + dump + " -e vmean --lengths 8..,16 -o " + temp_path("list.csv"), 2, "8..128:x2"},
      {"eval " + dump + " -e vmean --layers 5", 3, "layer 5 does not exist"},
      {"eval " + dump + " -e vmean --heads 0..9", 3, "head 2 does not exist"},
      {"eval " + dump + " -e vmean --metrics angle,bogus", 2, "unknown metric 'bogus'"},
      {"eval " + dump + " -e vmean --reference nosuch", 2, "unknown estimator"},
      {"eval " + dump + " -e vmean --device tpu", 2, "use cpu or cuda"},
      {"eval " + dump + " -e vmean --layout xyz", 2, "unknown --layout"},
      {"eval " + dump + " --trials 3", 2, "estimator"},
      {"sweep " + dump + " -e vmean", 2, "--output"},
      {"frobnicate", 2, "frobnicate"},
      {"summarize " + not_hdf5, 3, "not an attnprobe CSV"},
  };
  for (const Case& c : cases) {
    const auto r = run_attnprobe(c.args);
    INFO("attnprobe " << c.args << "\n" << r.output);
    CHECK(r.exit_code == c.code);
    CHECK_THAT(r.output, Catch::Contains(c.says));
  }
}

TEST_CASE("unknown names and options suggest the nearest one, exit 2", "[cli][errors][did-you-mean]") {
  const std::string dump = demo_dump(), out = temp_path("suggest.csv");
  struct Case {
    std::string args, says;
  };
  const std::vector<Case> cases = {
      {"eval " + dump + " -e performr", "Did you mean 'performer'?"},
      {"eval " + dump + " -e " + quote("performer(m=16)"), "Did you mean 'M'?"},
      {"sweep " + dump + " -e vmean --trails 3 -o " + out, "Did you mean '--trials' (for '--trails')?"},
      {"sweep " + dump + " -e vmean --trails=3 -o " + out, "Did you mean '--trials' (for '--trails')?"},
      {"eval " + dump + " -e vmean --sample 8", "Did you mean '--samples' (for '--sample')?"},
      {"list performr", "Did you mean 'performer'?"},
  };
  for (const Case& c : cases) {
    const auto r = run_attnprobe(c.args);
    INFO("attnprobe " << c.args << "\n" << r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains(c.says));
  }
  // Nothing near: CLI11's own message, no guess.
  const auto far = run_attnprobe("eval " + dump + " -e vmean --frobnicate 1");
  CHECK(far.exit_code == 2);
  CHECK_THAT(far.output, Catch::Contains("--frobnicate") && !Catch::Contains("Did you mean"));
}

TEST_CASE("eval, sweep and diagnose take --length and --lengths alike", "[cli]") {
  const std::string dump = demo_dump();
  const auto eval = run_attnprobe("eval " + dump + " -e vmean --layers 0 --lengths 64 -q");
  INFO(eval.output);
  CHECK(eval.exit_code == 0);
  CHECK_THAT(eval.output, Catch::Contains("n = 64"));
  const auto several = run_attnprobe("eval " + dump + " -e vmean --lengths 32,64 -q");
  CHECK(several.exit_code == 2);
  CHECK_THAT(several.output, Catch::Contains("one value (use sweep for several)"));
  const std::string csv = temp_path("one-length.csv");
  const auto sweep = run_attnprobe("sweep " + dump + " -e vmean --layers 0 --length 32 -q --overwrite -o " + csv);
  INFO(sweep.output);
  REQUIRE(sweep.exit_code == 0);
  const auto rows = read_csv(csv).trials;
  CHECK(!rows.empty());
  for (const TrialRow& row : rows) CHECK(row.key.n == Coordinate(32));
  const auto diagnose =
      run_attnprobe("diagnose " + dump + " --layers 0 --length 32 -o " + temp_path("one-length-diagnose.csv"));
  INFO(diagnose.output);
  CHECK(diagnose.exit_code == 0);
}

TEST_CASE("list NAME prints that estimator alone, from the registry", "[cli]") {
  const auto r = run_attnprobe("list performer");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const EstimatorDef& def = *find_estimator("performer");
  CHECK_THAT(r.output, Catch::StartsWith("performer\n") && Catch::Contains(def.summary) &&
                           Catch::Contains("docs/" + def.page) && Catch::Contains("samples knob: M") &&
                           Catch::Contains("devices: cpu") && Catch::Contains("masks") && Catch::Contains("decode:") &&
                           Catch::Contains("attention weights:") && Catch::Contains("backward:"));
  for (const ParamDef& p : def.params) CHECK_THAT(r.output, Catch::Contains(p.help));
  CHECK_THAT(r.output, !Catch::Contains("== ") && !Catch::Contains("\nyoso"));  // no family header, no other
}

TEST_CASE("device cuda fails clearly where it cannot run", "[cli][gpu]") {
  const auto r = run_attnprobe("eval " + demo_dump() + " -e vmean --device cuda -q");
  if (r.exit_code == 0) SKIP_TEST("a GPU is visible: --device cuda runs (the parity tests check it)");
  INFO(r.output);
  // No CUDA backend in the build: usage error 2; backend but no GPU: input error 3.
  CHECK((r.exit_code == 2 || r.exit_code == 3));
  CHECK_THAT(r.output, Catch::Contains("--device cuda") && Catch::Contains("--device cpu"));
}

TEST_CASE("an estimator without a CUDA version is a usage error naming those with one", "[cli][gpu]") {
  // nystrom has no CUDA version: exit 2 before any GPU is looked for, in every build.
  const auto r = run_attnprobe("eval " + demo_dump() + " -e nystrom --device cuda -q");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  // Every build knows the declared device versions, so the message is the same with or without the backend.
  CHECK_THAT(r.output, Catch::Contains("no cuda version") && Catch::Contains(join(estimators_on(Device::kCuda), ", ")));
}

TEST_CASE("a causal case on a device without its causal form is exit 2, before any GPU is looked for",
          "[causal][cli][gpu]") {
  // Exit 2 in every build: a usage error that needs no GPU to find (a missing GPU would be exit 3).
  for (const std::string command : {"sweep", "bench"}) {
    const std::string args = command == "sweep"
                                 ? fmt::format("{} -q -o {} --overwrite", demo_dump(), temp_path("c.csv"))
                                 : std::string("--lengths 64 --repeat 1 --no-sgemm");
    const auto r = run_attnprobe(command + " " + args + " -e yoso --mask causal --device cuda");
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains("--device cpu"));
    if (device_compiled(Device::kCuda)) CHECK_THAT(r.output, Catch::Contains("no causal form on cuda"));
  }
}

TEST_CASE("info prints the structure and checks values", "[cli]") {
  const auto r = run_attnprobe("info " + demo_dump() + " --entropy");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("layer_01") && Catch::Contains("float32") &&
                           Catch::Contains("all values finite") && Catch::Contains("mean entropy"));
}

TEST_CASE("eval prints one line per setting and summarize aggregates", "[cli]") {
  const std::string out = temp_path("eval.csv");
  const auto r = run_attnprobe("eval " + demo_dump() + " -e vmean -e softmax --layers 0 --length 64 -q -o " + out);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("vmean") && Catch::Contains("spec_rel") && Catch::Contains("n = 64"));
  const auto s = run_attnprobe("summarize " + out);
  REQUIRE(s.exit_code == 0);
  CHECK_THAT(s.output, Catch::StartsWith(csv_header(summary_columns())));
  // 2 heads × 2 items × 2 estimators × 9 metrics per-case rows + header.
  CHECK(count_lines(s.output) == 1 + 2 * 2 * 2 * 9);
  const auto over = run_attnprobe("summarize " + out + " --over layer,head,batch");
  REQUIRE(over.exit_code == 0);
  CHECK(count_lines(over.output) == 1 + 2 * 9);
  CHECK_THAT(over.output, Catch::Contains(",all,all,all,64,16,full,all,f32,vmean,vmean,,softmax,spec,4,"));
}

TEST_CASE("help texts teach with an example", "[cli]") {
  for (const char* cmd : {"info", "list", "eval", "sweep", "summarize", "synth", "bench"}) {
    const auto r = run_attnprobe(std::string(cmd) + " --help");
    INFO(cmd);
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.output, Catch::Contains("Example"));
  }
}

TEST_CASE("list --variants --causal prints the variants with a causal form: the causal gate's settings",
          "[cli][causal]") {
  const auto all = run_attnprobe("list --variants"), causal = run_attnprobe("list --variants --causal");
  REQUIRE(all.exit_code == 0);
  REQUIRE(causal.exit_code == 0);
  std::istringstream lines(causal.output);
  int count = 0;
  for (std::string spec; std::getline(lines, spec); ++count) {
    INFO(spec);
    CHECK(parse_spec(spec).causal());
    CHECK_THAT(all.output, Catch::Contains(spec + "\n"));
  }
  // Every variant with a causal form, and only those (the registry decides; observed 18 with uniform_keys).
  int expected = 0;
  std::istringstream every(all.output);
  for (std::string spec; std::getline(every, spec);) expected += parse_spec(spec).causal();
  CHECK(count == expected);
  CHECK_THAT(causal.output, Catch::Contains("scatterbrain(M=64,sparse=block,w=32,ext=8"));
  CHECK_THAT(causal.output, !Catch::Contains("sparse=sortlsh"));
  CHECK_THAT(causal.output, !Catch::Contains("features=oprf"));
  CHECK_THAT(causal.output, !Catch::Contains("linformer"));
}

TEST_CASE("synth writes a dump that info accepts", "[cli][synth]") {
  const std::string out = temp_path("synth-cli.h5");
  const auto r = run_attnprobe("synth -o " + out +
                               " --layers 1 --heads 1 --batch 2 --tokens 50 --valid-lengths 50,20 "
                               "--dtype float16 --gzip 6");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const auto info = run_attnprobe("info " + out);
  CHECK(info.exit_code == 0);
  CHECK_THAT(info.output, Catch::Contains("float16") && Catch::Contains("50,20"));
}

TEST_CASE("a full disk is an input error, and a device is written in place, never replaced", "[cli][errors]") {
  // A 2 KiB file-size limit (SIGXFSZ ignored, so writes fail with EFBIG): synth's HDF5 flush failed
  // and the process then crashed at exit in HDF5's cleanup, leaving a 2 KiB file; now exit 3, no file.
  const std::string big = temp_path("limited.h5");
  const auto limited = run_shell("ulimit -f 2; trap '' XFSZ; " + attnprobe_binary() + " synth -o " + big);
  INFO(limited.output);
  CHECK(limited.exit_code == 3);
  CHECK_THAT(limited.output, Catch::Contains("File too large"));
  CHECK(!std::filesystem::exists(big));
  // /dev/full: every output that took it reported success, and as root the temporary file renamed
  // over it replaced the device node with a regular file.
  if (!std::filesystem::is_character_file("/dev/full")) SKIP_TEST("no /dev/full here");
  const std::string trials = temp_path("full-trials.csv");
  REQUIRE(run_attnprobe("sweep " + demo_dump() + " -e vmean --lengths 16 --trials 1 -q -o " + trials).exit_code == 0);
  for (const std::string& args :
       std::vector<std::string>{"synth -o /dev/full", "summarize " + trials + " -o /dev/full",
                                "eval " + demo_dump() + " -e vmean --length 16 --layers 0 -o /dev/full",
                                "bench -e vmean --lengths 16 --repeat 1 --no-sgemm --csv /dev/full"}) {
    const auto r = run_attnprobe(args);
    INFO(args << ": " << r.output);
    CHECK(r.exit_code == 3);
    CHECK_THAT(r.output, Catch::Contains("'/dev/full' failed"));
    CHECK(std::filesystem::is_character_file("/dev/full"));
  }
  // Results printed to standard output: a failed write was exit 0 with the output cut (or exit 4 for
  // list); now exit 3. And a closed stdout.
  for (const std::string& args : std::vector<std::string>{"list", "summarize " + trials, "info " + demo_dump()}) {
    for (const char* redirect : {" > /dev/full", " >&-"}) {
      const auto r = run_shell(attnprobe_binary() + " " + args + redirect);
      INFO(args << redirect << ": " << r.output);
      CHECK(r.exit_code == 3);
    }
  }
  // A device that takes the bytes (/dev/null) is written, not refused.
  CHECK(run_attnprobe("summarize " + trials + " -o /dev/null").exit_code == 0);
  CHECK(std::filesystem::is_character_file("/dev/null"));
}

TEST_CASE("bench times a spec's thread counts in turn, call by call", "[bench]") {
  // The order of the calls: one untimed call of each, then rounds of one call of each, in turn.
  std::vector<int> order;
  std::vector<std::function<void()>> calls;
  for (int c = 0; c < 3; ++c) calls.push_back([&order, c] { order.push_back(c); });
  const auto times = time_interleaved(4, calls);
  CHECK(order == std::vector<int>{0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2});
  REQUIRE(times.size() == 3);
  for (const auto& [median, min] : times) {
    CHECK(min >= 0);
    CHECK(median >= min);
  }
  // A call that sleeps is timed as at least its sleep, and its neighbour, which does nothing, is not charged
  // for it (its median is the clock's cost, microseconds, against the 50 ms it would be if it were).
  const auto slow_fast =
      time_interleaved(3, {[] { std::this_thread::sleep_for(std::chrono::milliseconds(50)); }, [] {}});
  CHECK(slow_fast[0].second >= 0.05);
  CHECK(slow_fast[1].first < 0.05);
  // What runs before each timed call (run_bench wakes the pool with it) runs untimed, right before that call.
  std::vector<std::string> steps;
  const auto prepared = time_interleaved(2, {[&] { steps.push_back("a"); }, [&] { steps.push_back("b"); }},
                                         {[&] {
                                            steps.push_back("prepare a");
                                            std::this_thread::sleep_for(std::chrono::milliseconds(50));
                                          },
                                          {}});
  CHECK(steps == std::vector<std::string>{"a", "b", "prepare a", "a", "b", "prepare a", "a", "b"});
  CHECK(prepared[0].first < 0.05);

  // In the CSV a spec's rows for every thread count come together (they were measured together).
  const std::string csv = temp_path("bench-threads.csv");
  const auto r =
      run_attnprobe("bench -e vmean -e softmax --lengths 32 --threads 1,2 --repeat 1 --no-sgemm --csv " + csv);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  std::vector<std::string> specs_and_threads;
  std::istringstream lines(read_text(csv));
  std::string line;
  std::getline(lines, line);  // header
  while (std::getline(lines, line)) {
    const auto cells = split(line, ',');
    REQUIRE(cells.size() > 5);
    specs_and_threads.push_back(cells[1] + "/" + cells[5]);
  }
  CHECK(specs_and_threads == std::vector<std::string>{"vmean/1", "vmean/2", "softmax/1", "softmax/2"});
  // The pools are alive together: counts summing past the thread limit are a usage error, not 1,500 threads.
  const auto refused = run_attnprobe("bench -e vmean --lengths 32 --threads 1000,500 --repeat 1 --no-sgemm");
  CHECK(refused.exit_code == 2);
  CHECK_THAT(refused.output, Catch::Contains("sum must be at most 1024"));
}

namespace {
// The rows of `bench OPTIONS --csv FILE` after its header, which is checked; the run must succeed.
std::vector<std::string> bench_csv_rows(const std::string& options, const std::string& file) {
  const std::string csv = temp_path(file);
  const auto r = run_attnprobe("bench " + options + " --csv " + csv);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  std::istringstream lines(read_text(csv));
  std::string line;
  std::getline(lines, line);
  CHECK(line ==
        "estimator,spec,n,p,samples,threads,device,repeats,seconds_median,seconds_min,gflops,mask,pass,peak_fraction,"
        "queries,bytes_per_second,bandwidth_fraction,precision");
  std::vector<std::string> rows;
  while (std::getline(lines, line)) rows.push_back(line);
  return rows;
}
}  // namespace

TEST_CASE("bench --queries last:W times decode steps beside the measured bandwidth", "[cli][bench]") {
  // What is checked is the shape of the output, never a time (unit tests run on loaded machines).
  std::vector<std::string> rows;
  for (const std::string& line : bench_csv_rows(
           "-e softmax -e vmean --queries last:4,last:1 --lengths 64 --threads 1 --repeat 1", "bench-decode.csv")) {
    const auto cells = split(line, ',');
    REQUIRE(cells.size() == 18);
    CHECK(cells[17] == "f32");
    rows.push_back(cells[0] + "/" + cells[14]);
    if (cells[0] == "read-bandwidth") CHECK(cells[16] == "1");
    if (cells[0] == "softmax" || cells[0] == "vmean") {
      CHECK(!cells[15].empty());  // bytes per second
      CHECK(!cells[16].empty());  // over the read bandwidth
    }
    if (cells[0] == "softmax") CHECK(!cells[10].empty());  // exact attention counts W rows' flops
  }
  // No sgemm floor: it times a whole slice's n × n products.
  CHECK(rows == std::vector<std::string>{"fma-peak/all", "read-bandwidth/all", "copy-bandwidth/all", "softmax/last:4",
                                         "vmean/last:4", "softmax/last:1", "vmean/last:1"});
  const auto no_decode = run_attnprobe("bench -e nystrom --queries last:4 --lengths 64 --repeat 1");
  CHECK(no_decode.exit_code == 2);
  CHECK_THAT(no_decode.output, Catch::Contains("no decode form"));
  // vmean has a CUDA version but no decode form there: exit 2 naming the one that has (before any GPU is looked for).
  const auto cuda = run_attnprobe("bench -e vmean --device cuda --queries last:1 --lengths 64 --repeat 1");
  CHECK(cuda.exit_code == 2);
  CHECK_THAT(cuda.output, Catch::Contains("no decode full form on cuda yet (estimators with one there: softmax)"));
  const auto past = run_attnprobe("bench --queries last:65 --lengths 64 --repeat 1");
  CHECK(past.exit_code == 2);
  CHECK_THAT(past.output, Catch::Contains("past the length 64"));
}

TEST_CASE("bench times a kept-keys method's state apart from its decode step", "[cli][bench]") {
  // quest's page bounds and moba's block means are state a serving system keeps across decode steps: each gets a
  // `state` row after its forward row; exact attention and the whole-slice rows have none.
  std::vector<std::string> rows;
  for (const std::string& line :
       bench_csv_rows("-e softmax -e quest -e moba --mask causal --queries last:4,all --lengths 256 --threads 1 "
                      "--repeat 1 --no-sgemm",
                      "bench-state.csv")) {
    const std::string name = line.substr(0, line.find(','));
    const bool state = line.find(",state,") != std::string::npos, decode = line.find(",last:4,") != std::string::npos;
    rows.push_back(name + (state ? "/state" : "") + (decode ? "/last:4" : ""));
    if (state) CHECK(line.find(",causal,state,,last:4,,,f32") != std::string::npos);  // no flops, no bytes
  }
  CHECK(rows == std::vector<std::string>{"softmax/last:4", "quest/last:4", "quest/state/last:4", "moba/last:4",
                                         "moba/state/last:4", "softmax", "quest", "moba"});
}

TEST_CASE("bench --backward times backward passes and refuses estimators without one", "[cli][bench]") {
  const std::string csv = temp_path("bench-backward.csv");
  const auto r = run_attnprobe("bench --backward -e " + quote("yoso(m=4)") +
                               " -e softmax --lengths 32,64 --threads 1 --repeat 1 --csv " + csv);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::string text = read_text(csv);
  CHECK(text.rfind("estimator,spec,n,p,samples,threads,device,repeats,seconds_median,seconds_min,gflops,mask,pass,"
                   "peak_fraction,queries,bytes_per_second,bandwidth_fraction,precision\n",
                   0) == 0);
  CHECK(count_lines(text) == 5);  // header + 2 lengths x 2 estimators, no ceiling rows
  size_t backward_rows = 0;
  for (size_t at = text.find(",backward,,all,,,f32\n"); at != std::string::npos;
       at = text.find(",backward,,all,,,f32\n", at + 1))
    ++backward_rows;
  CHECK(backward_rows == 4);
  // The causal forms' backward passes: the same rows with mask causal.
  const auto causal = run_attnprobe(
      "bench --backward --mask causal -e performer -e vmean --lengths 32 --threads 1 "
      "--repeat 1 --csv " +
      csv);
  INFO(causal.output);
  CHECK(causal.exit_code == 0);
  CHECK(count_lines(read_text(csv)) == 3);
  CHECK(read_text(csv).find(",causal,backward,") != std::string::npos);
  const auto refused = run_attnprobe("bench --backward -e nystrom --lengths 32");
  CHECK(refused.exit_code == 2);
  CHECK_THAT(refused.output, Catch::Contains("has no backward pass") && !Catch::Contains("estimator "));
}
