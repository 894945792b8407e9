// Implicit symmetric QR with Wilkinson shifts on the tridiagonal form (Golub & Van Loan, Matrix
// Computations, §8.3), recording each rotation instead of accumulating it into U.
#include "attnprobe/estimators/common/symmetric_spectrum.h"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace attnprobe {
namespace {

struct Givens {
  double c, s, r;  ///< [c −s; s c]·[x; z] = [r; 0]
};

// Without hypot (a library call, most of the sweep's latency chain). When x² + z² would leave the
// normal range, the ratio of the smaller to the larger entry keeps the square root finite and exact.
Givens givens(double x, double z) {
  if (z == 0) return {1.0, 0.0, x};
  const double squares = x * x + z * z;
  if (squares > 1e-290 && squares < 1e290) {
    const double r = std::sqrt(squares), inverse = 1.0 / r;
    return {x * inverse, -z * inverse, r};
  }
  if (std::abs(x) >= std::abs(z)) {
    const double t = z / x, u = std::sqrt(1.0 + t * t), c = 1.0 / u;
    return {c, -t * c, x * u};
  }
  const double t = x / z, u = std::sqrt(1.0 + t * t), s = -1.0 / u;
  return {-t * s, s, z * u};
}

// Rows k and k + 1 of y ← [c −s; s c]·(those rows), vectorised along the contiguous rows. (Splitting
// the columns over two threads did not pay at L = 256, pv = 64: 32-column halves rotate ~1.4× slower
// per column than whole rows, and two threads on them took as long as one on the whole rows.)
void rotate_rows(MatrixD& y, int64_t k, double c, double s) {
  double* a = y.row(k).data();
  double* b = y.row(k + 1).data();
  for (int64_t j = 0; j < y.cols(); ++j) {
    const double u = a[j], v = b[j];
    a[j] = c * u - s * v;
    b[j] = s * u + c * v;
  }
}

}  // namespace

SymmetricSpectrum::SymmetricSpectrum(const Eigen::MatrixXd& m) : tridiagonal_(m) {
  const int64_t size = m.rows();
  VectorD d = tridiagonal_.diagonal();
  VectorD e = tridiagonal_.subDiagonal();  // e(i) couples i and i + 1
  const double eps = std::numeric_limits<double>::epsilon();
  int64_t end = size - 1, sweeps_left = 30 * size;
  cosines_.reserve(size * size);  // ~0.9·L² rotations on the matrices we have met
  sines_.reserve(size * size);
  while (end > 0) {
    for (int64_t i = 0; i < end; ++i) {
      const double off = std::abs(e(i));
      if (off <= eps * (std::abs(d(i)) + std::abs(d(i + 1))) || off < std::numeric_limits<double>::min()) e(i) = 0;
    }
    while (end > 0 && e(end - 1) == 0) --end;
    if (end == 0) break;
    if (sweeps_left-- == 0) throw std::runtime_error("symmetric eigensolver: the QR steps did not converge");
    int64_t start = end - 1;
    while (start > 0 && e(start - 1) != 0) --start;
    // Wilkinson's shift: the eigenvalue of the trailing 2 × 2 block nearer to its last diagonal entry.
    const double half_gap = 0.5 * (d(end - 1) - d(end)), off = e(end - 1);
    const double radius = std::sqrt(half_gap * half_gap + off * off);
    const double shift = d(end) - off * off / (half_gap + (half_gap >= 0 ? radius : -radius));
    // Chase the bulge from (start + 1, start) down to the end of the block.
    double x = d(start) - shift, z = e(start);
    sweeps_.push_back({start, end});
    for (int64_t k = start; k < end; ++k) {
      const auto [c, s, r] = givens(x, z);
      if (k > start) e(k - 1) = r;
      const double a = d(k), b = e(k), f = d(k + 1);
      const double cc = c * c, ss = s * s, cs = c * s;
      d(k) = cc * a - 2.0 * cs * b + ss * f;
      d(k + 1) = ss * a + 2.0 * cs * b + cc * f;
      e(k) = cs * (a - f) + (cc - ss) * b;
      if (k + 1 < end) {
        x = e(k);
        z = -s * e(k + 1);
        e(k + 1) *= c;
      }
      cosines_.push_back(c);
      sines_.push_back(s);
    }
  }
  eigenvalues_ = std::move(d);
}

// U = H·G₁·G₂⋯G_m (H: the Householder reflections; G_i = [c s; −s c] on coordinates k, k + 1: the
// rotations in the order they were made), so Uᵀ·w applies Hᵀ, then G₁ᵀ = [c −s; s c], G₂ᵀ, …, and U·w
// applies G_m, …, G₁, then H.
MatrixD SymmetricSpectrum::to_eigenbasis(const MatrixD& w) const {
  MatrixD y = tridiagonal_.matrixQ().transpose() * w;
  size_t r = 0;
  for (const Sweep& sweep : sweeps_)
    for (int64_t k = sweep.start; k < sweep.end; ++k, ++r) rotate_rows(y, k, cosines_[r], sines_[r]);
  return y;
}

MatrixD SymmetricSpectrum::from_eigenbasis(const MatrixD& w) const {
  MatrixD y = w;
  size_t r = cosines_.size();
  for (auto sweep = sweeps_.rbegin(); sweep != sweeps_.rend(); ++sweep)
    for (int64_t k = sweep->end - 1; k >= sweep->start; --k) {
      --r;
      rotate_rows(y, k, cosines_[r], -sines_[r]);
    }
  return tridiagonal_.matrixQ() * y;
}

}  // namespace attnprobe
