#include "attnprobe/exact/exact_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attnprobe/common/prefetch.h"
#include "attnprobe/exact/tile_product.h"

namespace attnprobe {

namespace {
// Query rows per task and keys per online-softmax step. 128 × 512 float scores = 256 KiB, in L2
// with the query block and accumulator. Measured with `attnprobe bench --threads 1` at n = 1024 and
// 4096 (GFLOP/s): 64×512 97/95, 128×512 106/102, 128×256 101/99, 96×1024 102/100, 256×256 100/103.
constexpr int64_t kQueryBlock = 128;
constexpr int64_t kKeyBlock = 512;
// The float64 reference forms whole score rows per block; 32 rows keeps 32 × 4096 doubles in L2.
constexpr int64_t kReferenceBlock = 32;

using MapF = Eigen::Map<MatrixF, Eigen::Unaligned, Eigen::OuterStride<>>;
using ConstMapF = Eigen::Map<const MatrixF, Eigen::Unaligned, Eigen::OuterStride<>>;
// Keys per item of key_chunked_attention_f32: fixed (not derived from the thread count), so that the
// chunks and the order they are combined in, and with them the bits, are the same for any pool. 512
// (one key block) rather than 1024: Nyström(64)'s K3·V pass at n = 4096 was four items of ~0.18 ms
// beside its ~0.25 ms eigensolver, so two threads ended ~0.1 ms apart (1.64–1.71× for the call; 1.88–1.91×
// with 512). One thread pays nothing measurable for the extra merges.
constexpr int64_t kKeyChunk = 512;
}  // namespace

namespace {
// Row i of a block of scores over keys [k0, k0 + scores.cols()) turned into its softmax over the keys the
// row sees, 0 elsewhere.
void softmax_visible(MatrixD& scores, int64_t i, KeyRange seen, int64_t k0) {
  const int64_t begin = std::max<int64_t>(seen.begin - k0, 0), end = seen.end - k0, width = scores.cols();
  auto row = scores.row(i).segment(begin, end - begin);
  row.array() = (row.array() - row.maxCoeff()).exp();
  row /= row.sum();
  scores.row(i).head(begin).setZero();
  scores.row(i).tail(width - end).setZero();
}

// Each visible score of a block of rows r0.. over keys [k0, k0 + scores.cols()) turned into the model's logit.
void shape_scores(MatrixD& scores, int64_t r0, int64_t k0, const QueryGeometry& geometry, int64_t keys,
                  const ScoreShaping& shaping) {
  for (int64_t i = 0; i < scores.rows(); ++i) {
    const KeyRange seen = geometry.visible(r0 + i, keys);
    const int64_t position = geometry.position(r0 + i);
    for (int64_t j = std::max(seen.begin, k0); j < seen.end; ++j)
      scores(i, j - k0) = shaping.logit(scores(i, j - k0), r0 + i, position, j);
  }
}
}  // namespace

MatrixD attention_rows_f64(const MatrixD& q, const MatrixD& k, double scale, int64_t r0, int64_t rows,
                           const QueryGeometry& geometry, const ScoreShaping* shaping) {
  MatrixD a = scale * (q.middleRows(r0, rows) * k.transpose());
  if (shaping != nullptr && shaping->any()) shape_scores(a, r0, 0, geometry, k.rows(), *shaping);
  for (int64_t i = 0; i < a.rows(); ++i) softmax_visible(a, i, geometry.visible(r0 + i, k.rows()), 0);
  return a;
}

void gemm_abt(int m, int n, int kdim, float alpha, const float* a, int lda, const float* b, int ldb, float beta,
              float* c, int ldc) {
  ConstMapF A(a, m, kdim, Eigen::OuterStride<>(lda));
  ConstMapF B(b, n, kdim, Eigen::OuterStride<>(ldb));
  MapF C(c, m, n, Eigen::OuterStride<>(ldc));
  if (beta == 0.0f)
    C.noalias() = alpha * A * B.transpose();
  else
    C = beta * C + alpha * A * B.transpose();
}

void gemm_ab(int m, int n, int kdim, float alpha, const float* a, int lda, const float* b, int ldb, float beta,
             float* c, int ldc) {
  ConstMapF A(a, m, kdim, Eigen::OuterStride<>(lda));
  ConstMapF B(b, kdim, n, Eigen::OuterStride<>(ldb));
  MapF C(c, m, n, Eigen::OuterStride<>(ldc));
  if (beta == 0.0f)
    C.noalias() = alpha * A * B;
  else
    C = beta * C + alpha * A * B;
}

namespace {
// The keys as the tile products read them: column j − first of a p × (keys) row-major block with leading
// dimension ld holds scale·k_j. Transposed once per call (exact attention: each key block was otherwise
// transposed again for every query block, ~10% of the call) or once per key chunk.
// With `source` set instead, each key block is transposed from source's rows into a small per-thread buffer
// when it is read (same products, same bits: each entry is one multiplication): for a few query rows against
// many keys (a decode step), where transposing all the keys first wrote and read a second copy of K through
// memory for one pass over it.
struct ScaledKeysT {
  const float* data;
  int64_t ld, first;
  const MatrixF* source = nullptr;
  float scale = 1;
};

// The online-softmax state of `rows` query rows (q: rows × p, leading dimension p) over keys [c0, c1)
// written from scratch: running maxima `max`, running sums `sum` and the unnormalised
// accumulator `acc` (rows × pv, leading dimension pv), with scores scale·q_i·k_j + bias_j (bias may be
// null). causal_row0 ≥ 0 masks key j for query row i when j > causal_row0 + i. The one inner loop of the
// float32 kernels below, so every caller visits keys in the same 512-key steps and gets the same bits.
// Both products run on the tile kernel: against Eigen's GEMM on the same blocks, one Zen 4 core, exact
// attention 71.7 → 54–56 ms at n = 4096 and nystrom 3.4 → 2.5 ms. The first key block writes the state
// directly (no zeroed accumulator to rescale by exp(−∞) = 0 and add to): the same bits, and all of
// the work when the keys are few (Nyström's L landmarks, Linformer's d projected keys). logits, when not null,
// receives each block's scores before the exp: row i, key j at logits[i·ld_logits + j]. ahead, when not null,
// is what the caller's next block reads (common/prefetch.h), asked for a share per row of every key block.
// geometry, when not null, masks the keys row i cannot see (it is the geometry's row geometry_row0 + i; rows
// at increasing positions); a row none of whose keys has been visited yet keeps the empty state. Its scores
// sit at row buffer_row0 + i of the score buffer: a caller that aligns its blocks to absolute positions puts
// a row at the same place whatever rows come with it, so its vectorised exp and sums split it the same way.
// shaping, when not null, turns each score of row geometry_row0 + i into the model's logit (its position from
// `positions`, given whatever the mask) before the mask and the exp.
void accumulate_keys(const float* q, int64_t rows, int64_t p, const ScaledKeysT& keys_t, const MatrixF& v,
                     const float* bias, int64_t c0, int64_t c1, const QueryGeometry* geometry, int64_t geometry_row0,
                     int64_t buffer_row0, float* max, float* sum, float* acc, float* logits = nullptr,
                     int64_t ld_logits = 0, const NextBlock* ahead = nullptr, const ScoreShaping* shaping = nullptr,
                     const QueryGeometry* positions = nullptr) {
  const int64_t pv = v.cols();
  // Eigen-allocated (64-byte aligned) so that vectorised exp and row sums split every row the same
  // way whichever thread runs the block: malloc'd buffers differ in alignment per thread, and with
  // them the last bits of the result.
  thread_local MatrixF score_buffer(kQueryBlock, kKeyBlock);
  thread_local MatrixF block_buffer;  // rows × pv: one block's P·V
  block_buffer.resize(kQueryBlock, pv);
  MapF accumulator(acc, rows, pv, Eigen::OuterStride<>(pv));
  if (c1 <= c0) {  // no keys: the empty state
    std::fill(max, max + rows, -std::numeric_limits<float>::infinity());
    std::fill(sum, sum + rows, 0.0f);
    accumulator.setZero();
  }
  const int64_t prefetch_steps = (c1 - c0 + kKeyBlock - 1) / kKeyBlock * rows;
  for (int64_t start = c0; start < c1; start += kKeyBlock) {
    const bool first = start == c0;
    const int64_t prefetch_step0 = (start - c0) / kKeyBlock * rows;
    const int64_t cols = std::min(kKeyBlock, c1 - start);
    Eigen::Map<MatrixF> scores(score_buffer.data() + buffer_row0 * cols, rows, cols);
    if (keys_t.source != nullptr) {
      thread_local MatrixF block_keys_t;  // p × cols
      transpose_scaled(keys_t.source->middleRows(start, cols), keys_t.scale, block_keys_t);
      tile_product_assign(q, p, rows, p, block_keys_t.data(), cols, cols, scores.data(), cols);
    } else {
      tile_product_assign(q, p, rows, p, keys_t.data + (start - keys_t.first), keys_t.ld, cols, scores.data(), cols);
    }
    if (bias != nullptr) scores.rowwise() += Eigen::Map<const RowVectorF>(bias + start, cols);
    if (shaping != nullptr)
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t row = geometry_row0 + i, position = positions->position(row);
        for (int64_t j = 0; j < cols; ++j) scores(i, j) = shaping->logit(scores(i, j), row, position, start + j);
      }
    if (logits != nullptr)
      Eigen::Map<MatrixF, 0, Eigen::OuterStride<>>(logits + start, rows, cols, Eigen::OuterStride<>(ld_logits)) =
          scores;
    // Keys outside a row's range get −inf (weight 0). Ranges move forward with the rows' positions, so a
    // block the first row's range covers to its end and the last row's from its start needs none.
    if (geometry != nullptr && (geometry->visible(geometry_row0, v.rows()).end < start + cols ||
                                geometry->visible(geometry_row0 + rows - 1, v.rows()).begin > start))
      for (int64_t i = 0; i < rows; ++i) {
        const KeyRange seen = geometry->visible(geometry_row0 + i, v.rows());
        const int64_t first_seen = std::clamp<int64_t>(seen.begin - start, 0, cols);
        const int64_t first_masked = std::clamp<int64_t>(seen.end - start, 0, cols);
        scores.row(i).head(first_seen).setConstant(-std::numeric_limits<float>::infinity());
        scores.row(i).tail(cols - first_masked).setConstant(-std::numeric_limits<float>::infinity());
      }
    for (int64_t i = 0; i < rows; ++i) {
      if (ahead != nullptr) ahead->share(prefetch_step0 + i, prefetch_steps);
      const float block_max = scores.row(i).maxCoeff();
      const float new_max = first ? block_max : std::max(max[i], block_max);
      if (new_max == -std::numeric_limits<float>::infinity()) {  // none of the row's keys yet: the empty state
        scores.row(i).setZero();
        if (first) sum[i] = 0.0f;
        max[i] = new_max;
        continue;
      }
      scores.row(i).array() = (scores.row(i).array() - new_max).exp();
      const float block_sum = scores.row(i).sum();
      if (first) {
        sum[i] = block_sum;
      } else {
        const float correction = std::exp(max[i] - new_max);
        sum[i] = sum[i] * correction + block_sum;
        if (correction != 1.0f) accumulator.row(i) *= correction;
      }
      max[i] = new_max;
    }
    // Each later block's P·V into a buffer, then added: chaining every key block's FMAs onto the
    // accumulator made one float32 sum of all n terms per element (the MSE against float64 grew 4× at
    // n = 1024); this keeps each chain to one key block.
    const float* probabilities_v = v.data() + start * pv;
    if (first) {
      tile_product_assign(scores.data(), cols, rows, cols, probabilities_v, pv, pv, acc, pv);
    } else {
      tile_product_assign(scores.data(), cols, rows, cols, probabilities_v, pv, pv, block_buffer.data(), pv);
      accumulator += Eigen::Map<MatrixF>(block_buffer.data(), rows, pv);
    }
  }
}
}  // namespace

