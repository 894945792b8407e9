// Exact attention: the float64 reference against an independent long-double loop, and the blocked
// float32 path against the float64 reference (n = 4096 and awkward sizes), thread-count invariance.
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include <sys/resource.h>

#include "attnprobe/common/allocator.h"
#include "attnprobe/exact/exact_attention.h"
#include "attnprobe/exact/tile_product.h"
#include "attnprobe/rng/random_stream.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

namespace {
MatrixD random_matrix(int64_t rows, int64_t cols, uint32_t purpose, double stddev = 1.0) {
  const RandomStream stream(make_random_key(3, "exact-test", purpose), Purpose::kGeneric);
  MatrixD m(rows, cols);
  for (int64_t i = 0; i < rows; ++i) {
    stream.normals(static_cast<uint32_t>(i), 0, m.row(i).data(), cols);
  }
  return m * stddev;
}

// out_i = Σ_j e^{s q_i·k_j − max} v_j / Σ_j e^{s q_i·k_j − max}, in long double, no blocking.
MatrixD naive_attention(const MatrixD& q, const MatrixD& k, const MatrixD& v, double scale) {
  MatrixD out(q.rows(), v.cols());
  for (int64_t i = 0; i < q.rows(); ++i) {
    std::vector<long double> logits(k.rows());
    long double max = -INFINITY;
    for (int64_t j = 0; j < k.rows(); ++j) {
      long double dot = 0;
      for (int64_t c = 0; c < q.cols(); ++c) dot += static_cast<long double>(q(i, c)) * k(j, c);
      logits[j] = scale * dot;
      max = std::max(max, logits[j]);
    }
    long double z = 0;
    std::vector<long double> acc(v.cols(), 0);
    for (int64_t j = 0; j < k.rows(); ++j) {
      const long double w = std::exp(logits[j] - max);
      z += w;
      for (int64_t c = 0; c < v.cols(); ++c) acc[c] += w * v(j, c);
    }
    for (int64_t c = 0; c < v.cols(); ++c) out(i, c) = static_cast<double>(acc[c] / z);
  }
  return out;
}

double relative_error(const MatrixD& reference, const MatrixD& estimate) {
  return (reference - estimate).norm() / reference.norm();
}
}  // namespace

TEST_CASE("float64 reference equals an independent long-double implementation", "[exact]") {
  for (int64_t n : {1, 7, 33, 100}) {
    const MatrixD q = random_matrix(n, 16, 0, 2.0), k = random_matrix(n, 16, 1, 2.0), v = random_matrix(n, 5, 2);
    const MatrixD ref = exact_attention_f64(q, k, v, 0.25);
    const double err = relative_error(naive_attention(q, k, v, 0.25), ref);
    // Both are float64-accurate; 1e-12 leaves room for summation order. Observed: 0 (n = 1) to 5.8e-16 (n = 100).
    INFO("n " << n << " relative error " << err);
    CHECK(err < 1e-12);
  }
}

TEST_CASE("blocked float32 attention matches float64 at n = 4096", "[exact]") {
  const int64_t n = 4096, p = 64;
  const MatrixD q = random_matrix(n, p, 10), k = random_matrix(n, p, 11), v = random_matrix(n, p, 12);
  const double scale = 1.0 / 8.0;
  const MatrixD ref = exact_attention_f64(q, k, v, scale);
  MatrixF out;
  exact_attention_f32(q.cast<float>(), k.cast<float>(), v.cast<float>(), static_cast<float>(scale), out);
  const double err = relative_error(ref, out.cast<double>());
  // Bound: float32 rounding of inputs (2^-24 ≈ 6e-8 relative), of p-term dot products and of
  // n-term sums grows like sqrt(n)·eps ≈ 64·6e-8 = 4e-6 in the worst direction; 1e-5 allows it.
  // Observed: 5.2e-7 relative (Frobenius), 19× inside the bound.
  INFO("relative error " << err);
  CHECK(err < 1e-5);
}

TEST_CASE("blocked float32 attention is right at sizes that do not fill a block", "[exact]") {
  for (int64_t n : {1, 2, 63, 65, 511, 513, 1025}) {
    const MatrixD q = random_matrix(n, 24, 20, 3.0), k = random_matrix(n, 24, 21, 3.0), v = random_matrix(n, 7, 22);
    const MatrixD ref = exact_attention_f64(q, k, v, 0.2);
    MatrixF out;
    exact_attention_f32(q.cast<float>(), k.cast<float>(), v.cast<float>(), 0.2f, out);
    REQUIRE(out.rows() == n);
    REQUIRE(out.cols() == 7);
    // Peaked logits (std 3·3·sqrt(24)·0.2 ≈ 8.8): float32 exp of large differences; observed
    // 2.5e-8 (n = 1) to 7.5e-7 (n = 1025).
    INFO("n = " << n);
    CHECK(relative_error(ref, out.cast<double>()) < 1e-5);
  }
}

