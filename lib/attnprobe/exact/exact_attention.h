#pragma once
// Exact softmax attention, out = softmax(s·QKᵀ)·V, in two precisions.
//  - float64: the reference every metric compares against. Row blocks of scores are formed in
//    full (block × n) and normalised with the row max subtracted.
//  - float32: the fast path (bench, large n, the `softmax` estimator). Flash-style: for each
//    block of queries, key blocks are visited once with an online softmax (running max m,
//    running sum l, output rescaled by exp(m_old − m_new)), so the n × n matrix is never formed.
// Shapes: q n × p, k keys × p, v keys × pv, out n × pv; all row-major.
// The geometry (view/mask.h) says which keys each query row sees: under Mask::kCausal the row at position
// t attends to keys 0..t, under kWindow to t−W+1..t; self-attention is row i at position i. Keys a block's
// rows cannot see are never read, so row t depends on tokens 0..t alone, bit for bit. The float32 path keeps
// its query blocks, key blocks and key chunks aligned to absolute positions (multiples of 128, 512 and
// kExactKeyChunk), so a row's bits do not depend on which other rows are evaluated with it: the last rows of
// a slice evaluated alone (a decode step) equal the same rows of the whole slice.
#include <algorithm>
#include <functional>

#include "attnprobe/common/matrix.h"
#include "attnprobe/common/parallel.h"
#include "attnprobe/common/rounding.h"
#include "attnprobe/view/mask.h"
#include "attnprobe/view/score_shaping.h"

