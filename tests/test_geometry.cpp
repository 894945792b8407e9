// Queries ≠ keys (docs/dumps.md, "Geometry"): exact attention of query rows at absolute positions against a
// longer cache of keys, under the full, causal (bottom-right aligned) and window:W masks, in float64 and
// float32, against a scalar float64 loop written from the definition; the last rows of a slice evaluated
// alone equal those of the whole slice, bit for bit.
#include <cmath>
#include <tuple>

#include "attnprobe/exact/exact_attention.h"
#include "attnprobe/rng/random_matrix.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

namespace {

// Row i at position `positions[i]` sees keys [lo, hi) by the definition of its mask: the independent loop.
MatrixD naive_attention(const MatrixD& q, const MatrixD& k, const MatrixD& v, double scale,
                        const std::vector<int64_t>& positions, Mask mask, int64_t window) {
  MatrixD out = MatrixD::Zero(q.rows(), v.cols());
  for (int64_t i = 0; i < q.rows(); ++i) {
    const int64_t t = positions[i];
    int64_t lo = 0, hi = k.rows();
    if (mask != Mask::kFull) hi = t + 1;
    if (mask == Mask::kWindow) lo = std::max<int64_t>(0, t - window + 1);
    double top = -INFINITY;
    std::vector<double> logits(hi - lo);
    for (int64_t j = lo; j < hi; ++j) top = std::max(top, logits[j - lo] = scale * q.row(i).dot(k.row(j)));
    double total = 0;
    for (int64_t j = lo; j < hi; ++j) total += std::exp(logits[j - lo] - top);
    for (int64_t j = lo; j < hi; ++j) out.row(i) += std::exp(logits[j - lo] - top) / total * v.row(j);
  }
  return out;
}

MatrixD gaussian(int64_t rows, int64_t cols, uint32_t tag) {
  return normal_rows(RandomStream(make_random_key(41, "geometry", tag), Purpose::kGeneric), rows, cols);
}

double relative(const MatrixD& a, const MatrixD& b) { return (a - b).norm() / b.norm(); }

}  // namespace

TEST_CASE("exact attention of the last rows against a longer cache matches the definition", "[geometry][exact]") {
  double worst64 = 0, worst_ratio = 0;
  for (const int64_t keys : {97, 1025, 4096})
    for (const int p : {50, 64, 128})
      for (const int64_t rows : {1, 7, 64}) {
        const MatrixD all_q = 0.5 * gaussian(keys, p, 1), k = 0.5 * gaussian(keys, p, 2), v = gaussian(keys, p, 3);
        const double scale = 1 / std::sqrt(double(p));
        const MatrixD q = all_q.bottomRows(rows);
        std::vector<int64_t> positions(rows);
        for (int64_t i = 0; i < rows; ++i) positions[i] = keys - rows + i;
        for (const auto& [mask, window] : std::vector<std::pair<Mask, int64_t>>{
                 {Mask::kFull, 0}, {Mask::kCausal, 0}, {Mask::kWindow, 1}, {Mask::kWindow, 33}, {Mask::kWindow, 600}}) {
          INFO("keys " << keys << " p " << p << " rows " << rows << " " << mask_text(mask, window));
          const QueryGeometry decode{mask, window, keys - rows, nullptr}, self{mask, window, 0, nullptr};
          const MatrixD naive = naive_attention(q, k, v, scale, positions, mask, window);
          const MatrixD f64 = exact_attention_f64(q, k, v, scale, nullptr, decode);
          worst64 = std::max(worst64, relative(f64, naive));
          CHECK(relative(f64, naive) < 1e-12);
          // float32: the decode rows against the same rows of the whole slice (full mask: the whole slice's
          // rows see every key too), which must be the very same bits.
          MatrixF f32, whole;
          exact_attention_f32(q.cast<float>(), k.cast<float>(), v.cast<float>(), float(scale), f32, nullptr, decode);
          exact_attention_f32(all_q.cast<float>(), k.cast<float>(), v.cast<float>(), float(scale), whole, nullptr,
                              self);
          CHECK(rows_identical(f32, whole.bottomRows(rows), rows));
          const double self_error = relative(whole.bottomRows(rows).cast<double>(), naive);
          CHECK(relative(f32.cast<double>(), naive) <= 2 * self_error + 1e-12);
          CHECK(self_error < 2e-6);  // float32 rounding
          worst_ratio = std::max(worst_ratio, relative(f32.cast<double>(), naive) / std::max(self_error, 1e-300));
        }
      }
  // Observed: float64 ≤ 3.6e-15 against the loop; float32 equal to the whole slice's rows (ratio 1).
  WARN("largest float64 error " << worst64 << ", largest float32 ratio to the self-attention path " << worst_ratio);
}