TEST_CASE("float32 attention gives the same bits for any thread count", "[exact]") {
  const int64_t n = 777;
  const MatrixF q = random_matrix(n, 32, 30).cast<float>(), k = random_matrix(n, 32, 31).cast<float>(),
                v = random_matrix(n, 32, 32).cast<float>();
  MatrixF one, two;
  exact_attention_f32(q, k, v, 0.17f, one);
  ThreadPool pool(2);
  exact_attention_f32(q, k, v, 0.17f, two, &pool);
  CHECK(one == two);
  ThreadPool pool3(3);
  const MatrixD ref1 = exact_attention_f64(q.cast<double>(), k.cast<double>(), v.cast<double>(), 0.17);
  const MatrixD ref3 = exact_attention_f64(q.cast<double>(), k.cast<double>(), v.cast<double>(), 0.17, &pool3);
  CHECK(ref1 == ref3);
}

TEST_CASE("key-chunked attention: bias, log-normalisers and bits for any thread count", "[exact]") {
  // 300 query rows (three 128-row blocks) over 2600 keys (six 512-key chunks, the last partial), with a
  // per-key bias spread over ±6 nats; against the same formula in float64.
  const int64_t rows = 300, keys = 2600;
  const MatrixD q = random_matrix(rows, 24, 50), k = random_matrix(keys, 24, 51), v = random_matrix(keys, 8, 52);
  const RowVectorD bias = 6.0 * random_matrix(1, keys, 53).array().tanh().matrix();
  MatrixD logits = 0.3 * (q * k.transpose());
  logits.rowwise() += bias;
  VectorD log_norm_ref(rows);
  MatrixD weights = logits;
  for (int64_t i = 0; i < rows; ++i) {
    const double max = logits.row(i).maxCoeff();
    weights.row(i) = (logits.row(i).array() - max).exp();
    log_norm_ref(i) = max + std::log(weights.row(i).sum());
    weights.row(i) /= weights.row(i).sum();
  }
  const MatrixD ref = weights * v;
  const RowVectorF bias_f = bias.cast<float>();
  MatrixF one, two, none;
  VectorD log_norm_one, log_norm_two, log_norm_none;
  key_chunked_attention_f32(q.cast<float>(), k.cast<float>(), v.cast<float>(), 0.3f, &bias_f, one, &log_norm_one);
  // Observed 5.6e-7 (output) and 3.5e-7 (largest normaliser error, values up to 14): float32 rounding.
  CHECK(relative_error(ref, one.cast<double>()) < 1e-5);
  CHECK((log_norm_one - log_norm_ref).cwiseAbs().maxCoeff() < 1e-4);
  ThreadPool pool(2);
  key_chunked_attention_f32(q.cast<float>(), k.cast<float>(), v.cast<float>(), 0.3f, &bias_f, two, &log_norm_two,
                            &pool);
  CHECK(one == two);
  CHECK(log_norm_one == log_norm_two);
  // Values with no columns: only the normalisers, the same ones.
  key_chunked_attention_f32(q.cast<float>(), k.cast<float>(), MatrixF(keys, 0), 0.3f, &bias_f, none, &log_norm_none);
  CHECK(none.cols() == 0);
  CHECK(log_norm_none == log_norm_one);
  // Work run alongside the chunks (Nyström's pseudo-inverse): once, with or without a pool, and the
  // attention is unchanged.
  for (ThreadPool* with : {static_cast<ThreadPool*>(nullptr), &pool}) {
    std::atomic<int> runs{0};
    MatrixF beside;
    key_chunked_attention_f32(q.cast<float>(), k.cast<float>(), v.cast<float>(), 0.3f, &bias_f, beside, nullptr, with,
                              [&] { ++runs; });
    CHECK(runs == 1);
    CHECK(beside == one);
  }
  // The logits, kept for a caller that needs them again (Skeinformer's column norms): scale·q·kᵀ + bias as the
  // pass formed them, on any pool, and the attention unchanged. Observed largest error 2.3e-6 (logits up to ~15).
  for (ThreadPool* with : {static_cast<ThreadPool*>(nullptr), &pool}) {
    MatrixF kept, kept_logits;
    VectorD kept_log_norm;
    key_chunked_attention_f32(q.cast<float>(), k.cast<float>(), v.cast<float>(), 0.3f, &bias_f, kept, &kept_log_norm,
                              with, {}, &kept_logits);
    CHECK(kept == one);
    CHECK(kept_log_norm == log_norm_one);
    REQUIRE(kept_logits.rows() == rows);
    REQUIRE(kept_logits.cols() == keys);
    const double worst = (kept_logits.cast<double>() - logits).cwiseAbs().maxCoeff();
    INFO("largest logit error " << worst);
    CHECK(worst < 1e-4);
  }
}

