// Deterministic mutation fuzzing (issue 12, "keep it fixed"): seeded byte-level damage of real
// dumps for the dump readers (HDF5, safetensors, .npz), and seeded character-level damage of valid strings for the
// spec, list, size and CSV parsers. Every input must either work or be refused with InputError or UsageError (exit 3 or
// 2): any other exception, a crash or a hang fails the test and prints the mutant's number, so a failure can be
// replayed. The mutants are a pure function of the seed. Each dump mutant runs in a forked child with an alarm, so a
// crash or a hang inside libhdf5 is reported as such instead of taking the test process down. Runs in seconds (CI runs
// it in the normal and in the sanitizer build).
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <random>

#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/metrics/catalogue.h"
#include "attnprobe/records/csv.h"
#include "attnprobe/report/check.h"
#include "attnprobe/sweep/budget.h"
#include "container_bytes.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

namespace {

// One mutation of `bytes`: flip bits, overwrite a run with 0x00/0xFF/random bytes, truncate,
// duplicate or delete a run, or overwrite an integer-looking field with an extreme value.
std::string mutate(std::string bytes, std::mt19937_64& rng) {
  if (bytes.empty()) return bytes;
  auto pos = [&] { return static_cast<size_t>(rng() % bytes.size()); };
  switch (rng() % 6) {
    case 0:
      for (int i = 0, flips = 1 + static_cast<int>(rng() % 8); i < flips; ++i) bytes[pos()] ^= char(1 << (rng() % 8));
      break;
    case 1: {
      const size_t start = pos(), length = 1 + rng() % 64;
      const int fill = static_cast<int>(rng() % 3);
      for (size_t i = start; i < std::min(bytes.size(), start + length); ++i)
        bytes[i] = fill == 0 ? '\0' : fill == 1 ? char(0xFF) : char(rng());
      break;
    }
    case 2:
      bytes.resize(pos());
      break;
    case 3: {
      const size_t start = pos(), length = std::min<size_t>(1 + rng() % 256, bytes.size() - start);
      bytes.insert(pos(), bytes.substr(start, length));
      break;
    }
    case 4: {
      const size_t start = pos();
      bytes.erase(start, 1 + rng() % 64);
      break;
    }
    default: {  // an 8-byte little-endian field (sizes, addresses, dims) set to an extreme
      const uint64_t values[] = {0, 1, 0xFFFFFFFFull, 0x7FFFFFFFFFFFFFFFull, ~0ull, 1ull << 40, 1000000000ull};
      const uint64_t v = values[rng() % std::size(values)];
      const size_t at = pos() & ~size_t{7};
      for (size_t i = 0; i < 8 && at + i < bytes.size(); ++i) bytes[at + i] = char((v >> (8 * i)) & 0xFF);
      break;
    }
  }
  return bytes;
}

// Opens a dump and reads every slice (a few at most), within a memory cap: what `info` does.
void read_everything(const std::string& path) {
  const Dump dump = Dump::open(path);
  for (const LayerInfo& l : dump.layers())
    for (int h = 0; h < std::min<int64_t>(l.heads, 3); ++h)
      for (int b = 0; b < std::min<int64_t>(l.batch, 3); ++b) {
        const double bytes = 12.0 * static_cast<double>(l.lengths[b]) * static_cast<double>(2 * l.dim + l.value_dim);
        if (bytes > 256e6) continue;  // the CLI's --max-memory refuses this; the fuzz run does not allocate it
        dump.read_slice(l.number, h, b, l.lengths[b]);
      }
}

enum ChildResult { kClean = 0, kUnexpectedException = 1 };

}  // namespace