MatrixD exact_attention_f64(const MatrixD& q, const MatrixD& k, const MatrixD& v, double scale, ThreadPool* pool,
                            const QueryGeometry& geometry, const ScoreShaping* shaping) {
  if (shaping != nullptr && !shaping->any()) shaping = nullptr;
  const int64_t n = q.rows();
  MatrixD out(n, v.cols());
  const int64_t blocks = (n + kReferenceBlock - 1) / kReferenceBlock;
  auto run_block = [&](int64_t block) {
    const int64_t r0 = block * kReferenceBlock;
    const int64_t rows = std::min(kReferenceBlock, n - r0);
    // Only the keys some row of the block sees (a causal block's last row sees keys 0..its position): no
    // later key is touched.
    const int64_t k0 = geometry.visible(r0, k.rows()).begin, k1 = geometry.visible(r0 + rows - 1, k.rows()).end;
    MatrixD scores = scale * (q.middleRows(r0, rows) * k.middleRows(k0, k1 - k0).transpose());
    if (shaping != nullptr) shape_scores(scores, r0, k0, geometry, k.rows(), *shaping);
    for (int64_t i = 0; i < rows; ++i) softmax_visible(scores, i, geometry.visible(r0 + i, k.rows()), k0);
    out.middleRows(r0, rows).noalias() = scores * v.middleRows(k0, k1 - k0);
  };
  for_each_index(pool, blocks, run_block);
  return out;
}