TEST_CASE("extreme logits stay finite (the row max is subtracted)", "[exact]") {
  MatrixD q = random_matrix(50, 8, 40, 30.0), k = random_matrix(50, 8, 41, 30.0), v = random_matrix(50, 3, 42);
  const MatrixD ref = exact_attention_f64(q, k, v, 1.0);
  MatrixF out;
  exact_attention_f32(q.cast<float>(), k.cast<float>(), v.cast<float>(), 1.0f, out);
  CHECK(ref.allFinite());
  CHECK(out.allFinite());
  // Logits of magnitude ~1e4: each row is one-hot up to float32 rounding. Observed 2.6e-8.
  CHECK(relative_error(ref, out.cast<double>()) < 1e-6);
}

TEST_CASE("the thread pool runs every item once and rethrows the first failure", "[parallel]") {
  ThreadPool pool(2);
  std::vector<int> hits(1000, 0);
  pool.parallel_for(1000, [&](int64_t i) { hits[i]++; });
  CHECK(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
  CHECK_THROWS_WITH(pool.parallel_for(100,
                                      [&](int64_t i) {
                                        if (i == 42) throw std::runtime_error("item 42 failed");
                                      }),
                    "item 42 failed");
  pool.parallel_for(10, [&](int64_t i) { hits[i]++; });  // usable after a failure
  CHECK(hits[9] == 2);
}

TEST_CASE("keep_freed_memory: blocks freed and allocated again are not faulted in again", "[exact]") {
#if defined(__SANITIZE_ADDRESS__) || !defined(__GLIBC__)
  SKIP_TEST("another allocator (a sanitizer's, or not glibc's) decides this");
#else
  keep_freed_memory();
  // 12 blocks of 3 MiB, written, freed, allocated again: with glibc's adaptive thresholds the 36 MiB
  // freed at the top of the heap were returned to the kernel each round (observed ~9200 minor faults
  // per round without the call, 0 with it; each round writes 9216 pages).
  const auto minor_faults = [] {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return usage.ru_minflt;
  };
  const auto round = [] {
    std::vector<std::unique_ptr<char[]> > blocks;
    for (int i = 0; i < 12; ++i) {
      blocks.emplace_back(new char[3 << 20]);
      std::memset(blocks.back().get(), i + 1, 3 << 20);
    }
    int64_t sum = 0;
    for (const auto& block : blocks) sum += block[12345];
    return sum;
  };
  CHECK(round() == 78);  // the first round faults its pages in
  const long before = minor_faults();
  for (int i = 0; i < 4; ++i) CHECK(round() == 78);
  CHECK(minor_faults() - before < 1000);
#endif
}

TEST_CASE("the tile kernel and the transpose agree with Eigen", "[exact]") {
  // Shapes that leave partial 16-lane, 6-row and 64-column blocks, and a block of rows with an outer stride.
  for (const auto& [rows, inner, width] : {std::tuple{37, 70, 45}, {16, 16, 16}, {5, 3, 130}, {48, 64, 64}}) {
    INFO(rows << " x " << inner << " x " << width);
    const MatrixF a = random_matrix(rows + 3, inner, 60).cast<float>(),
                  b = random_matrix(inner, width, 61).cast<float>();
    MatrixF product;
    tile_product(a.middleRows(2, rows), b, product);
    const MatrixD expected = a.middleRows(2, rows).cast<double>() * b.cast<double>();
    // Float32 sums of up to 70 terms of size ~1: observed 3.7e-8 to 1.6e-7 relative.
    CHECK(relative_error(expected, product.cast<double>()) < 1e-5);
    // tile_product_assign overwrites what it writes (a NaN-filled destination) and nothing else of a wider
    // buffer (the last 5 columns of each row stay NaN).
    MatrixF wide = MatrixF::Constant(rows, width + 5, std::numeric_limits<float>::quiet_NaN());
    tile_product_assign(a.row(2).data(), inner, rows, inner, b.data(), width, width, wide.data(), width + 5);
    CHECK(wide.leftCols(width) == product);
    CHECK(wide.rightCols(5).array().isNaN().all());
    // The transpose is one multiplication per entry, as Eigen's: equal bit for bit.
    MatrixF transposed;
    transpose_scaled(a.middleRows(2, rows), 0.37f, transposed);
    const MatrixF reference = 0.37f * a.middleRows(2, rows).transpose();
    CHECK(transposed == reference);
  }
}

TEST_CASE("column sums add rows in order, as a scalar walk down each column, and column maxima are exact", "[exact]") {
  // Row by row (vectorised) in the order of a scalar walk down a column (Eigen's colwise() order): the same
  // bits; and the empty block gives what an empty reduction gives.
  const MatrixF x = random_matrix(37, 21, 70).cast<float>();
  const RowVectorF sums = column_sums(x), maxima = column_max(x);
  for (int64_t c = 0; c < x.cols(); ++c) {
    float walk = x(0, c);
    for (int64_t r = 1; r < x.rows(); ++r) walk += x(r, c);
    CHECK(sums(c) == walk);
    CHECK(maxima(c) == x.col(c).maxCoeff());
  }
  const MatrixF empty(0, 5);
  CHECK(column_sums(empty) == RowVectorF::Zero(5));
  CHECK((column_max(empty).array() == -std::numeric_limits<float>::infinity()).all());
}

TEST_CASE("add_rows_f64 gives the bits of a row-by-row float64 loop at every width and stride", "[exact]") {
  // The column statistics of the float32 estimates (segment means, mean(V), FAVOR++'s column sums) keep their
  // running sums in registers, 128 or 64 columns at a time, and take a plain loop past the panels. Each
  // column must still add its rows in order, the bits of the loop it replaced: widths around the panel
  // edges, rows `ld` apart with ld > cols (a block of a wider matrix), sums that start non-zero.
  const MatrixF wide = (random_matrix(50, 320, 72) * 5.0).cast<float>();
  for (const int64_t cols : {1, 24, 63, 64, 65, 127, 128, 129, 150, 200, 256, 300}) {
    for (const bool with_squares : {false, true}) {
      INFO("cols " << cols << (with_squares ? " with squares" : ""));
      RowVectorD sum = RowVectorD::LinSpaced(cols, -1.0, 1.0), squares = RowVectorD::Constant(cols, 0.5);
      RowVectorD loop_sum = sum, loop_squares = squares;
      for (int64_t r = 0; r < 49; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const double value = wide(r + 1, c + 3);
          loop_sum(c) += value;
          loop_squares(c) += value * value;
        }
      add_rows_f64(wide.row(1).data() + 3, wide.cols(), 49, cols, sum.data(), with_squares ? squares.data() : nullptr);
      CHECK(sum == loop_sum);
      CHECK(squares == (with_squares ? loop_squares : RowVectorD::Constant(cols, 0.5)));
    }
  }
}

TEST_CASE("float64 sums of float32 values match a long double sum at every length and tail", "[exact]") {
  // squared_norm_f64 and sum_f64 (common/matrix.h) add in eight partial sums; the independent value is a
  // sequential long double sum. Lengths around the 8-lane width (empty, tails 1–7) and long rows whose
  // values span 12 decades (where a float32 sum would lose them: float's 6e-8 against the bound 1e-14).
  const VectorD random = random_matrix(1, 4096, 71).row(0).transpose();
  for (const int64_t count : {0, 1, 7, 8, 9, 15, 64, 100, 4096}) {
    Eigen::VectorXf x(count);
    for (int64_t i = 0; i < count; ++i)
      x(i) = static_cast<float>(random(i) * std::pow(10.0, static_cast<double>(i % 13) - 6.0));
    long double squares = 0, sum = 0;
    for (int64_t i = 0; i < count; ++i) {
      squares += static_cast<long double>(x(i)) * x(i);
      sum += x(i);
    }
    INFO("count " << count);
    // Observed (relative, rounding of the partial sums in double): squares ≤ 2.0e-16 (0 up to count 64), sums
    // ≤ 5.9e-17 of Σ|x|.
    CHECK(std::abs(squared_norm_f64(x.data(), count) - static_cast<double>(squares)) <=
          1e-14 * static_cast<double>(squares));
    double magnitude = 0;
    for (int64_t i = 0; i < count; ++i) magnitude += std::abs(static_cast<double>(x(i)));
    CHECK(std::abs(sum_f64(x.data(), count) - static_cast<double>(sum)) <= 1e-14 * magnitude);
  }
}
