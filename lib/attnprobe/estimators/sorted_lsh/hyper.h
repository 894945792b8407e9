#pragma once
// hyper — HyperAttention's non-causal forward; kdeformer — KDEformer as coded. See hyper.cpp, kdeformer.cpp.
#include <cstdint>
#include <vector>

#include "attnprobe/estimators/common/precision.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/sorted_lsh/sort_lsh.h"
#include "attnprobe/view/head_view.h"

namespace attnprobe {

/// The keys hyper and kdeformer share, in registration (canonical) order: m (the samples knob; its
/// default and help differ), b, r, order; then `own`, each estimator's own keys.
std::vector<ParamDef> sorted_lsh_params(std::string m_default, std::string m_help, std::vector<ParamDef> own);
/// Both draw nothing with m = 0 samples and r = 0 hash bits (contiguous blocks): deterministic then.
bool sorted_lsh_random(const Spec& spec);

class Spec;

struct HyperParams {
  int64_t samples = 64;  ///< m, uniform residual samples (with replacement), shared by all queries
  int64_t block = 64;    ///< b
  int bits = 7;          ///< r
  BucketOrder order = BucketOrder::kGray;
  bool mask = true;  ///< false: in-block samples counted again (the reference's fp32/flash path)
  static HyperParams from_spec(const Spec& spec);
};

/// n × pv estimate in precision S; log_denominator (optional) receives L_i = log D̂_i; `blocks`, when
/// given, replaces the hash drawn from `key` (tests fix the hash and vary the samples); the hashing and the
/// blocks run on `pool` when one is given (the result does not depend on it).
template <typename S>
MatrixT<S> hyper_attention(const HyperParams& params, const HeadView& view, RandomKey key,
                           VectorD* log_denominator = nullptr, const SortLshBlocks* blocks = nullptr,
                           ThreadPool* pool = nullptr);

enum class KdeProbs { kVnorm, kUniform, kColnorm };

struct KdeformerParams {
  int64_t samples = 128;  ///< m, samples ∝ P with replacement
  int64_t block = 64;     ///< b
  int bits = 7;           ///< r
  BucketOrder order = BucketOrder::kGray;
  KdeProbs probs = KdeProbs::kVnorm;
  static KdeformerParams from_spec(const Spec& spec);
};

/// Unnormalised sampling weights w_j (n): vnorm ‖ṽ_j‖/σ² + 1/n; uniform 1; colnorm
/// ‖(B∘(1−M^H))_{:,j}‖·‖ṽ_j‖ (O(n²·p) oracle). ṽ_j = [v_j, 1]. vnorm's ṼᵀṼ is summed in fixed row groups
/// on the pool when one is given (the result does not depend on it).
std::vector<double> kdeformer_weights(KdeProbs probs, const HeadView& view, const SortLshBlocks& blocks,
                                      ThreadPool* pool = nullptr);

/// n × pv estimate in precision S; log_denominator, blocks and pool as for hyper; weights (optional) receives w.
template <typename S>
MatrixT<S> kdeformer_attention(const KdeformerParams& params, const HeadView& view, RandomKey key,
                               VectorD* log_denominator = nullptr, std::vector<double>* weights = nullptr,
                               const SortLshBlocks* blocks = nullptr, ThreadPool* pool = nullptr);

}  // namespace attnprobe