namespace {
// One query block's online-softmax state over one key chunk (exact_attention_f32).
struct ChunkState {
  std::vector<float> max, sum;
  MatrixF acc;  // rows × pv, unnormalised
};

// Rows [0, acc.rows()) of a query block from its states over consecutive key chunks, in chunk order, in log
// space: with M_i the largest chunk maximum of row i, out_i = Σ_c e^(m_ci − M_i)·acc_ci / Σ_c e^(m_ci − M_i)·l_ci.
// Explicit FMAs so the compiler cannot contract some terms and not others (vector body against scalar tail,
// which depends on the output row's alignment): a row that saw keys in one chunk only gets weight e^0 = 1
// there and exact zeros from the others (their empty states: m = −∞, l = 0, acc = 0), so its bits are those
// of the unchunked state, acc_i / l_i, whichever chunks its block visited.
void merge_chunk_states(const ChunkState* states, int64_t chunks, Eigen::Ref<MatrixF, 0, Eigen::OuterStride<>> out) {
  const int64_t rows = out.rows(), pv = out.cols();
  for (int64_t i = 0; i < rows; ++i) {
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t c = 0; c < chunks; ++c) top = std::max(top, states[c].max[i]);
    float total = 0;
    float* o = out.row(i).data();
    std::fill(o, o + pv, 0.0f);
    for (int64_t c = 0; c < chunks; ++c) {
      const float weight = std::exp(states[c].max[i] - top);
      total = std::fma(weight, states[c].sum[i], total);
      const float* a = states[c].acc.row(i).data();
      for (int64_t j = 0; j < pv; ++j) o[j] = std::fma(weight, a[j], o[j]);
    }
    out.row(i) /= total;
  }
}
}  // namespace