TEST_CASE("window masks and explicit positions in float64 and float32", "[geometry][exact]") {
  const int64_t keys = 700;
  const MatrixD q = 0.4 * gaussian(keys, 32, 4), k = 0.4 * gaussian(keys, 32, 5), v = gaussian(keys, 24, 6);
  const double scale = 0.2;
  std::vector<int64_t> every(keys);
  for (int64_t i = 0; i < keys; ++i) every[i] = i;
  for (const int64_t window : {1, 2, 100, 513, 5000}) {
    INFO("window " << window);
    const QueryGeometry self{Mask::kWindow, window, 0, nullptr};
    const MatrixD naive = naive_attention(q, k, v, scale, every, Mask::kWindow, window);
    CHECK(relative(exact_attention_f64(q, k, v, scale, nullptr, self), naive) < 1e-12);
    MatrixF f32;
    exact_attention_f32(q.cast<float>(), k.cast<float>(), v.cast<float>(), float(scale), f32, nullptr, self);
    CHECK(relative(f32.cast<double>(), naive) < 2e-6);  // float32 rounding; observed ≤ 1.3e-7
    // window:1 is each token's own value; a window past the slice is causal attention.
    if (window == 1) CHECK(relative(f32.cast<double>(), v) < 1e-6);
    if (window == 5000) {
      MatrixF causal;
      exact_attention_f32(q.cast<float>(), k.cast<float>(), v.cast<float>(), float(scale), causal, nullptr,
                          Mask::kCausal);
      CHECK(rows_identical(f32, causal, keys));
    }
  }
  // Explicit, uneven positions (a dump's q_positions): rows 3, 4, 90, 511, 512, 699.
  const std::vector<int64_t> positions = {3, 4, 90, 511, 512, 699};
  MatrixD picked(positions.size(), q.cols());
  for (size_t i = 0; i < positions.size(); ++i) picked.row(i) = q.row(positions[i]);
  for (const Mask mask : {Mask::kCausal, Mask::kWindow}) {
    const QueryGeometry geometry{mask, 64, 0, &positions};
    const MatrixD naive = naive_attention(picked, k, v, scale, positions, mask, 64);
    CHECK(relative(exact_attention_f64(picked, k, v, scale, nullptr, geometry), naive) < 1e-12);
    MatrixF f32;
    exact_attention_f32(picked.cast<float>(), k.cast<float>(), v.cast<float>(), float(scale), f32, nullptr, geometry);
    CHECK(relative(f32.cast<double>(), naive) < 2e-6);
    const MatrixD rows = attention_rows_f64(picked, k, scale, 0, picked.rows(), geometry);
    CHECK(relative(rows * v, naive) < 1e-12);
    CHECK(rows(0, 4) == 0.0);  // row at position 3 sees keys 0..3 only
  }
}

