#include "attnprobe/estimators/random_features/features.h"

#include <Eigen/Cholesky>
#include <Eigen/QR>
#include <algorithm>
#include <cmath>
#include <limits>

namespace attnprobe {

namespace {
// Householder QR of the block's transpose: Q's column r is row r of the result once multiplied by the
// sign of R's diagonal entry r. Householder's Q has a sign convention tied to the input (its first
// column always points against x₁'s first coordinate), which biases ω·x; the signs of R's diagonal undo
// it, making Q the Gram–Schmidt basis, Haar-distributed — without this the feature products were
// biased (mean 0.88 for a target of 0.94, z = −15).
MatrixD householder_orthonormal_rows(const MatrixD& block) {
  const int64_t rows = block.rows(), p = block.cols();
  // Column-major: the block's rows are the columns of the p × rows matrix factored, contiguous as the
  // column operations of Householder's QR want them.
  const Eigen::MatrixXd columns = block.transpose();
  const Eigen::HouseholderQR<Eigen::MatrixXd> qr(columns);
  const Eigen::MatrixXd q = qr.householderQ() * Eigen::MatrixXd::Identity(p, rows);
  MatrixD out(rows, p);
  for (int64_t r = 0; r < rows; ++r) out.row(r) = (qr.matrixQR()(r, r) < 0 ? -1.0 : 1.0) * q.col(r).transpose();
  return out;
}
}  // namespace

MatrixD orthonormal_rows(const MatrixD& block) {
  const int64_t rows = block.rows();
  MatrixD q = block;
  for (int pass = 0; pass < 2; ++pass) {
    // Column-major: Eigen's LLT on a row-major lower triangle took 11.2 µs at 64 × 64 against 6.1 µs, and
    // the whole CholQR2 of a 64 × 64 block 49 → 40 µs (a fifth of a Performer(256) call at n = 1024 is
    // its four blocks). The rows differ from the row-major Gram's by rounding (≤ 6e-16).
    Eigen::MatrixXd gram = Eigen::MatrixXd::Zero(rows, rows);
    gram.selfadjointView<Eigen::Lower>().rankUpdate(q);  // q·qᵀ, lower triangle
    if (pass == 1) {
      // The first pass must have left rows close to orthonormal for the second to end at rounding.
      double worst = 0;
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j <= i; ++j) worst = std::max(worst, std::abs(gram(i, j) - (i == j ? 1.0 : 0.0)));
      if (!(worst < 0.1)) return householder_orthonormal_rows(block);
    }
    const Eigen::LLT<Eigen::MatrixXd, Eigen::Lower> cholesky(gram);
    if (cholesky.info() != Eigen::Success) return householder_orthonormal_rows(block);
    cholesky.matrixL().solveInPlace(q);  // L⁻¹·q: L has a positive diagonal, so the Gram–Schmidt basis
  }
  return q;
}

MatrixD draw_omegas(int64_t count, int64_t p, bool orthogonal, RandomKey key, ThreadPool* pool) {
  const RandomStream gaussian(key, Purpose::kFeature);
  if (!orthogonal) return normal_rows(gaussian, count, p);
  // Each block of p rows drawn, orthonormalised, then row r given the norm of an independent N(0, I_p)
  // vector: blocks independent of each other (every row keyed by its index), so on the pool.
  const RandomStream norms(key, Purpose::kFeatureNorm);
  MatrixD omegas(count, p);
  for_each_index(pool, (count + p - 1) / p, [&](int64_t block) {
    const int64_t b0 = block * p, rows = std::min(p, count - b0);
    MatrixD gaussians(rows, p);
    for (int64_t r = 0; r < rows; ++r) gaussian.normals(static_cast<uint32_t>(b0 + r), 0, gaussians.row(r).data(), p);
    const MatrixD q = orthonormal_rows(gaussians);
    RowVectorD g(p);
    for (int64_t r = 0; r < rows; ++r) {
      norms.normals(static_cast<uint32_t>(b0 + r), 0, g.data(), p);
      omegas.row(b0 + r) = q.row(r) * g.norm();
    }
  });
  return omegas;
}

MatrixD log_features(const MatrixD& x_scaled, const MatrixD& omegas) {
  MatrixD out = x_scaled * omegas.transpose();
  out.colwise() -= 0.5 * x_scaled.rowwise().squaredNorm();
  return out;
}

CausalFeatureSums::CausalFeatureSums(int64_t features, int64_t pv, Precision stored)
    : shift(RowVectorD::Constant(features, -std::numeric_limits<double>::infinity())),
      z(RowVectorD::Zero(features)),
      kv(MatrixD::Zero(features, pv)),
      stored(stored) {}

void CausalFeatureSums::add(const Eigen::Ref<const RowVectorD>& log_key, const Eigen::Ref<const RowVectorD>& value) {
  for (int64_t f = 0; f < shift.size(); ++f) {
    if (log_key(f) > shift(f)) {  // exp(−inf) = 0 on the first key: the sums are 0 then anyway
      const double factor = std::exp(shift(f) - log_key(f));
      kv.row(f) *= factor;
      z(f) *= factor;
      shift(f) = log_key(f);
    }
    const double w = std::exp(log_key(f) - shift(f));
    if (!below_float32(stored)) {
      kv.row(f) += w * value;
      z(f) += w;
      continue;
    }
    const double w_stored = store_as(w, stored);
    for (int64_t c = 0; c < kv.cols(); ++c) kv(f, c) = store_as(kv(f, c) + w_stored * value(c), stored);
    z(f) = store_as(z(f) + w_stored, stored);
  }
}

MatrixD key_value_average(const MatrixD& omegas, const MatrixD& k_scaled, const MatrixD& v, VectorD* log_sum) {
  MatrixD logits = omegas * k_scaled.transpose();  // rows × n
  logits.rowwise() -= 0.5 * k_scaled.rowwise().squaredNorm().transpose();
  if (log_sum) log_sum->resize(logits.rows());
  for (int64_t r = 0; r < logits.rows(); ++r) {
    const double max = logits.row(r).maxCoeff();
    logits.row(r).array() = (logits.row(r).array() - max).exp();
    const double sum = logits.row(r).sum();
    if (log_sum) (*log_sum)(r) = max + std::log(sum);
    logits.row(r) /= sum;
  }
  return logits * v;
}

}  // namespace attnprobe
