#pragma once
// One (layer, head, batch item, length n) slice of a dump: the unit every estimator works on.
#include <cstdint>
#include <string>

#include "attnprobe/common/matrix.h"
#include "attnprobe/view/mask.h"

namespace attnprobe {

struct SliceId {
  int layer = 0;  ///< layer number (NN of layer_NN)
  int head = 0;   ///< head index
  int batch = 0;  ///< batch item index
  int64_t n = 0;  ///< tokens used: the prefix 0..n-1 of queries and keys
};

/// The data of one slice in both precisions: float64 exactly as stored (the reference and the
/// metrics use it) and float32 (what estimators compute with, as an efficient kernel would).
struct HeadView {
  SliceId id;
  double scale = 0;         ///< s in softmax(s·QKᵀ)
  Mask mask = Mask::kFull;  ///< causal: row i of every estimate may depend on tokens 0..i only
  MatrixD q, k, v;          ///< n × p, n × p, n × pv (float64)
  MatrixF qf, kf, vf;       ///< the same in float32

  int64_t n() const { return q.rows(); }
  int64_t p() const { return q.cols(); }
  int64_t pv() const { return v.cols(); }
};

/// Builds a view from float64 matrices (fills the float32 copies).
HeadView make_head_view(SliceId id, double scale, MatrixD q, MatrixD k, MatrixD v, Mask mask = Mask::kFull);

/// Finite values can still overflow what the estimators compute in float32 (squared norms, scores
/// s·q·k and their exponentials) and turn every metric into NaN. "" when q, k, v and scale stay within
/// a row norm of 1e18 and a score s·|q|·|k| of 1e30; else what exceeds them, with the figures and the
/// limits (the dump readers and the Python entry points refuse such slices). Each row norm is bounded
/// by max|x|·√width, which cannot itself overflow.
std::string magnitude_problem(const MatrixD& q, const MatrixD& k, const MatrixD& v, double scale);

}  // namespace attnprobe
