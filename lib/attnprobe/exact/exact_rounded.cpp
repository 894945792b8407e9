// Exact attention at FlashAttention-2's rounding points in bf16 or f16 (exact_attention.h says which points and
// why the float32 accumulations are summed in float64 and stored once).
#include <algorithm>
#include <cmath>
#include <limits>

#include "attnprobe/common/error.h"
#include "attnprobe/exact/exact_at_precision.h"
#include "attnprobe/exact/exact_attention.h"

namespace attnprobe {
namespace {

constexpr int64_t kRowsPerBlock = 32;  ///< query rows per item: their scores over the keys they see are kept

MatrixD rounded_as_double(const MatrixF& x, Precision precision) {
  MatrixF rounded = x;
  round_in_place(rounded, precision);
  return rounded.cast<double>();
}

}  // namespace

void exact_attention_rounded(const MatrixF& q, const MatrixF& k, const MatrixF& v, float scale, Precision precision,
                             MatrixF& out, ThreadPool* pool, const QueryGeometry& geometry,
                             const ScoreShaping* shaping) {
  require_usage(below_float32(precision), "exact_attention_rounded computes bf16 or f16, not {}",
                precision_name(precision));
  const int64_t n = q.rows(), keys = k.rows(), pv = v.cols();
  // Step 1: the inputs in the precision. Their products are exact in float64 (8- or 11-bit mantissas).
  const MatrixD qd = rounded_as_double(q, precision);
  const MatrixD kd = rounded_as_double(k, precision);
  const MatrixD vd = rounded_as_double(v, precision);
  const float scale_f = scale;
  const bool shaped = shaping != nullptr && shaping->any();
  // An infinite value (f16 overflow) must reach only the rows that see its key: a block's product over the keys
  // any of its rows sees would give 0·inf = NaN to the others, so then each row takes its own keys.
  const bool values_finite = first_non_finite(vd).first < 0;
  out.resize(n, pv);
  const int64_t blocks = (n + kRowsPerBlock - 1) / kRowsPerBlock;
  for_each_index(pool, blocks, [&](int64_t block) {
    const int64_t r0 = block * kRowsPerBlock, rows = std::min(kRowsPerBlock, n - r0);
    int64_t begin = keys, end = 0;
    for (int64_t i = 0; i < rows; ++i) {
      const KeyRange seen = geometry.visible(r0 + i, keys);
      begin = std::min(begin, seen.begin);
      end = std::max(end, seen.end);
    }
    const int64_t width = std::max<int64_t>(end - begin, 0);
    // Step 2: S in float32 from the exact dot products.
    const MatrixD dots = qd.middleRows(r0, rows) * kd.middleRows(begin, width).transpose();
    MatrixD weights = MatrixD::Zero(rows, width);  // P rounded to the precision; 0 on keys a row does not see
    VectorD row_sums(rows);
    std::vector<float> scores(width);
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t row = r0 + i, position = geometry.position(row);
      const KeyRange seen = geometry.visible(row, keys);
      float row_max = -std::numeric_limits<float>::infinity();
      for (int64_t j = seen.begin; j < seen.end; ++j) {
        float score = static_cast<float>(dots(i, j - begin)) * scale_f;
        if (shaped) score = static_cast<float>(shaping->logit<double>(score, row, position, j));
        scores[j - begin] = score;
        row_max = std::max(row_max, score);
      }
      // Step 3: P and its row sum; step 4: P rounded for the product.
      double sum = 0;
      for (int64_t j = seen.begin; j < seen.end; ++j) {
        const float shifted = scores[j - begin] - row_max;
        const float weight = static_cast<float>(std::exp(static_cast<double>(shifted)));
        sum += weight;
        weights(i, j - begin) = round_to(weight, precision);
      }
      row_sums(i) = static_cast<float>(sum);
    }
    MatrixD products(rows, pv);
    if (values_finite) {
      products.noalias() = weights * vd.middleRows(begin, width);
    } else {
      for (int64_t i = 0; i < rows; ++i) {
        const KeyRange seen = geometry.visible(r0 + i, keys);
        products.row(i).noalias() =
            weights.row(i).segment(seen.begin - begin, seen.size()) * vd.middleRows(seen.begin, seen.size());
      }
    }
    // Step 5: the float32 quotient, stored in the precision.
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t c = 0; c < pv; ++c)
        out(r0 + i, c) = round_to(static_cast<float>(products(i, c)) / static_cast<float>(row_sums(i)), precision);
  });
}

MatrixF exact_attention_at(const HeadView& view, Precision precision, ThreadPool* pool) {
  require_usage(precision != Precision::kF64,
                "exact_attention_at computes f32, bf16 or f16; f64 is exact_attention_f64");
  MatrixF out;
  if (below_float32(precision))
    exact_attention_rounded(view.qf, view.kf, view.vf, static_cast<float>(view.scale), precision, out, pool,
                            view.geometry(), &view.shaping);
  else
    exact_attention_f32(view.qf, view.kf, view.vf, static_cast<float>(view.scale), out, pool, view.geometry(),
                        &view.shaping);
  return out;
}

}  // namespace attnprobe
