#pragma once
// The spectrum of a symmetric matrix, M = U·diag(λ)·Uᵀ, with U kept as the factors that produce it
// (docs/estimators/nystrom.md): the Householder reflections of the reduction to tridiagonal form and
// the Givens rotations of the implicit QR steps. A function of M applied to a thin block,
// f(M)·W = U·diag(f(λ))·Uᵀ·W, then costs O(L²·cols) per product instead of the O(L³) of forming U
// (Eigen's SelfAdjointEigenSolver accumulates every rotation into an L × L matrix). Nyström's
// pseudo-inverse at L = 256 applied to 64 columns: ~2.6 ms of a ~4.7 ms call that took ~6.9 with
// Eigen's solver (n = 1024, one thread).
#include <Eigen/Eigenvalues>
#include <cstdint>
#include <vector>

#include "attnprobe/common/matrix.h"

namespace attnprobe {

class SymmetricSpectrum {
 public:
  /// Reads the lower triangle of m (square). Throws std::runtime_error if the QR steps do not converge
  /// in 30·L sweeps (they converge in ~1.7 per eigenvalue on every matrix we have met).
  explicit SymmetricSpectrum(const Eigen::MatrixXd& m);

  /// λ, in no particular order; entry i belongs to column i of U.
  const VectorD& eigenvalues() const { return eigenvalues_; }
  /// Uᵀ·w (L × cols).
  MatrixD to_eigenbasis(const MatrixD& w) const;
  /// U·w (L × cols).
  MatrixD from_eigenbasis(const MatrixD& w) const;
  /// U itself (L × L): one pass of the rotations over L columns, where Uᵀ·w then U·w make two over
  /// w's columns; the cheaper route once w has more than L/2 columns.
  MatrixD eigenvectors() const { return from_eigenbasis(MatrixD::Identity(eigenvalues_.size(), eigenvalues_.size())); }

 private:
  struct Sweep {
    int64_t start, end;  ///< one QR step rotates the pairs (k, k+1), k = start … end − 1
  };
  Eigen::Tridiagonalization<Eigen::MatrixXd> tridiagonal_;
  VectorD eigenvalues_;
  std::vector<Sweep> sweeps_;
  std::vector<double> cosines_, sines_;  ///< the rotations, in the order the sweeps made them
};

}  // namespace attnprobe
