#pragma once
// Shared test helpers: a private temp folder per test process, running the attnprobe binary,
// small synthetic dumps, and skips that CTest reports as skipped.
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>

#include "attnprobe/io/dump.h"
#include "attnprobe/io/dump_writer.h"
#include "attnprobe/rng/random_stream.h"
#include "attnprobe/synth/synthetic_dump.h"

namespace attnprobe::test {

/// A fresh folder, removed when the process exits (one per test process, so `ctest -j` is safe).
const std::filesystem::path& temp_dir();
std::string temp_path(const std::string& name);

struct CommandResult {
  int exit_code = -1;
  std::string output;  ///< stdout and stderr together
};
/// Runs `attnprobe ARGS` through the shell (args are passed as written). With timeout_seconds > 0 it
/// runs under `timeout -s KILL`, so a hang fails the test (exit 137) instead of stalling CTest.
CommandResult run_attnprobe(const std::string& args, int timeout_seconds = 0);
/// Runs a shell script (e.g. `ulimit -f 2; <binary> ...`), stdout and stderr together.
CommandResult run_shell(const std::string& script);
/// The attnprobe binary under test, for run_shell scripts.
std::string attnprobe_binary();

/// Writes a small synthetic dump (options as given) and returns its path.
std::string write_synth(const std::string& name, const SynthOptions& options, StoredType type = StoredType::kFloat32,
                        int gzip = 0);

/// Writes `contents` as a temporary HDF5 dump named `name` (float64 by default) and returns its path.
std::string write_test_dump(const std::string& name, const DumpContents& contents,
                            StoredType type = StoredType::kFloat64);

/// Generator options of a small synthetic dump (other fields at their defaults).
SynthOptions synth_options(int layers, int heads, int batch, int64_t tokens, int dim,
                           std::vector<double> temperatures = {0.1, 1.0});

/// Slice (0, 0, 0, n) of a one-layer synthetic dump (p, temperature, seed; 8 clusters; value dim
/// pv, 0 meaning p).
HeadView synth_slice(int64_t n, int p, double temperature, uint64_t seed = 0, int pv = 0);

/// `view` with its tokens from `row` on replaced by other data (seeded): what a later token may not
/// influence under a causal mask (the leak harnesses).
HeadView with_tokens_replaced(const HeadView& view, int64_t row, uint64_t seed);
/// Whether the first `rows` rows of a and b are equal bit for bit.
bool rows_identical(const MatrixF& a, const MatrixF& b, int64_t rows);

/// One run of `spec` on `view`, keyed by (key_seed, spec, trial).
MatrixF run_estimator(const std::string& spec, const HeadView& view, uint32_t trial = 0, uint64_t key_seed = 8);

/// `spec`'s estimate on `view` under `key` three ways: without a pool, on a 1-thread pool and on a
/// 2-thread pool; a test checks they are equal bit for bit (a pool must never change a number).
struct PooledEstimates {
  MatrixF alone, one_thread, two_threads;
};
PooledEstimates estimate_with_pools(const std::string& spec, const HeadView& view, const RandomKey& key);

/// Unbiasedness check: for 4 fixed random ±1 weightings w, the statistic Σ_e w_e·Y_e of each of
/// `seeds` iid runs (trials 0..seeds-1) gives (mean − Σ_e w_e·target_e)/se, a valid z-score; random
/// signs catch biases that would cancel in a plain sum. Also returns ‖mean − target‖/‖target‖.
std::vector<double> weighted_z_scores(const std::string& spec, const HeadView& view, const MatrixD& target, int seeds,
                                      double* mean_error = nullptr, uint64_t key_seed = 8);
/// The same statistic for any random matrix: draw(t) is run t = 0..seeds-1 (e.g. an estimator's
/// gradient); draw's result has target's shape.
std::vector<double> weighted_z_scores(const std::function<MatrixD(uint32_t trial)>& draw, const MatrixD& target,
                                      int seeds, double* mean_error = nullptr);

/// Central differences of `loss` with respect to every entry of x, at step h (the backward tests' check).
MatrixD central_differences(MatrixD x, double h, const std::function<double(const MatrixD&)>& loss);

/// The keys `spec` (seeded with trial 0 of key seed 1) states for row i: the support of its weights.
std::vector<int64_t> stated_set(const std::string& spec, const HeadView& view, int64_t i);

/// Float64 references for caches replayed over a view cut with last_rows (the prompt's rows first):
/// the query row of position t, row t's softmax over the keys `cache` (in cache order), and
/// torch.topk(scores, k) then .sort(), the positions (in the array) of the k largest, ascending, ties
/// to the lower position, the older key (the reference codes leave them to torch).
RowVectorD query_at(const HeadView& view, int64_t t);
std::vector<double> softmax_over(const HeadView& view, int64_t t, const std::vector<int64_t>& cache);
std::vector<size_t> topk_sorted(const std::vector<double>& scores, int64_t k);

/// ../shared/data/NAME, or "" when that folder is absent.
std::string shared_data(const std::string& name);

/// Prints why; under CTest exits with 77 (reported as skipped), otherwise returns (use SKIP_TEST).
void report_skip(const std::string& why);

std::string read_text(const std::string& path);

}  // namespace attnprobe::test

/// Ends the current TEST_CASE as skipped, saying why.
#define SKIP_TEST(why)                   \
  do {                                   \
    ::attnprobe::test::report_skip(why); \
    WARN("skipped: " << (why));          \
    return;                              \
  } while (0)
