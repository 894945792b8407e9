#pragma once
// The sortLSH block core shared by `hyper`, `kdeformer` and `scatterbrain(sparse=sortlsh)`
// (docs/estimators/beyond.md "sortLSH blocks"; HyperAttention's Alg. 1, KDEformer's LSH blocks):
//  1. code(x) = Σ_t [g_t·x > 0]·2^t with g_1..g_r iid N(0, I_p), one set for Q and K — exactly
//     lsh_codes(x, m=1, tau=r, gauss) (Purpose kHashProjection); r = 0 gives every code 0;
//  2. sort key: order=gray, the rank of the code in the reflected Gray sequence (neighbouring buckets
//     differ in one bit, the papers' intent), or order=code, gray(c) = c ⊕ (c≫1), what both reference
//     repositories compute (the Gray order only for r ≤ 2);
//  3. stable sort of queries by (key, index), likewise keys; β_Q(i) = ⌊sorted position of q_i / b⌋,
//     β_K(j) likewise, ⌈n/b⌉ blocks with the last one shorter, no padding (hyper-attn pads with zero
//     keys that enter the softmax with logit 0). H_i = {j : β_K(j) = β_Q(i)}.
// Plus the block-and-samples kernel both `hyper` and `kdeformer` evaluate:
//   F_i = Σ_{j∈H_i} e_ij·[v_j, 1] + Σ_u [β_K(t_u) ≠ β_Q(i)]·c_u·e_{i t_u}·[v_{t_u}, 1],  e_ij = exp(s·q_i·k_j),
// with one shift per row (the max over its block and unmasked sampled logits) serving both parts.
// Hashing is float64 (as yoso's: CPU and GPU must agree on every sign); the kernel runs in precision S.
// Cost O(n·r·p + n log n) for the blocks, O(n·(b + m)·(p + pv)) for the kernel.
#include <cstdint>
#include <vector>

#include "attnprobe/common/matrix.h"
#include "attnprobe/common/parallel.h"
#include "attnprobe/common/rounding.h"
#include "attnprobe/estimators/common/precision.h"
#include "attnprobe/rng/random_stream.h"

namespace attnprobe {

enum class BucketOrder { kGray, kCode };

/// The sort key of an r-bit code: its Gray rank c ⊕ (c≫1) ⊕ (c≫2) ⊕ … (kGray) or c ⊕ (c≫1) (kCode).
uint32_t bucket_sort_key(uint32_t code, BucketOrder order);

struct SortLshBlocks {
  int64_t block = 1;                 ///< b
  std::vector<int64_t> query_order;  ///< sorted position → query index (n)
  std::vector<int64_t> key_order;    ///< sorted position → key index (n)
  std::vector<int64_t> query_block;  ///< query index → β_Q(i)
  std::vector<int64_t> key_block;    ///< key index → β_K(j)
  int64_t blocks() const { return (static_cast<int64_t>(query_order.size()) + block - 1) / block; }
  /// Sorted positions [begin, end) of block g (the same range for queries and keys).
  int64_t begin(int64_t g) const { return g * block; }
  int64_t end(int64_t g) const { return std::min<int64_t>((g + 1) * block, static_cast<int64_t>(query_order.size())); }
};

/// Blocks of queries q (n × p) and keys k (n × p) with `bits` hash bits (0..30) and block size `block` ≥ 1;
/// the hashing runs on the pool when one is given (the codes do not depend on it).
SortLshBlocks sort_lsh_blocks(const MatrixD& q, const MatrixD& k, int bits, int64_t block, BucketOrder order,
                              RandomKey key, ThreadPool* pool = nullptr);

/// The kernel above for every query: `samples` t_u (indices into the keys) with weights c_u; with
/// `mask` false the in-block samples are kept (hyper-attn's fp32 path). out: n × pv, out_i = F_i[0..pv) /
/// F_i[pv]. log_denominator (optional): log F_i[pv], the estimated log D_i, in float64. Blocks run on the
/// pool when one is given (each block writes its own rows: the result does not depend on it).
/// `stored` below float32 (S = float only) stores each row's exponentials — the block's and the samples' times their
/// weights, under one shift — in the precision for their products with V, after their float32 row sum, as
/// FlashAttention-2 stores P (kSortedLshRounding).
template <typename S>
void block_plus_samples(const SliceData<S>& data, double scale, const SortLshBlocks& blocks,
                        const std::vector<int64_t>& samples, const std::vector<double>& sample_weights, bool mask,
                        MatrixT<S>& out, VectorD* log_denominator, ThreadPool* pool = nullptr,
                        Precision stored = Precision::kF32);

/// The rounding points of block_plus_samples below float32, as hyper and kdeformer declare them.
inline constexpr const char* kSortedLshRounding =
    "inputs and output in the precision; the hash codes and the sampling probabilities from the rounded inputs "
    "(float32 logits, float64 sums); one fused pass per block: the logits of the block's keys and of the samples "
    "and the row sum of their exponentials (the samples' times their weights, under one shift) float32, each "
    "exponential stored in the precision for its product with V (as P in FlashAttention-2), that product summed "
    "float32";

/// Rows [r0, r0 + rows) of the attention matrix the kernel above implies (rows × n, float64), so that
/// out_i = Σ_j Â_ij·v_j:  Â_ij = c_ij·e_ij / Σ_j′ c_ij′·e_ij′,  c_ij = [β_K(j) = β_Q(i)] + Σ_{u kept for i, t_u = j}
/// c_u (a key sampled twice counts twice; with `mask` false an in-block sample adds to the block's 1). Rows sum to one,
/// entries ≥ 0. q, k: n × p (raw). O(rows·n·p).
MatrixD block_plus_samples_rows(const MatrixD& q, const MatrixD& k, double scale, const SortLshBlocks& blocks,
                                const std::vector<int64_t>& samples, const std::vector<double>& sample_weights,
                                bool mask, int64_t r0, int64_t rows);

}  // namespace attnprobe