// Past one key chunk (kExactKeyChunk): the float32 kernel cuts the keys into fixed chunks aligned to key 0 and
// merges each query block's chunk states in chunk order, so that a decode step spreads over the threads
// along the cache. Every row gets the same decomposition whichever rows are evaluated, so the decode rows are
// the bits of the same rows evaluated with many others (query blocks on the whole-key-transposition, per-block
// path) and of the whole slice, on any pool. Sizes stay modest: a whole slice past a chunk is evaluated only
// where the mask keeps it cheap (causal just past one chunk on two threads, a window past two).
TEST_CASE("exact float32 decode past one key chunk: the definition, the whole slice's bits, any pool",
          "[geometry][exact][decode]") {
  const int64_t keys = 2 * kExactKeyChunk + 7232;  // 40000: three chunks, the last one partial
  const int p = 64;
  const MatrixD all_q = 0.5 * gaussian(keys, p, 7), k = 0.5 * gaussian(keys, p, 8), v = gaussian(keys, p, 9);
  const MatrixF all_qf = all_q.cast<float>(), kf = k.cast<float>(), vf = v.cast<float>();
  const float scale = 1 / std::sqrt(float(p));
  ThreadPool two(2);
  double worst = 0;
  for (const auto& [mask, window] : std::vector<std::pair<Mask, int64_t>>{
           {Mask::kFull, 0}, {Mask::kCausal, 0}, {Mask::kWindow, 600}, {Mask::kWindow, 20000}}) {
    // The last 600 rows together: five query blocks, the first cut by the absolute alignment.
    const int64_t many = 600;
    const QueryGeometry many_geometry{mask, window, keys - many, nullptr};
    MatrixF many_rows, many_rows_pooled;
    exact_attention_f32(all_qf.bottomRows(many), kf, vf, scale, many_rows, nullptr, many_geometry);
    exact_attention_f32(all_qf.bottomRows(many), kf, vf, scale, many_rows_pooled, &two, many_geometry);
    CHECK(rows_identical(many_rows, many_rows_pooled, many));
    for (const int64_t rows : {1, 7, 64}) {
      INFO(mask_text(mask, window) << " rows " << rows);
      const MatrixD q = all_q.bottomRows(rows);
      std::vector<int64_t> positions(rows);
      for (int64_t i = 0; i < rows; ++i) positions[i] = keys - rows + i;
      const QueryGeometry decode{mask, window, keys - rows, nullptr};
      MatrixF alone, pooled;
      exact_attention_f32(q.cast<float>(), kf, vf, scale, alone, nullptr, decode);
      exact_attention_f32(q.cast<float>(), kf, vf, scale, pooled, &two, decode);
      CHECK(rows_identical(alone, pooled, rows));
      CHECK(rows_identical(alone, many_rows.bottomRows(rows), rows));
      const double error = relative(alone.cast<double>(), naive_attention(q, k, v, scale, positions, mask, window));
      worst = std::max(worst, error);
      CHECK(error < 4e-6);  // float32 rounding over up to 40000 keys
    }
  }
  // Whole slices: causal across one chunk boundary, and a window of 3000 across two.
  for (const auto& [mask, window, n] : std::vector<std::tuple<Mask, int64_t, int64_t>>{
           {Mask::kCausal, 0, kExactKeyChunk + 3000}, {Mask::kWindow, 3000, keys}}) {
    INFO(mask_text(mask, window) << " whole slice of " << n);
    MatrixF whole;
    exact_attention_f32(all_qf.topRows(n), kf.topRows(n), vf.topRows(n), scale, whole, &two,
                        QueryGeometry{mask, window, 0, nullptr});
    for (const int64_t rows : {1, 7, 64}) {
      MatrixF decode;
      exact_attention_f32(all_qf.middleRows(n - rows, rows), kf.topRows(n), vf.topRows(n), scale, decode, nullptr,
                          QueryGeometry{mask, window, n - rows, nullptr});
      CHECK(rows_identical(decode, whole.bottomRows(rows), rows));
    }
  }
  // Observed: largest relative error against the float64 loop 4.6e-7 (seed 41).
  WARN("largest float32 decode error past one chunk " << worst);
}