TEST_CASE("mutated dumps are read or refused with an input error, never a crash or hang", "[fuzz][dump]") {
  struct Seed {
    std::string name;
    SynthOptions options;
    StoredType type;
    int gzip;
  };
  const std::vector<Seed> seeds = {
      {"fuzz-f32.h5", synth_options(2, 2, 2, 24, 4), StoredType::kFloat32, 0},
      {"fuzz-f16-gzip.h5", synth_options(1, 2, 1, 32, 4), StoredType::kFloat16, 4},
      {"fuzz-f64.h5", synth_options(1, 1, 2, 16, 8), StoredType::kFloat64, 0},
  };
  // The same container-independent reader behind safetensors and .npz (stored and deflated) seeds:
  // one layer, 2 heads (1 kv head), 16 tokens, p = 4.
  std::vector<std::pair<std::string, std::string>> originals;
  for (const Seed& seed : seeds)
    originals.emplace_back(seed.name, read_text(write_synth(seed.name, seed.options, seed.type, seed.gzip)));
  {
    std::vector<float> q(2 * 16 * 4), kv(16 * 4);
    for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.37f * static_cast<float>(i));
    for (size_t i = 0; i < kv.size(); ++i) kv[i] = std::cos(0.23f * static_cast<float>(i));
    originals.emplace_back("fuzz.safetensors", safetensors_file({{"layer_00.q", "F32", {1, 2, 16, 4}, raw_bytes(q)},
                                                                 {"layer_00.k", "F32", {1, 1, 16, 4}, raw_bytes(kv)},
                                                                 {"layer_00.v", "F32", {1, 1, 16, 4}, raw_bytes(kv)}},
                                                                {{"layer_00.scale", "0.5"}}));
    const std::vector<std::pair<std::string, std::string>> arrays = {
        {"layer_00.q.npy", npy_bytes("<f4", {1, 2, 16, 4}, raw_bytes(q))},
        {"layer_00.k.npy", npy_bytes("<f4", {1, 1, 16, 4}, raw_bytes(kv))},
        {"layer_00.v.npy", npy_bytes("<f4", {1, 1, 16, 4}, raw_bytes(kv))},
        {"layer_00.lengths.npy", npy_bytes("<i8", {1}, raw_bytes(std::vector<int64_t>{12}))}};
    originals.emplace_back("fuzz-stored.npz", zip_file(arrays, false));
    originals.emplace_back("fuzz-deflated.npz", zip_file(arrays, true));
  }
  constexpr int kMutantsPerSeed = 200;  // 1200 in all: about 20 s (Release), 80 s (ASan) on one core
  int crashes = 0, hangs = 0, unexpected = 0, refused = 0, read = 0;
  for (size_t s = 0; s < originals.size(); ++s) {
    const std::string& original = originals[s].second;
    std::mt19937_64 rng(1234 + s);
    for (int i = 0; i < kMutantsPerSeed; ++i) {
      std::string bytes = mutate(original, rng);
      if (rng() % 3 == 0) bytes = mutate(bytes, rng);  // a third get two mutations
      const std::string path = temp_path("mutant.h5");
      std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
      const pid_t child = fork();
      REQUIRE(child >= 0);
      if (child == 0) {
        alarm(20);
        try {
          read_everything(path);
          _exit(kClean);
        } catch (const InputError&) {
          _exit(10);
        } catch (const UsageError&) {
          _exit(10);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "mutant %s #%d: unexpected %s\n", originals[s].first.c_str(), i, e.what());
          _exit(kUnexpectedException);
        }
      }
      int status = 0;
      waitpid(child, &status, 0);
      const std::string id = fmt::format("{} mutant #{}", originals[s].first, i);
      if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) {
        ++hangs;
        FAIL_CHECK(id << " hangs (over 20 s)");
      } else if (WIFSIGNALED(status)) {
        ++crashes;
        FAIL_CHECK(id << " crashes (signal " << WTERMSIG(status) << ")");
      } else if (WEXITSTATUS(status) == kUnexpectedException) {
        ++unexpected;
        FAIL_CHECK(id << " throws something other than InputError");
      } else if (WEXITSTATUS(status) == 10) {
        ++refused;
      } else if (WEXITSTATUS(status) == kClean) {
        ++read;
      } else {
        ++crashes;
        FAIL_CHECK(id << " exits " << WEXITSTATUS(status) << " (a sanitizer report?)");
      }
    }
  }
  // Observed (Release, seeds 1234..1236): most mutants are refused, the rest hit bytes that do not matter.
  WARN(fmt::format("dump fuzz: {} mutants, {} read, {} refused, {} unexpected, {} crashes, {} hangs",
                   originals.size() * kMutantsPerSeed, read, refused, unexpected, crashes, hangs));
  CHECK(refused > 0);
}