void exact_attention_f32(const MatrixF& q, const MatrixF& k, const MatrixF& v, float scale, MatrixF& out,
                         ThreadPool* pool, const QueryGeometry& geometry, const ScoreShaping* shaping) {
  if (shaping != nullptr && !shaping->any()) shaping = nullptr;
  const int64_t n = q.rows(), keys = k.rows(), p = q.cols(), pv = v.cols();
  out.resize(n, pv);
  // Query blocks of kQueryBlock rows. Rows at consecutive positions are blocked by absolute position
  // (position / kQueryBlock), so that a row has the same place in its block — and the same bits — whether
  // the whole slice is evaluated or only its last rows.
  std::vector<int64_t> block_start;
  for (int64_t r = 0; r < n;) {
    block_start.push_back(r);
    r += geometry.contiguous() ? kQueryBlock - geometry.position(r) % kQueryBlock : kQueryBlock;
  }
  block_start.push_back(n);
  const int64_t blocks = static_cast<int64_t>(block_start.size()) - 1;
  // A few query blocks (a decode step: W ≤ 128 rows span at most two) read each key once: transposing all
  // keys up front would write and read a copy of K through memory, so each key block is transposed as it
  // is read. Many blocks: once per call (O(keys·p) beside O(n·keys·p)), each key block being read by every
  // query block.
  MatrixF scaled_keys_t;
  ScaledKeysT keys_t{nullptr, keys, 0, &k, scale};
  if (blocks > 2) {
    transpose_scaled(k, scale, scaled_keys_t);
    keys_t = ScaledKeysT{scaled_keys_t.data(), keys, 0};
  }
  const bool masked = geometry.mask != Mask::kFull;
  // The keys a block visits. Masked: key blocks past the block's last query (and before its first query's
  // window) are skipped and the edge blocks are cut, so a causal slice computes about half the pairs; inside
  // them, keys a row cannot see are set to −inf (weight 0). The key blocks stay aligned to multiples of
  // kKeyBlock.
  auto block_keys = [&](int64_t block) -> KeyRange {
    const int64_t r0 = block_start[block], last = block_start[block + 1] - 1;
    return {masked ? geometry.visible(r0, keys).begin / kKeyBlock * kKeyBlock : 0,
            masked ? geometry.visible(last, keys).end : keys};
  };
  // The chunks of kExactKeyChunk keys (aligned to key 0) a block's keys meet: [first, first + count).
  auto block_chunks = [&](int64_t block) -> std::pair<int64_t, int64_t> {
    const KeyRange range = block_keys(block);
    if (range.end <= range.begin) return {0, 1};
    const int64_t first = range.begin / kExactKeyChunk;
    return {first, (range.end - 1) / kExactKeyChunk - first + 1};
  };
  // Block `block`'s state over the keys of chunk `chunk` (chunk < 0: all its keys, one state as before chunks).
  auto run_keys = [&](int64_t block, int64_t chunk, float* max, float* sum, float* acc, const NextBlock* ahead) {
    const int64_t r0 = block_start[block], rows = block_start[block + 1] - r0;
    KeyRange range = block_keys(block);
    if (chunk >= 0) {
      range.begin = std::max(range.begin, chunk * kExactKeyChunk);
      range.end = std::min(range.end, (chunk + 1) * kExactKeyChunk);
    }
    accumulate_keys(q.data() + r0 * p, rows, p, keys_t, v, nullptr, range.begin, range.end,
                    masked ? &geometry : nullptr, r0, geometry.contiguous() ? geometry.position(r0) % kQueryBlock : 0,
                    max, sum, acc, nullptr, 0, ahead, shaping, &geometry);
  };
  // A block whose keys lie in one chunk: its state, normalised in place (every block when keys ≤ one chunk:
  // the kernel as it was before chunks, bit for bit).
  auto run_whole_block = [&](int64_t block) {
    thread_local std::vector<float> max_buffer, sum_buffer;
    const int64_t r0 = block_start[block], rows = block_start[block + 1] - r0;
    max_buffer.resize(rows);
    sum_buffer.resize(rows);
    auto acc = out.middleRows(r0, rows);
    // The next block's queries and output rows: past the cache, Nyström's and Linformer's output passes (a
    // few landmark keys per query) waited for them (common/prefetch.h).
    const NextBlock ahead = next_rows(q, out, r0 + rows, std::min(kQueryBlock, n - r0 - rows));
    run_keys(block, -1, max_buffer.data(), sum_buffer.data(), acc.data(), &ahead);
    for (int64_t i = 0; i < rows; ++i) acc.row(i) /= sum_buffer[i];
  };
  auto run_chunk = [&](int64_t block, int64_t chunk, ChunkState& state) {
    const int64_t rows = block_start[block + 1] - block_start[block];
    state.max.resize(rows);
    state.sum.resize(rows);
    state.acc.resize(rows, pv);
    run_keys(block, chunk, state.max.data(), state.sum.data(), state.acc.data(), nullptr);
  };
  // The keys beyond one chunk are cut into fixed chunks (kExactKeyChunk, not derived from the thread count),
  // each block's state over each chunk computed on its own and merged in chunk order: the same decomposition
  // for every row whichever rows are evaluated, and the same bits for any pool. Only the scheduling depends
  // on the pool: with few blocks (a decode step) the threads take (block, chunk) items, so one query block
  // spreads over the cache; with many, whole blocks, each keeping its chunks' states per thread (a long
  // slice's states for every block at once would be n × chunks × pv floats).
  const int threads = pool != nullptr ? pool->size() : 1;
  if (blocks >= 4 * threads) {
    for_each_index(pool, blocks, [&](int64_t block) {
      const auto [first, count] = block_chunks(block);
      if (count == 1) return run_whole_block(block);
      thread_local std::vector<ChunkState> states;
      if (static_cast<int64_t>(states.size()) < count) states.resize(count);
      for (int64_t c = 0; c < count; ++c) run_chunk(block, first + c, states[c]);
      const int64_t r0 = block_start[block];
      merge_chunk_states(states.data(), count, out.middleRows(r0, block_start[block + 1] - r0));
    });
    return;
  }
  struct Item {
    int64_t block, chunk;  // chunk −1: the whole block (its keys in one chunk)
  };
  std::vector<Item> items;
  std::vector<int64_t> first_state(blocks + 1, 0);  // block b's chunk states: [first_state[b], first_state[b + 1])
  for (int64_t block = 0; block < blocks; ++block) {
    const auto [first, count] = block_chunks(block);
    first_state[block + 1] = first_state[block] + (count > 1 ? count : 0);
    if (count == 1)
      items.push_back({block, -1});
    else
      for (int64_t c = 0; c < count; ++c) items.push_back({block, first + c});
  }
  std::vector<ChunkState> states(first_state[blocks]);
  for_each_index(pool, static_cast<int64_t>(items.size()), [&](int64_t index) {
    const Item item = items[index];
    if (item.chunk < 0) return run_whole_block(item.block);
    run_chunk(item.block, item.chunk, states[first_state[item.block] + item.chunk - block_chunks(item.block).first]);
  });
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t count = first_state[block + 1] - first_state[block];
    if (count == 0) continue;
    const int64_t r0 = block_start[block];
    merge_chunk_states(states.data() + first_state[block], count, out.middleRows(r0, block_start[block + 1] - r0));
  }
}