namespace attnprobe {

/// How many keys (a prefix 0..count−1 of `keys`) query `row` attends to under `mask`.
inline int64_t visible_keys(int64_t row, int64_t keys, Mask mask) {
  return mask == Mask::kCausal ? std::min(row + 1, keys) : keys;
}

/// `shaping`, when given and not empty, turns each visible score s·q_i·k_j into the model's logit (bias, ALiBi,
/// soft-cap: view/score_shaping.h) before the softmax; its rows are q's rows.
MatrixD exact_attention_f64(const MatrixD& q, const MatrixD& k, const MatrixD& v, double scale, ThreadPool* pool,
                            const QueryGeometry& geometry, const ScoreShaping* shaping = nullptr);
inline MatrixD exact_attention_f64(const MatrixD& q, const MatrixD& k, const MatrixD& v, double scale,
                                   ThreadPool* pool = nullptr, Mask mask = Mask::kFull) {
  return exact_attention_f64(q, k, v, scale, pool, QueryGeometry{mask});
}

/// Rows [r0, r0 + rows) of the exact attention matrix A = softmax(s·QKᵀ) in float64 (rows × keys,
/// row max subtracted, masked entries 0): what the head diagnostics and the attention-weight
/// metrics compare with. `shaping` as for exact_attention_f64 (its rows are q's rows, not the block's).
MatrixD attention_rows_f64(const MatrixD& q, const MatrixD& k, double scale, int64_t r0, int64_t rows,
                           const QueryGeometry& geometry, const ScoreShaping* shaping = nullptr);
inline MatrixD attention_rows_f64(const MatrixD& q, const MatrixD& k, double scale, int64_t r0, int64_t rows,
                                  Mask mask = Mask::kFull) {
  return attention_rows_f64(q, k, scale, r0, rows, QueryGeometry{mask});
}

/// Keys per chunk of exact_attention_f32 beyond which a query block's keys are split (exposed for tests that
/// must go past it). Fixed, aligned to key 0, never derived from the thread count.
inline constexpr int64_t kExactKeyChunk = 16384;

/// `out` is resized to n × pv. Keys beyond one chunk of kExactKeyChunk are cut into chunks aligned to key 0;
/// each query block's online-softmax state over each chunk is computed on its own and the states are merged
/// in chunk order in log space, so a decode step (a few rows, one query block) spreads over the pool's
/// threads along the cache and reads K and V once. With a pool, blocks (or, with few blocks, block × chunk
/// items) are spread over its threads; the result does not depend on the thread count (each query row sees
/// the same key blocking and chunking, whatever other rows are evaluated with it). `shaping` as for
/// exact_attention_f64, applied in float32 to each block of scores as it is formed.
void exact_attention_f32(const MatrixF& q, const MatrixF& k, const MatrixF& v, float scale, MatrixF& out,
                         ThreadPool* pool, const QueryGeometry& geometry, const ScoreShaping* shaping = nullptr);
inline void exact_attention_f32(const MatrixF& q, const MatrixF& k, const MatrixF& v, float scale, MatrixF& out,
                                ThreadPool* pool = nullptr, Mask mask = Mask::kFull) {
  exact_attention_f32(q, k, v, scale, out, pool, QueryGeometry{mask});
}

/// Exact attention computed at FlashAttention-2's rounding points in `precision` (bf16 or f16; DESIGN of
/// docs/precision.md, "Exact attention"): 1. q, k, v rounded to it; 2. S = fl32(fl32(q·k)·fl32(s)); 3. P = fl32(exp(
/// fl32(S − rowmax S))) and its row sum in float32; 4. P rounded to the precision, P·V in float32; 5. O = fl32(P·V /
/// rowsum) rounded to the precision. Each float32 accumulation (q·k, the row sum, P·V) is summed in float64 and
/// stored once in float32: a GPU's float32 sum in its own order differs from that by ~1e-7, far below the bf16/f16
/// rounding studied here, and the rounding points become the only error, which an independent emulation
/// reproduces bit for bit. `shaping` turns S into the model's logit in float64, stored in float32. f16 overflow
/// gives ±inf or NaN in `out`, never an error. `precision` f32 or f64 is refused (exact_attention_f32/_f64 are
/// those). Shapes and geometry as exact_attention_f32; the result does not depend on the pool.
void exact_attention_rounded(const MatrixF& q, const MatrixF& k, const MatrixF& v, float scale, Precision precision,
                             MatrixF& out, ThreadPool* pool, const QueryGeometry& geometry,
                             const ScoreShaping* shaping = nullptr);

/// Exact attention as an estimator's step computes it in a case's precision: exact_attention_f32 at f32,
/// exact_attention_rounded below it (an estimator that attends keys it made, e.g. projected ones).
inline void exact_attention_in(const MatrixF& q, const MatrixF& k, const MatrixF& v, float scale, Precision precision,
                               MatrixF& out, ThreadPool* pool, const QueryGeometry& geometry) {
  if (below_float32(precision))
    exact_attention_rounded(q, k, v, scale, precision, out, pool, geometry);
  else
    exact_attention_f32(q, k, v, scale, out, pool, geometry);
}

/// Softmax attention of a few query rows (landmarks, samples: up to a few hundred) over many keys, with
/// an optional bias per key: out_i = Σ_j softmax_j(scale·q_i·k_j + bias_j)·v_j (rows × pv) and, when
/// asked, log_normaliser_i = log Σ_j exp(scale·q_i·k_j + bias_j) (rows, float64). The keys are cut into
/// fixed chunks of 512, each an online softmax on the pool, combined in chunk order: a pool speeds it up
/// although there is only one query block, and the bits do not depend on the thread count. v may have no
/// columns (then only the normalisers are wanted). q: rows × p, k: keys × p (keys ≥ 1), v: keys × pv.
/// `alongside`, when given, runs as one more item of the chunks' parallel region, the first one claimed
/// (without a pool: before the chunks): serial work the caller needs next to this pass, such as
/// Nyström's pseudo-inverse, then keeps one thread busy while the others take the chunks.
/// `logits`, when given, is resized to rows × keys and receives every scale·q_i·k_j + bias_j as the pass
/// forms it, for a caller that needs them again once the normalisers are known (Skeinformer's column
/// norms): rows × keys floats, so only for small products.
void key_chunked_attention_f32(const MatrixF& q, const MatrixF& k, const MatrixF& v, float scale,
                               const RowVectorF* key_bias, MatrixF& out, VectorD* log_normaliser = nullptr,
                               ThreadPool* pool = nullptr, const std::function<void()>& alongside = {},
                               MatrixF* logits = nullptr);

/// C = alpha·A·Bᵀ + beta·C (row-major, float) with Eigen's GEMM. Eigen rather than OpenBLAS: built
/// with -march=native it uses AVX-512 wherever the CPU has it, while OpenBLAS picks its kernel from
/// the CPUID model at load time and falls back to SSE3 ("Prescott", 4× slower) on the generic
/// "Intel Xeon Processor" these VMs report; measured in `attnprobe bench`.
/// a: m × kdim (leading dim lda), b: n × kdim (ldb), c: m × n (ldc).
void gemm_abt(int m, int n, int kdim, float alpha, const float* a, int lda, const float* b, int ldb, float beta,
              float* c, int ldc);
/// C = alpha·A·B + beta·C (row-major, float). a: m × kdim, b: kdim × n, c: m × n.
void gemm_ab(int m, int n, int kdim, float alpha, const float* a, int lda, const float* b, int ldb, float beta,
             float* c, int ldc);

}  // namespace attnprobe
