#include "attnprobe/estimators/random_features/feature_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attnprobe/common/prefetch.h"
#include "attnprobe/estimators/common/decode_blocks.h"
#include "attnprobe/exact/tile_product.h"

namespace attnprobe {
namespace {

constexpr int64_t kRowBlock = 256;  ///< rows per block: 256 × M floats stay in L2
constexpr int64_t kKeyChunks = 8;   ///< key chunks reduced independently (threads), merged in order

/// One chunk's key sums under its own per-feature maximum: Σ_j exp(L_jm − max_m)·v_j and Σ_j exp(L_jm − max_m).
struct KeySums {
  RowVectorF max;  ///< M
  MatrixD kv;      ///< M × pv
  RowVectorD sum;  ///< M
};

/// Per-thread buffers kept between calls (no allocation once they have their size).
struct Workspace {
  MatrixF logits;    ///< rows × M
  MatrixF block_kv;  ///< M × pv
  MatrixF logits_t;  ///< M × rows
};
Workspace& workspace() {
  thread_local Workspace w;
  return w;
}

// logits (rows × M) −= Σ_l h_l·k_l² of each key row.
void subtract_key_squares(const PositiveFeatureMapF& map, const MatrixF& k, int64_t j0, int64_t rows, MatrixF& logits) {
  if (map.key_square_weights.size() == 0) {
    logits.colwise() -= map.key_square_weight * k.middleRows(j0, rows).rowwise().squaredNorm();
    return;
  }
  for (int64_t r = 0; r < rows; ++r)
    logits.row(r).array() -= (k.row(j0 + r).array().square() * map.key_square_weights.array()).sum();
}

// Each row's (or each column's) maximum of a block, row by row as column_max, asking for a share of `ahead` per
// row: the loops over the rows that these passes have. Maxima are exact, so the bits are those of Eigen's. x has
// at least one row (a block of a non-empty pass).
VectorF row_max(const MatrixF& x, const NextBlock& ahead) {
  VectorF out(x.rows());
  for (int64_t i = 0; i < x.rows(); ++i) {
    ahead.share(i, x.rows());
    out(i) = x.row(i).maxCoeff();
  }
  return out;
}
RowVectorF column_max(const MatrixF& x, const NextBlock& ahead) {
  ahead.share(0, x.rows());
  RowVectorF out = x.row(0);
  for (int64_t i = 1; i < x.rows(); ++i) {
    ahead.share(i, x.rows());
    out = out.cwiseMax(x.row(i));
  }
  return out;
}

}  // namespace

void positive_feature_attention(const PositiveFeatureMapF& map, const MatrixF& q, const MatrixF& k, const MatrixF& v,
                                ThreadPool* pool, MatrixF& out, int64_t first_position, Precision stored) {
  const int64_t n = q.rows(), keys = k.rows(), pv = v.cols(), m = map.key_t.cols();
  const bool offsets = map.offsets.size() > 0;

  // Keys: a fixed number of contiguous chunks (a function of the key count only, so the sums do not
  // depend on the thread count), each reduced block by block with an online per-feature maximum.
  const int64_t chunk_count = std::min<int64_t>(kKeyChunks, (keys + kRowBlock - 1) / kRowBlock);
  const int64_t chunk_rows = (keys + chunk_count - 1) / chunk_count;
  // Kept per calling thread between calls, with the merged sums below: allocated and freed per call,
  // these 8 × M × pv doubles (1 MiB at M = 256) went back to the kernel each time and were faulted in
  // again (~5% of a call at n = 1024). Reached through a reference, because a lambda that names a
  // thread_local reaches the running thread's copy, and the pool's threads must fill this thread's.
  thread_local std::vector<KeySums> kept_chunks;
  std::vector<KeySums>& chunks = kept_chunks;
  chunks.resize(chunk_count);
  for_each_index(pool, chunk_count, [&](int64_t c) {
    KeySums& sums = chunks[c];
    // Unshifted: every feature's shift stays 0, so nothing is rescaled and the merge below multiplies by 1.
    sums.max = RowVectorF::Constant(m, map.shifted ? -std::numeric_limits<float>::infinity() : 0.0f);
    sums.kv = MatrixD::Zero(m, pv);
    sums.sum = RowVectorD::Zero(m);
    MatrixF& logits = workspace().logits;
    MatrixF& block_kv = workspace().block_kv;
    MatrixF& logits_t = workspace().logits_t;
    const int64_t end = std::min(keys, (c + 1) * chunk_rows);
    for (int64_t j0 = c * chunk_rows; j0 < end; j0 += kRowBlock) {
      const int64_t rows = std::min(kRowBlock, end - j0);
      tile_product(k.middleRows(j0, rows), map.key_t, logits);  // rows × M
      if (offsets) logits.rowwise() += map.offsets;
      subtract_key_squares(map, k, j0, rows, logits);
      const RowVectorF block_max =
          map.shifted ? column_max(logits, next_rows(k, v, j0 + rows, std::min(kRowBlock, end - j0 - rows))) : sums.max;
      for (int64_t f = 0; f < m; ++f)
        if (block_max(f) > sums.max(f)) {
          // exp(−inf) = 0 for the first block; the sums are 0 then anyway.
          const double rescale = std::exp(static_cast<double>(sums.max(f)) - block_max(f));
          sums.kv.row(f) *= rescale;
          sums.sum(f) *= rescale;
          sums.max(f) = block_max(f);
        }
      logits.rowwise() -= sums.max;
      logits = logits.array().exp();  // in place: exp of a rowwise() expression ran glibc's scalar expf (17%)
      round_in_place(logits, stored);
      transpose_scaled(logits, 1.0f, logits_t);
      tile_product(logits_t, v.middleRows(j0, rows), block_kv);  // M × pv
      sums.kv += block_kv.cast<double>();
      sums.sum += column_sums(logits).cast<double>();
    }
  });
  // Chunks merged in their order under the overall per-feature maximum.
  RowVectorF shift = chunks[0].max;
  for (const KeySums& sums : chunks) shift = shift.cwiseMax(sums.max);
  thread_local MatrixD kv;
  kv.setZero(m, pv);
  RowVectorD key_sum = RowVectorD::Zero(m);
  for (const KeySums& sums : chunks) {
    const RowVectorD rescale = (sums.max - shift).cast<double>().array().exp();
    kv += rescale.transpose().asDiagonal() * sums.kv;
    key_sum += sums.sum.cwiseProduct(rescale);
  }
  MatrixF kv_f = kv.cast<float>();
  VectorF key_sum_f = key_sum.transpose().cast<float>();
  round_in_place(kv_f, stored);
  round_in_place(key_sum_f.data(), key_sum_f.size(), stored);
  // The queries carry the keys' shift (and c_m); each row's own maximum is taken out.
  if (offsets) shift += map.offsets;

  // Query blocks of kRowBlock absolute positions, a first one that starts inside one led by zero rows
  // (decode_blocks.h): block b holds rows [starts[b], starts[b + 1]).
  std::vector<int64_t> starts{0};
  for (int64_t i = 0; i < n;) starts.push_back(i += aligned_block(first_position + i, n - i, kRowBlock).rows);
  out.resize(n, pv);
  for_each_index(pool, static_cast<int64_t>(starts.size()) - 1, [&](int64_t b) {
    const int64_t i0 = starts[b], rows = starts[b + 1] - i0, next = std::min(kRowBlock, n - i0 - rows);
    const int64_t lead = b == 0 ? aligned_block(first_position, n, kRowBlock).lead : 0;
    MatrixF& logits = workspace().logits;
    if (lead == 0)
      tile_product(q.middleRows(i0, rows), map.query_t, logits);  // rows × M
    else
      tile_product(with_lead(q, i0, rows, lead), map.query_t, logits);
    logits.rowwise() += shift;
    if (map.shifted) {
      // Evaluated first (the update below aliases), with the next block's queries and output rows asked for.
      logits.colwise() -= row_max(logits, next_rows(q, out, i0 + rows, next));
    } else {  // the textbook map's −h·‖q‖², on the lead rows' zeros too (they are dropped)
      const MatrixF rows_used = lead == 0 ? MatrixF(q.middleRows(i0, rows)) : with_lead(q, i0, rows, lead);
      logits.colwise() -= map.key_square_weight * rows_used.rowwise().squaredNorm();
    }
    logits = logits.array().exp();
    round_in_place(logits, stored);
    if (lead == 0) {
      tile_product_assign(logits.data(), m, rows, m, kv_f.data(), pv, pv, out.row(i0).data(), pv);
      out.middleRows(i0, rows).array().colwise() /= (logits * key_sum_f).array();
      return;
    }
    MatrixF led(lead + rows, pv);
    tile_product_assign(logits.data(), m, lead + rows, m, kv_f.data(), pv, pv, led.data(), pv);
    led.array().colwise() /= (logits * key_sum_f).array();
    out.middleRows(i0, rows) = led.bottomRows(rows);
  });
}

// ω-sized maps (2 × p × M), the chunks' sums (≤ 8 × M × (pv + 1), float64, and their merge) and per
// thread one block of features (256 × M, and its transpose) and one M × pv product, float32.
double positive_feature_attention_bytes(int64_t features, int64_t p, int64_t pv) {
  const double m = static_cast<double>(features);
  return 4.0 * 2 * m * p + 8.0 * (kKeyChunks + 1) * m * (pv + 1) + 4.0 * (2 * kRowBlock * m + m * pv);
}

}  // namespace attnprobe
