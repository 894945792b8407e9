#define CATCH_CONFIG_MAIN
#include "support.h"

#include "attnprobe/estimators/registry.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <numeric>
#include <sstream>

namespace attnprobe::test {

namespace {
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "attnprobe-test-XXXXXX").string();
    path = mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};
}  // namespace

const std::filesystem::path& temp_dir() {
  static TempDir dir;
  return dir.path;
}

std::string temp_path(const std::string& name) { return (temp_dir() / name).string(); }

CommandResult run_attnprobe(const std::string& args, int timeout_seconds) {
  const std::string bounded = timeout_seconds > 0 ? fmt::format("timeout -s KILL {} ", timeout_seconds) : "";
  return run_shell(bounded + attnprobe_binary() + " " + args);
}

std::string attnprobe_binary() { return ATTNPROBE_BINARY; }

CommandResult run_shell(const std::string& script) {
  const std::string command = "{ " + script + "; } 2>&1";
  CommandResult result;
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::array<char, 4096> buffer;
  size_t got;
  while ((got = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) result.output.append(buffer.data(), got);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

std::string write_synth(const std::string& name, const SynthOptions& options, StoredType type, int gzip) {
  const std::string path = temp_path(name);
  write_dump(path, make_synthetic_dump(options), DumpWriteOptions{type, gzip});
  return path;
}

std::string write_test_dump(const std::string& name, const DumpContents& contents, StoredType type) {
  const std::string path = temp_path(name);
  write_dump(path, contents, DumpWriteOptions{type, 0});
  return path;
}

SynthOptions synth_options(int layers, int heads, int batch, int64_t tokens, int dim,
                           std::vector<double> temperatures) {
  SynthOptions o;
  o.layers = layers;
  o.heads = heads;
  o.batch = batch;
  o.tokens = tokens;
  o.dim = dim;
  o.temperatures = std::move(temperatures);
  return o;
}

HeadView synth_slice(int64_t n, int p, double temperature, uint64_t seed, int pv) {
  SynthOptions o = synth_options(1, 1, 1, n, p, {temperature});
  o.value_dim = pv;
  o.seed = seed;
  const std::string path = write_synth(fmt::format("slice-{}-{}-{}-{}-{}.h5", n, p, pv, temperature, seed), o);
  return Dump::open(path).read_slice(0, 0, 0, n);
}

HeadView with_tokens_replaced(const HeadView& view, int64_t row, uint64_t seed) {
  const HeadView other = synth_slice(view.n(), static_cast<int>(view.p()), 0.3, seed, static_cast<int>(view.pv()));
  MatrixD q = view.q, k = view.k, v = view.v;
  const int64_t tail = view.n() - row;
  q.bottomRows(tail) = 3.0 * other.q.bottomRows(tail);
  k.bottomRows(tail) = -2.0 * other.k.bottomRows(tail);
  v.bottomRows(tail) = 5.0 * other.v.bottomRows(tail);
  return with_data(view, q, k, v);
}

bool rows_identical(const MatrixF& a, const MatrixF& b, int64_t rows) {
  return std::memcmp(a.data(), b.data(), sizeof(float) * rows * a.cols()) == 0;
}

MatrixF run_estimator(const std::string& spec, const HeadView& view, uint32_t trial, uint64_t key_seed) {
  MatrixF out;
  parse_spec(spec).make()->estimate(view, EstimateContext{make_random_key(key_seed, spec, trial), nullptr}, out);
  return out;
}

PooledEstimates estimate_with_pools(const std::string& spec, const HeadView& view, const RandomKey& key) {
  const auto estimator = parse_spec(spec).make();
  ThreadPool one(1), two(2);
  PooledEstimates out;
  estimator->estimate(view, EstimateContext{key, nullptr}, out.alone);
  estimator->estimate(view, EstimateContext{key, &one}, out.one_thread);
  estimator->estimate(view, EstimateContext{key, &two}, out.two_threads);
  return out;
}

std::vector<double> weighted_z_scores(const std::string& spec, const HeadView& view, const MatrixD& target, int seeds,
                                      double* mean_error, uint64_t key_seed) {
  return weighted_z_scores([&](uint32_t t) { return MatrixD(run_estimator(spec, view, t, key_seed).cast<double>()); },
                           target, seeds, mean_error);
}

std::vector<double> weighted_z_scores(const std::function<MatrixD(uint32_t trial)>& draw, const MatrixD& target,
                                      int seeds, double* mean_error) {
  const int stats = 4;
  const RandomStream s(make_random_key(3, "weights", 0), Purpose::kGeneric);
  std::vector<MatrixD> weights(stats, MatrixD(target.rows(), target.cols()));
  for (int w = 0; w < stats; ++w)
    for (int64_t i = 0; i < target.size(); ++i)
      weights[w].data()[i] = s.uniform(w, static_cast<uint32_t>(i)) < 0.5 ? -1 : 1;
  std::vector<double> sum(stats, 0), sum2(stats, 0);
  MatrixD mean = MatrixD::Zero(target.rows(), target.cols());
  for (int t = 0; t < seeds; ++t) {
    const MatrixD y = draw(static_cast<uint32_t>(t));
    mean += y / seeds;
    for (int w = 0; w < stats; ++w) {
      const double value = (weights[w].array() * y.array()).sum();
      sum[w] += value;
      sum2[w] += value * value;
    }
  }
  std::vector<double> z;
  for (int w = 0; w < stats; ++w) {
    const double m = sum[w] / seeds, var = (sum2[w] - seeds * m * m) / (seeds - 1);
    z.push_back((m - (weights[w].array() * target.array()).sum()) / std::sqrt(var / seeds));
  }
  if (mean_error) *mean_error = (mean - target).norm() / target.norm();
  return z;
}

std::vector<int64_t> stated_set(const std::string& spec, const HeadView& view, int64_t i) {
  const auto rows = make_estimator(parse_spec(spec), Device::kCpu)->weights(view, {make_random_key(1, spec, 0)})(i, 1);
  std::vector<int64_t> kept;
  for (int64_t j = 0; j < rows.cols(); ++j)
    if (rows(0, j) != 0) kept.push_back(j);
  return kept;
}

RowVectorD query_at(const HeadView& view, int64_t t) {
  return t < view.first_position ? RowVectorD(view.prompt_qf.row(t).cast<double>())
                                 : RowVectorD(view.qf.row(t - view.first_position).cast<double>());
}

std::vector<double> softmax_over(const HeadView& view, int64_t t, const std::vector<int64_t>& cache) {
  const RowVectorD q = query_at(view, t);
  std::vector<double> w(cache.size());
  double top = -INFINITY, total = 0;
  for (size_t r = 0; r < cache.size(); ++r)
    top = std::max(top, w[r] = view.scale * q.dot(view.kf.row(cache[r]).cast<double>()));
  for (double& x : w) total += x = std::exp(x - top);
  for (double& x : w) x /= total;
  return w;
}

std::vector<size_t> topk_sorted(const std::vector<double>& scores, int64_t k) {
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] > scores[b]; });
  order.resize(std::min<size_t>(order.size(), static_cast<size_t>(std::max<int64_t>(0, k))));
  std::sort(order.begin(), order.end());
  return order;
}

std::string shared_data(const std::string& name) {
  const std::filesystem::path path = std::filesystem::path(ATTNPROBE_SHARED_DATA) / name;
  return std::filesystem::exists(path) ? path.string() : "";
}

void report_skip(const std::string& why) {
  std::cout << "SKIPPED: " << why << std::endl;
  if (std::getenv("ATTNPROBE_UNDER_CTEST")) std::exit(77);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

MatrixD central_differences(MatrixD x, double h, const std::function<double(const MatrixD&)>& loss) {
  MatrixD grad(x.rows(), x.cols());
  for (int64_t e = 0; e < x.size(); ++e) {
    const double keep = x.data()[e];
    x.data()[e] = keep + h;
    const double up = loss(x);
    x.data()[e] = keep - h;
    const double down = loss(x);
    x.data()[e] = keep;
    grad.data()[e] = (up - down) / (2 * h);
  }
  return grad;
}

}  // namespace attnprobe::test
