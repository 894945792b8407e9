#pragma once
// Generalised exponential random features (GERF; Likhosherstov et al., "Chefs' Random Tables",
// NeurIPS 2022, and the FAVOR# follow-up, arXiv 2302.00787), shared by `favorpp` and `scatterbrain`.
// With x̃ = √s·x and ω ~ N(0, I_p), the positive map (sign +1) is
//   φ_m(x) = M^{-1/2}·D·exp(A‖ω_m‖² + B·ω_m·x̃ − ‖x̃‖²/2),  B = √(1 − 4A),  D = (1 − 4A)^{p/4},  A < 1/8,
// and E_ω[φ(x)·φ(y)] = exp(x̃·ỹ) for every such A (a Gaussian integral). A = 0 is Performer's FAVOR+.
// Every variant is stored in one form: log φ_m(x) = c_m + W_m·(x̃∘g) − ‖x̃∘g‖²/2 with W_m the effective
// projection (B·ω_m, or U·diag(√(1−4A_l))·Uᵀω_m for SDERF), c_m the quadratic term plus log D − ½ log M,
// and g a per-coordinate rescale (ARF: G for queries, 1/G for keys; ones otherwise).
// Fitting is float64 (O(n·p + M·p²), negligible); the n × M feature logits are computed in the
// caller's precision.
#include <cstdint>

#include "attnprobe/common/matrix.h"
#include "attnprobe/estimators/common/precision.h"
#include "attnprobe/estimators/random_features/feature_attention.h"
#include "attnprobe/rng/random_stream.h"

namespace attnprobe {

enum class GerfVariant {
  kOprf,   ///< one A for all directions (CRT's optimal positive random features, FAVOR++)
  kArf,    ///< OPRF after rescaling coordinate l of queries by G_l and keys by 1/G_l (q·k unchanged)
  kSderf,  ///< one A_l per eigendirection of the pair-mean of (q̃ + k̃)(q̃ + k̃)ᵀ
};

struct GerfOptions {
  GerfVariant variant = GerfVariant::kOprf;
  bool optimal_a = true;       ///< A* fitted to the slice; otherwise every A (or A_l) is `a`
  double a = 0;                ///< used when !optimal_a; must be < 1/8
  bool arf_reference = false;  ///< ARF with google-research's G_l = (Σq²/Σk²)^{1/4} (variance-increasing)
  int sign = 1;                ///< +1 positive; −1 trigonometric (CRT's other branch; oprf with a numeric a only)
};

/// A feature map fitted to one slice (see the header comment for the form).
struct GerfMap {
  MatrixD projections;     ///< M × p: W_m
  VectorD offsets;         ///< M: c_m = quadratic term + log D − ½ log M
  RowVectorD query_scale;  ///< p: g for queries
  RowVectorD key_scale;    ///< p: g for keys
  int sign = 1;            ///< −1: trigonometric features [cos(W·x̃), sin(W·x̃)]·exp(c + ‖x̃‖²/2)
  double a = 0;            ///< the A used (oprf/arf), or the mean of the A_l (sderf)
};

/// z = mean over all pairs (i, j) of ‖x_i + y_j‖² = mean‖x‖² + mean‖y‖² + 2·x̄·ȳ  (x: n × p, y: n′ × p).
double mean_pair_sq_norm(const MatrixD& x, const MatrixD& y);

/// CRT's closed form A* = (1 − 2z/p − √((2z/p + 1)² + 8z/p))/16, the minimiser of the pair average
/// of log E[(φ(x)·φ(y))²]; 0 when z = 0. Always ≤ 0.
double oprf_optimal_a(double z, int64_t p);

/// Variance over ω of one feature's product φ_1(x)·φ_1(y)·M (iid ω, positive map):
/// (1−4A)^p·(1−8A)^{−p/2}·exp(2(1−4A)‖x+y‖²/(1−8A) − ‖x‖² − ‖y‖²) − exp(2x·y). x, y: 1 × p, scaled.
double oprf_feature_variance(double a, const RowVectorD& x, const RowVectorD& y);

/// Pair average of the log second moment, p·log(1−4A) − (p/2)·log(1−8A) + 2(1−4A)·z/(1−8A) − mean‖x‖² −
/// mean‖y‖², which CRT's A* minimises (z as in mean_pair_sq_norm).
double oprf_mean_log_second_moment(double a, double z, double mean_x_sq, double mean_y_sq, int64_t p);

/// Fits the map of `options` to queries/keys (n × p each, raw: x̃ = √scale·x) with ω_m = draw_omegas(features,
/// p, orthogonal, key) (so A = 0 gives Performer's exact features). Only column statistics and p × p
/// products of q and k are formed (no n × p copies: sderf's Gram matrices widen 256 rows at a time); their
/// row sums run in fixed groups on the pool when one is given (the map does not depend on it). Throws UsageError (a
/// spec error) for A ≥ 1/8. Input: MatrixD, or MatrixF (the float32 estimates' copy, half the bytes to read; the
/// statistics are still summed in float64, so the map is the same whenever the float32 copy is exact: every dump stored
/// as float32, bf16 or fp16).
template <typename Input>
GerfMap fit_gerf(const GerfOptions& options, const Input& q, const Input& k, double scale, int64_t features,
                 bool orthogonal, RandomKey key, ThreadPool* pool = nullptr);

/// Performer's map (A = 0) on the given ω (M × p).
GerfMap positive_map(const MatrixD& omegas);

/// The hyperbolic map of fly's Scatterbrain: features ξ(x, ω_m) and ξ(x, −ω_m) for each of the
/// rows ω_m (M/2 × p), scaled by M^{-1/2} with M = 2·rows.
GerfMap hyperbolic_map(const MatrixD& omegas);

/// log φ_m(x̃_i) (n × M) for rows x_i of x (n × p, raw; x̃ = √scale·x), positive maps only; `query` picks
/// the rescale g. √scale and g are folded into the M × p projections, so x is read once and not copied.
template <typename S>
MatrixT<S> gerf_log_features(const GerfMap& map, const MatrixT<S>& x, double scale, bool query);

/// A positive map (sign +1) in the form of the blocked float32 forward (feature_attention.h): w^Q and w^K
/// the projections with √s·g folded in, c_m the offsets, h = ½·s·g_K² (one number when g_K is all ones).
PositiveFeatureMapF gerf_feature_map_f32(const GerfMap& map, double scale);

/// Exponentiates log-features under shifts that cancel: keys get one shift per feature, the column
/// maximum c_m of key_log (n′ × M), and queries carry it: query_log (n × M) becomes exp(Q + c − c_i) with
/// c_i its row maximum, key_log becomes exp(K − c), so φ(q_i)·φ(k_j) = e^{c_i}·Q̃_i·K̃_j. Every key column
/// and every query row holds a 1, so Σ_m Q̃_im·Σ_j K̃_jm ≥ 1: float32 cannot underflow a denominator to 0
/// (one shift per slice did, at p = 8 where A* is very negative and A‖ω‖² spreads the features over ~100
/// nats). query_shift (optional) receives c_i. Fixed row blocks run on the pool when one is given (the
/// maxima are exact, so the result does not depend on it).
template <typename S>
void exponentiate_features(MatrixT<S>& query_log, MatrixT<S>& key_log, VectorD* query_shift = nullptr,
                           ThreadPool* pool = nullptr);

}  // namespace attnprobe
