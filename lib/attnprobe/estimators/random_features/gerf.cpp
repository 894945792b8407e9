#include "attnprobe/estimators/random_features/gerf.h"

#include <fmt/format.h>
#include <Eigen/Eigenvalues>

#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "attnprobe/common/error.h"
#include "attnprobe/estimators/random_features/features.h"

namespace attnprobe {

namespace {

// A* for one direction whose pair-mean squared projection is x (x = z/p for OPRF, Σ_l for SDERF).
double optimal_a_per_direction(double x) {
  if (!(x > 0)) return 0;
  return (1 - 2 * x - std::sqrt((2 * x + 1) * (2 * x + 1) + 8 * x)) / 16;
}

void check_a(double a) {
  if (!(a < 0.125) || !std::isfinite(a))
    throw UsageError(fmt::format("favorpp: a = {} must be below 1/8 (the feature second moment is infinite)", a));
}

// Rows W_m = B·ω_m and offsets c_m = A‖ω_m‖² + (p/4)·log(1 − 4A) − ½·log M of a one-A map.
void fill_single_a(GerfMap& map, const MatrixD& omegas, double a) {
  const int64_t count = omegas.rows(), p = omegas.cols();
  map.a = a;
  map.projections = std::sqrt(1 - 4 * a) * omegas;
  const double log_d = 0.25 * static_cast<double>(p) * std::log1p(-4 * a);
  map.offsets =
      (a * omegas.rowwise().squaredNorm().array() + log_d - 0.5 * std::log(static_cast<double>(count))).matrix();
}

}  // namespace

double mean_pair_sq_norm(const MatrixD& x, const MatrixD& y) {
  const RowVectorD x_mean = x.colwise().mean(), y_mean = y.colwise().mean();
  return x.rowwise().squaredNorm().mean() + y.rowwise().squaredNorm().mean() + 2 * x_mean.dot(y_mean);
}

double oprf_optimal_a(double z, int64_t p) { return optimal_a_per_direction(z / static_cast<double>(p)); }

double oprf_feature_variance(double a, const RowVectorD& x, const RowVectorD& y) {
  const double p = static_cast<double>(x.size());
  const double log_second = p * std::log1p(-4 * a) - 0.5 * p * std::log1p(-8 * a) +
                            2 * (1 - 4 * a) * (x + y).squaredNorm() / (1 - 8 * a) - x.squaredNorm() - y.squaredNorm();
  return std::exp(log_second) - std::exp(2 * x.dot(y));
}

double oprf_mean_log_second_moment(double a, double z, double mean_x_sq, double mean_y_sq, int64_t p) {
  const double pd = static_cast<double>(p);
  return pd * std::log1p(-4 * a) - 0.5 * pd * std::log1p(-8 * a) + 2 * (1 - 4 * a) * z / (1 - 8 * a) - mean_x_sq -
         mean_y_sq;
}

namespace {
// Σ_i x_iᵀx_i (p × p; the lower triangle) in float64: sum_row_groups' fixed groups on the pool and, inside a
// group, blocks of kGramRows rows widened to float64 one block at a time. A rank update of the whole
// transposed input, widened, made Eigen evaluate an n × p float64 copy first (32 MiB at n = 65536).
template <typename Input>
MatrixD gram_lower(const Input& x, ThreadPool* pool) {
  constexpr int64_t kGramRows = 256;
  const int64_t p = x.cols();
  return sum_row_groups<MatrixD>(pool, x.rows(), MatrixD::Zero(p, p), [&](int64_t begin, int64_t end, MatrixD& part) {
    MatrixD block;
    for (int64_t r = begin; r < end; r += kGramRows) {
      block = x.middleRows(r, std::min(kGramRows, end - r)).template cast<double>();
      part.selfadjointView<Eigen::Lower>().rankUpdate(block.transpose());
    }
  });
}
}  // namespace

template <typename Input>
GerfMap fit_gerf(const GerfOptions& options, const Input& q, const Input& k, double scale, int64_t features,
                 bool orthogonal, RandomKey key, ThreadPool* pool) {
  const int64_t p = q.cols();
  const double nq = static_cast<double>(q.rows()), nk = static_cast<double>(k.rows());
  const MatrixD omegas = draw_omegas(features, p, orthogonal, key, pool);
  GerfMap map;
  map.sign = options.sign;
  map.query_scale = RowVectorD::Ones(p);
  map.key_scale = RowVectorD::Ones(p);
  if (!options.optimal_a) check_a(options.a);
  // Column statistics of the scaled data: Σ_i q̃_il², Σ_j k̃_jl², and the means q̃̄, k̃̄, summed along the
  // rows (colwise() reductions of the row-major slices strided down every column: a fifth of a call), in
  // sum_row_groups' fixed groups on the pool.
  auto column_sums = [&](const Input& x, RowVectorD& squares, RowVectorD& mean) {
    // Row 0: Σ x_il², row 1: Σ x_il, in float64 (float32 rows widened as they are read, add_rows_f64).
    const MatrixD sums =
        sum_row_groups<MatrixD>(pool, x.rows(), MatrixD::Zero(2, p), [&](int64_t begin, int64_t end, MatrixD& part) {
          if constexpr (std::is_same_v<typename Input::Scalar, float>) {
            add_rows_f64(x.row(begin).data(), p, end - begin, p, part.row(1).data(), part.row(0).data());
          } else {
            for (int64_t i = begin; i < end; ++i) {
              part.row(0).array() += x.row(i).array().square();
              part.row(1) += x.row(i);
            }
          }
        });
    squares = scale * sums.row(0);
    mean = (std::sqrt(scale) / static_cast<double>(x.rows())) * sums.row(1);
  };
  RowVectorD q_sq, k_sq, q_mean, k_mean;
  column_sums(q, q_sq, q_mean);
  column_sums(k, k_sq, k_mean);

  switch (options.variant) {
    case GerfVariant::kOprf:
    case GerfVariant::kArf: {
      if (options.variant == GerfVariant::kArf) {
        // Balancing G_l = (Σ_j k_jl² / Σ_i q_il²)^{1/4} equalises the rescaled sums, which minimises the
        // variance formula; the reference's inverse exponent makes the larger side larger.
        for (int64_t l = 0; l < p; ++l) {
          if (!(q_sq(l) > 0) || !(k_sq(l) > 0)) continue;  // a zero sum: G = 1
          const double g = std::pow(options.arf_reference ? q_sq(l) / k_sq(l) : k_sq(l) / q_sq(l), 0.25);
          map.query_scale(l) = g;
          map.key_scale(l) = 1 / g;
        }
      }
      double a = options.a;
      if (options.optimal_a) {
        // z of the rescaled data: mean‖g∘q̃‖² + mean‖k̃/g‖² + 2·q̃̄·k̃̄ (the rescale cancels in the cross term).
        const double z = (q_sq.array() * map.query_scale.array().square()).sum() / nq +
                         (k_sq.array() * map.key_scale.array().square()).sum() / nk + 2 * q_mean.dot(k_mean);
        a = oprf_optimal_a(z, p);
      }
      fill_single_a(map, omegas, a);
      break;
    }
    case GerfVariant::kSderf: {
      // P = mean over pairs of (q̃ + k̃)(q̃ + k̃)ᵀ = s·(QᵀQ/n + KᵀK/n′) + q̃̄k̃̄ᵀ + k̃̄q̃̄ᵀ, p × p.
      // QᵀQ and KᵀK as symmetric rank updates (half a product each; the eigensolver reads the lower triangle).
      MatrixD pair = q_mean.transpose() * k_mean + k_mean.transpose() * q_mean;
      pair += (scale / nq) * gram_lower(q, pool) + (scale / nk) * gram_lower(k, pool);
      const Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eigen(pair);
      const Eigen::MatrixXd u = eigen.eigenvectors();
      VectorD a_l(p);
      for (int64_t l = 0; l < p; ++l)
        a_l(l) = options.optimal_a ? optimal_a_per_direction(std::max(0.0, eigen.eigenvalues()(l))) : options.a;
      map.a = a_l.mean();
      // ω′ = Uᵀω is again N(0, I) (or orthogonal); per direction the one-A algebra applies:
      // W_m = U·diag(√(1 − 4A_l))·ω′_m, c_m = Σ_l A_l·ω′_ml² + ¼·Σ_l log(1 − 4A_l) − ½·log M.
      const MatrixD rotated = omegas * u;  // row m: ω′_mᵀ
      const VectorD root = (1 - 4 * a_l.array()).sqrt();
      map.projections = (rotated.array().rowwise() * root.transpose().array()).matrix() * u.transpose();
      const double log_d = 0.25 * (-4 * a_l.array()).log1p().sum();
      map.offsets =
          (rotated.array().square().matrix() * a_l).array() + log_d - 0.5 * std::log(static_cast<double>(features));
      break;
    }
  }
  return map;
}

template GerfMap fit_gerf(const GerfOptions&, const MatrixD&, const MatrixD&, double, int64_t, bool, RandomKey,
                          ThreadPool*);
template GerfMap fit_gerf(const GerfOptions&, const MatrixF&, const MatrixF&, double, int64_t, bool, RandomKey,
                          ThreadPool*);

GerfMap positive_map(const MatrixD& omegas) {
  GerfMap map;
  map.query_scale = RowVectorD::Ones(omegas.cols());
  map.key_scale = map.query_scale;
  fill_single_a(map, omegas, 0);
  return map;
}

GerfMap hyperbolic_map(const MatrixD& omegas) {
  MatrixD both(2 * omegas.rows(), omegas.cols());
  both << omegas, -omegas;
  return positive_map(both);
}

template <typename S>
MatrixT<S> gerf_log_features(const GerfMap& map, const MatrixT<S>& x, double scale, bool query) {
  const RowVectorD g = std::sqrt(scale) * (query ? map.query_scale : map.key_scale);  // x̃∘g = x∘(√s·g)
  const MatrixT<S> projections = (map.projections.array().rowwise() * g.array()).matrix().template cast<S>();
  const RowVectorT<S> half_g_sq = (0.5 * g.array().square()).matrix().template cast<S>();
  MatrixT<S> out = x * projections.transpose();  // n × M
  out.rowwise() += map.offsets.cast<S>().transpose();
  for (int64_t i = 0; i < x.rows(); ++i) out.row(i).array() -= (x.row(i).array().square() * half_g_sq.array()).sum();
  return out;
}

PositiveFeatureMapF gerf_feature_map_f32(const GerfMap& map, double scale) {
  PositiveFeatureMapF out;
  const RowVectorD g_query = std::sqrt(scale) * map.query_scale, g_key = std::sqrt(scale) * map.key_scale;
  out.query_t = (map.projections.array().rowwise() * g_query.array()).matrix().cast<float>().transpose();
  out.key_t = (map.projections.array().rowwise() * g_key.array()).matrix().cast<float>().transpose();
  out.offsets = map.offsets.cast<float>().transpose();
  if ((map.key_scale.array() == 1.0).all())
    out.key_square_weight = static_cast<float>(0.5 * scale);
  else
    out.key_square_weights = (0.5 * g_key.array().square()).matrix().cast<float>();
  return out;
}

template <typename S>
void exponentiate_features(MatrixT<S>& query_log, MatrixT<S>& key_log, VectorD* query_shift, ThreadPool* pool) {
  constexpr int64_t kBlock = 256;
  auto blocks = [&](const MatrixT<S>& x) { return (x.rows() + kBlock - 1) / kBlock; };
  auto rows_of = [&](MatrixT<S>& x, int64_t b) {
    return x.middleRows(b * kBlock, std::min(kBlock, x.rows() - b * kBlock));
  };
  std::vector<RowVectorT<S>> block_max(blocks(key_log));
  for_each_index(pool, blocks(key_log), [&](int64_t b) { block_max[b] = column_max(rows_of(key_log, b)); });
  RowVectorT<S> column_max = RowVectorT<S>::Constant(key_log.cols(), -std::numeric_limits<S>::infinity());
  for (const RowVectorT<S>& m : block_max) column_max = column_max.cwiseMax(m);
  for_each_index(pool, blocks(key_log), [&](int64_t b) {
    auto rows = rows_of(key_log, b);
    rows.array().rowwise() -= column_max.array();
    rows = rows.array().exp();
  });
  if (query_shift) query_shift->resize(query_log.rows());
  for_each_index(pool, blocks(query_log), [&](int64_t b) {
    for (int64_t i = b * kBlock; i < std::min(query_log.rows(), (b + 1) * kBlock); ++i) {
      auto row = query_log.row(i);
      row += column_max;
      const S row_max = row.maxCoeff();
      if (query_shift) (*query_shift)(i) = static_cast<double>(row_max);
      row.array() = (row.array() - row_max).exp();
    }
  });
}

template void exponentiate_features<float>(MatrixT<float>&, MatrixT<float>&, VectorD*, ThreadPool*);
template void exponentiate_features<double>(MatrixT<double>&, MatrixT<double>&, VectorD*, ThreadPool*);

template MatrixT<float> gerf_log_features<float>(const GerfMap&, const MatrixT<float>&, double, bool);
template MatrixT<double> gerf_log_features<double>(const GerfMap&, const MatrixT<double>&, double, bool);

}  // namespace attnprobe