TEST_CASE("mutated specs, lists, sizes and CSV lines parse or are refused cleanly", "[fuzz][spec]") {
  std::vector<std::string> corpus = {"8,16,32", "8..128:x2", "0..12:+4", "all", "1..4611686018427387904:x2",
                                     "512M",    "8GiB",      "1000"};
  for (const EstimatorDef* def : registered_estimators())
    for (const std::string& spec : variants(*def)) corpus.push_back(spec);
  const std::string alphabet = "()=,.:x+-eE0123456789 \"'\\abcdmMnpstyKGT_\x01\xff";
  const std::vector<std::string> tokens = {"(",
                                           ")",
                                           "=",
                                           ",",
                                           "..",
                                           ":x",
                                           ":+",
                                           "1e308",
                                           "-1",
                                           "nan",
                                           "inf",
                                           "9223372036854775807",
                                           "18446744073709551616",
                                           "1e-320",
                                           "0x10",
                                           ""};
  std::mt19937_64 rng(99);
  int accepted = 0, refused = 0;
  constexpr int kRounds = 20000;
  for (int i = 0; i < kRounds; ++i) {
    std::string text = corpus[rng() % corpus.size()];
    for (int edits = 1 + static_cast<int>(rng() % 3); edits > 0; --edits) {
      const size_t at = text.empty() ? 0 : rng() % (text.size() + 1);
      switch (rng() % 4) {
        case 0:
          text.insert(at, 1, alphabet[rng() % alphabet.size()]);
          break;
        case 1:
          if (at < text.size()) text.erase(at, 1 + rng() % 3);
          break;
        case 2:
          if (at < text.size()) text[at] = alphabet[rng() % alphabet.size()];
          break;
        default:
          text.insert(at, tokens[rng() % tokens.size()]);
          break;
      }
    }
    INFO("round " << i << ": '" << text << "'");
    auto attempt = [&](const std::function<void()>& parse) {
      try {
        parse();
        ++accepted;
      } catch (const UsageError&) {
        ++refused;
      } catch (const InputError&) {
        ++refused;
      } catch (const std::exception& e) {
        FAIL_CHECK("unexpected " << typeid(e).name() << ": " << e.what());
      }
    };
    attempt([&] {
      const Spec spec = parse_spec(text);
      CHECK(parse_spec(spec.canonical()) == spec);  // whatever parses prints back to itself
    });
    attempt([&] {
      const std::vector<int64_t> values = parse_int_list(text, "--lengths");
      CHECK(values.size() <= 1000000);
    });
    attempt([&] { parse_metrics(text); });
    attempt([&] {
      const double bytes = parse_byte_size(text, "--max-memory");  // outside CHECK: Catch would catch its throw
      CHECK(bytes > 0);
    });
    attempt([&] {
      TrialRow row;
      parse_row(trial_columns(), parse_csv_line(text + ",0,1,2,3,4,5,6,7,8,9,10,11,12"), "fuzz", row);
    });
  }
  WARN(fmt::format("parser fuzz: {} inputs x 5 parsers, {} accepted, {} refused", kRounds, accepted, refused));
  CHECK(refused > 0);
}

TEST_CASE("mutated trial and summary CSVs are read or refused cleanly by summarize and check", "[fuzz][check]") {
  const std::string dump = write_synth("fuzz-csv.h5", synth_options(1, 1, 1, 32, 4));
  const std::string trials = temp_path("fuzz-trials.csv"), summary = temp_path("fuzz-summary.csv");
  REQUIRE(run_attnprobe("sweep " + dump + " -e vmean -e 'yoso(m=4)' --lengths 16,32 --trials 3 -q -o " + trials)
              .exit_code == 0);
  REQUIRE(run_attnprobe("summarize " + trials + " -o " + summary).exit_code == 0);
  std::mt19937_64 rng(7);
  int accepted = 0, refused = 0;
  for (const std::string& source : {trials, summary}) {
    const std::string original = read_text(source);
    for (int i = 0; i < 400; ++i) {
      const std::string path = temp_path("fuzz-mutant.csv");
      std::ofstream(path, std::ios::binary | std::ios::trunc) << mutate(original, rng);
      INFO(source << " mutant " << i);
      try {
        load_gate_input(path, i % 2 == 0);
        ++accepted;
      } catch (const InputError&) {
        ++refused;
      } catch (const std::exception& e) {
        FAIL_CHECK("unexpected " << e.what());
      }
    }
  }
  WARN(fmt::format("CSV fuzz: 800 mutants, {} accepted, {} refused", accepted, refused));
  CHECK(refused > 0);
}
