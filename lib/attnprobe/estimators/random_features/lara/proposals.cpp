#include "attnprobe/estimators/random_features/lara/proposals.h"

#include <cmath>
#include <numbers>
#include <vector>

#include "attnprobe/estimators/common/landmarks.h"
#include "attnprobe/exact/exact_attention.h"

namespace attnprobe {

namespace {
double log_sum_exp(const RowVectorD& x) {
  const double max = x.maxCoeff();
  return max + std::log((x.array() - max).exp().sum());
}
}  // namespace

LaraProposals lara_proposals(const LaraParams& params, const MatrixD& q_bar, const MatrixD& k_bar, const MatrixD& k,
                             int64_t n, int64_t p, double draw_sigma, RandomKey key) {
  const int64_t c_count = q_bar.rows();
  // Mixture weights π_cj = softmax_j(q̄_c·k̃_j) (attn and mixture proposals).
  MatrixD log_pi;
  if (params.proposal == LaraProposal::kAttn || params.proposal == LaraProposal::kMixture) {
    log_pi = q_bar * k.transpose();
    for (int64_t c = 0; c < c_count; ++c) log_pi.row(c).array() -= log_sum_exp(log_pi.row(c));
  }
  MatrixD mu;
  switch (params.proposal) {
    case LaraProposal::kSegment:
      mu = q_bar + k_bar;
      break;
    case LaraProposal::kAttn:
    case LaraProposal::kMixture:
      mu = q_bar + log_pi.array().exp().matrix() * k;
      break;
    case LaraProposal::kMixed: {
      MatrixD weights = k_bar * k_bar.transpose();
      softmax_rows(weights);
      mu = q_bar + weights * k_bar;
      break;
    }
  }

  // One sample per proposal.
  MatrixD omegas = mu;
  if (params.sample) {
    const RandomStream noise(key, Purpose::kNoise), component(key, Purpose::kComponent);
    RowVectorD eps(p);
    for (int64_t c = 0; c < c_count; ++c) {
      if (params.proposal == LaraProposal::kMixture) {
        const RowVectorD row = log_pi.row(c).array().exp();
        const std::vector<double> pi(row.data(), row.data() + n);
        const int64_t j = sample_with_replacement(pi, 1, component, static_cast<uint32_t>(c))[0];
        omegas.row(c) = q_bar.row(c) + k.row(j);
      }
      noise.normals(static_cast<uint32_t>(c), 0, eps.data(), p);
      omegas.row(c) += draw_sigma * eps;
    }
  }

  // log q_c′(ω_c) for every sample c and proposal c′ (C × C), q_c′ = N(μ_c′, I) whatever the noise.
  const double log_norm = -0.5 * p * std::log(2 * std::numbers::pi);
  MatrixD log_q(c_count, c_count);
  if (params.proposal == LaraProposal::kMixture) {
    // ‖ω − q̄_c′ − k̃_j‖² = ‖ω − q̄_c′‖² − 2(ω·k̃_j − q̄_c′·k̃_j) + ‖k̃_j‖²  (O(C²·n) after two products)
    const MatrixD omega_k = omegas * k.transpose(), qbar_k = q_bar * k.transpose();
    const RowVectorD k_norm2 = k.rowwise().squaredNorm().transpose();
    for (int64_t c = 0; c < c_count; ++c)
      for (int64_t cp = 0; cp < c_count; ++cp) {
        const double base = (omegas.row(c) - q_bar.row(cp)).squaredNorm();
        const RowVectorD terms =
            log_pi.row(cp).array() - (base - 2 * (omega_k.row(c) - qbar_k.row(cp)).array() + k_norm2.array()) / 2;
        log_q(c, cp) = log_norm + log_sum_exp(terms);
      }
  } else {
    // ‖ω_c − μ_c′‖² = ‖ω_c‖² + ‖μ_c′‖² − 2·ω_c·μ_c′, one C × C × p product.
    log_q = 2 * omegas * mu.transpose();
    log_q.colwise() -= omegas.rowwise().squaredNorm();
    log_q.rowwise() -= mu.rowwise().squaredNorm().transpose();
    log_q = (log_q.array() / 2 + log_norm).matrix();
  }
  return {std::move(log_pi), std::move(mu), std::move(omegas), std::move(log_q)};
}

}  // namespace attnprobe