void key_chunked_attention_f32(const MatrixF& q, const MatrixF& k, const MatrixF& v, float scale,
                               const RowVectorF* key_bias, MatrixF& out, VectorD* log_normaliser, ThreadPool* pool,
                               const std::function<void()>& alongside, MatrixF* logits) {
  const int64_t rows = q.rows(), keys = k.rows(), p = q.cols(), pv = v.cols();
  if (logits != nullptr) logits->resize(rows, keys);
  const int64_t chunks = std::max<int64_t>(1, (keys + kKeyChunk - 1) / kKeyChunk);
  // Per chunk: the online-softmax state of every query row, combined below in chunk order.
  MatrixF chunk_max(chunks, rows), chunk_sum(chunks, rows);
  std::vector<MatrixF> chunk_acc(chunks);
  const int64_t first_chunk = alongside ? 1 : 0;  // item 0 is `alongside`, when there is one
  for_each_index(pool, first_chunk + chunks, [&](int64_t item) {
    if (item < first_chunk) return alongside();
    const int64_t chunk = item - first_chunk;
    const int64_t c0 = chunk * kKeyChunk, c1 = std::min(keys, c0 + kKeyChunk);
    MatrixF& acc = chunk_acc[chunk];
    acc.resize(rows, pv);
    thread_local MatrixF chunk_keys_t;  // p × (c1 − c0): the chunk's keys, scaled and transposed once
    transpose_scaled(k.middleRows(c0, c1 - c0), scale, chunk_keys_t);
    const ScaledKeysT keys_t{chunk_keys_t.data(), c1 - c0, c0};
    // The next chunk's keys and values, during the first query block (common/prefetch.h).
    const NextBlock ahead = next_rows(k, v, c1, std::min(kKeyChunk, keys - c1));
    for (int64_t r0 = 0; r0 < rows; r0 += kQueryBlock)
      accumulate_keys(q.data() + r0 * p, std::min(kQueryBlock, rows - r0), p, keys_t, v,
                      key_bias != nullptr ? key_bias->data() : nullptr, c0, c1, nullptr, 0, 0,
                      chunk_max.row(chunk).data() + r0, chunk_sum.row(chunk).data() + r0, acc.data() + r0 * pv,
                      logits != nullptr ? logits->data() + r0 * keys : nullptr, keys, r0 == 0 ? &ahead : nullptr);
  });
  const RowVectorF max = chunk_max.colwise().maxCoeff();
  RowVectorF sum = RowVectorF::Zero(rows);
  out.setZero(rows, pv);
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const RowVectorF weight = (chunk_max.row(chunk) - max).array().exp();  // each chunk rescaled to the common max
    sum.array() += weight.array() * chunk_sum.row(chunk).array();
    out.noalias() += weight.transpose().asDiagonal() * chunk_acc[chunk];
  }
  out.array().colwise() /= sum.transpose().array();
  if (log_normaliser != nullptr)
    *log_normaliser = max.transpose().cast<double>().array() + sum.transpose().cast<double>().array().log();
}

}  // namespace attnprobe
