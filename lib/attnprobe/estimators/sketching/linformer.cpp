// linformer(d, std) and linformer-jlt(d) — low-rank projections (Wang et al., "Linformer", 2020;
// the Skeinformer paper §3.3.2; docs/estimators/sketching.md). Target: softmax.
//  - linformer:     E ∈ R^{d×n}, E_ij iid N(0, std²) (std = 0 means 1/√d, the JL scaling; the
//                   reference code's unscaled 0.02 is std=0.02); out = softmax(s·Q(EK)ᵀ)·(EV).
//                   O(n·d·p). Biased: the projection sits inside the softmax. E is never formed: EK and
//                   EV are accumulated over tiles of E (30 rows × 256 columns, 30 KiB) drawn as they
//                   are used, a group of E's rows per work item on the call's pool, so memory is
//                   O(d·p) beside the inputs and the bits do not depend on the thread count.
//  - linformer-jlt: out = B·S·Sᵀ·V with S ∈ R^{n×d}, S_ij iid N(0, 1/d), so E[SSᵀ] = I and the
//                   estimate is unbiased for B·V. O(n²): it shows what Linformer gave up.
#include <algorithm>
#include <cmath>

#include "attnprobe/common/error.h"
#include "attnprobe/common/parallel.h"
#include "attnprobe/estimators/common/landmarks.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/sketching/linformer_params.h"
#include "attnprobe/exact/exact_attention.h"
#include "attnprobe/exact/tile_product.h"

namespace attnprobe {

namespace {
// Entries t0 … t0 + count − 1 of row `row` of E (or S): float(std)·float_normal(row, t). E's law and element
// mapping, written once for the whole matrix (gaussian_matrix) and the tiles of project_keys_values alike. In
// float32 from the stream's float normals: E is used as floats, and drawing it in float arithmetic, four per
// Philox block, made the draws ~2.6× cheaper than rounding float64 Box–Muller (a third of a Linformer call).
void gaussian_row(const RandomStream& stream, int64_t row, int64_t t0, int64_t count, float scale, float* out) {
  stream.float_normals(static_cast<uint32_t>(row), 0, out, count, static_cast<uint32_t>(t0));
  for (int64_t c = 0; c < count; ++c) out[c] *= scale;
}
}  // namespace

MatrixF gaussian_matrix(int64_t rows, int64_t cols, double stddev, const RandomStream& stream) {
  MatrixF out(rows, cols);
  for (int64_t r = 0; r < rows; ++r) gaussian_row(stream, r, 0, cols, static_cast<float>(stddev), out.row(r).data());
  return out;
}

namespace {

// EK = E·K and EV = E·V (d × p, d × pv) without E: work item g owns rows [g·kGroupRows, …) of E, EK and EV and
// walks the keys in blocks of kTileColumns, drawing that tile of E (entry (r, t) = float(std)·float_normal(r, t),
// gaussian_matrix's law and element mapping) and adding tile·K_block and tile·V_block. Each row of EK and EV is
// summed in one fixed order (key blocks in turn, keys in turn inside one), so the result is the same for any
// pool. The tile is 30 KiB, the key block (256 × 64) 64 KiB; products alone at n = 16384, d = 256, Zen 4 core,
// 4-row blocks (GFLOP/s): tiles of 32 × 128 91, 64 × 128 100, 32 × 256 104, 32 × 512 105.
// The keys go in spans of about kSpanBytes of K and V, every group walking one span before the next: d / 30
// groups each walking all n keys read K and V nine times at d = 256, from memory once they outgrow the
// last-level cache (t(65536)/t(16384) 4.6). A span stays in the core's L2 for all groups. The same sums in the
// same order (spans in turn, tiles in turn inside one): the same bits.
constexpr int64_t kGroupRows = 30;  // five 6-row blocks
constexpr int64_t kTileColumns = 256;
constexpr int64_t kSpanBytes = int64_t{1} << 20;

struct ProjectionTile {
  MatrixF tile = MatrixF(kGroupRows, kTileColumns);  ///< Eigen-allocated: 64-byte aligned on every thread
  MatrixF k_part, v_part;                            ///< one tile's rows of E·K and E·V
};

void project_keys_values(const MatrixF& k, const MatrixF& v, double stddev, const RandomStream& stream, int64_t d,
                         ThreadPool* pool, MatrixF& k_proj, MatrixF& v_proj) {
  const int64_t n = k.rows();
  k_proj.setZero(d, k.cols());
  v_proj.setZero(d, v.cols());
  const float scale = static_cast<float>(stddev);
  const int64_t row_bytes = (k.cols() + v.cols()) * static_cast<int64_t>(sizeof(float));
  const int64_t span = std::max<int64_t>(1, kSpanBytes / (row_bytes * kTileColumns)) * kTileColumns;
  for (int64_t s0 = 0; s0 < n; s0 += span)
    for_each_index(pool, (d + kGroupRows - 1) / kGroupRows, [&](int64_t g) {
      thread_local ProjectionTile work;
      const int64_t r0 = g * kGroupRows, rows = std::min(kGroupRows, d - r0);
      for (int64_t t0 = s0; t0 < std::min(n, s0 + span); t0 += kTileColumns) {
        const int64_t cols = std::min(kTileColumns, n - t0);
        for (int64_t r = 0; r < rows; ++r) gaussian_row(stream, r0 + r, t0, cols, scale, work.tile.row(r).data());
        // Each tile's products into zeroed buffers, then added: chaining every tile's FMAs onto EK would make
        // one float32 sum of all n terms per element (the exact kernel's P·V does the same, for that reason).
        tile_product(work.tile.topLeftCorner(rows, cols), k.middleRows(t0, cols), work.k_part);
        tile_product(work.tile.topLeftCorner(rows, cols), v.middleRows(t0, cols), work.v_part);
        k_proj.middleRows(r0, rows) += work.k_part;
        v_proj.middleRows(r0, rows) += work.v_part;
      }
    });
}

class Linformer final : public Estimator {
 public:
  explicit Linformer(LinformerParams params) : params_(params) {}

  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    MatrixF k_proj, v_proj;  // d × p, d × pv
    project_keys_values(view.kf, view.vf, params_.effective_stddev(), RandomStream(ctx.key, Purpose::kProjection),
                        params_.d, ctx.pool, k_proj, v_proj);
    exact_attention_f32(view.qf, k_proj, v_proj, static_cast<float>(view.scale), out, ctx.pool);
  }

  // out = P·(E·V) with P = softmax(s·Q(EK)ᵀ) (n × d), so Â = P·E (rows × n): row i is a mixture of E's rows,
  // summing to Σ_r P_ir·Σ_j E_rj, not one, with entries of either sign (E is Gaussian). Float64 from the same
  // E. Setup O(d·n·p); O(rows·d·(p + n)) per block.
  WeightRows weights(const HeadView& view, const EstimateContext& ctx) const override {
    require_usage(view.mask == Mask::kFull, "linformer has no causal form");
    MatrixD e =
        gaussian_matrix(params_.d, view.n(), params_.effective_stddev(), RandomStream(ctx.key, Purpose::kProjection))
            .cast<double>();      // d × n
    MatrixD k_proj = e * view.k;  // d × p
    return [&view, e = std::move(e), k_proj = std::move(k_proj)](int64_t r0, int64_t rows) {
      MatrixD p = view.scale * (view.q.middleRows(r0, rows) * k_proj.transpose());  // rows × d
      softmax_rows(p);
      return MatrixD(p * e);
    };
  }

  // EK and EV (d × p, d × pv), float32; per thread a tile of E and the exact kernel's blocks (scores
  // 128 × 512, a transposed key block, one block's P·V). Nothing grows with n.
  double memory_bytes(int64_t n, int64_t p, int64_t pv) const override {
    const double d = static_cast<double>(params_.d);
    return 4.0 * (d * (p + pv) + kGroupRows * kTileColumns + 128.0 * 512.0 + 512.0 * p + 128.0 * pv);
  }

  // E·K and E·V (d × n times n × (p + pv)), then attention of the n queries over the d projected keys
  // (logits and P·(EV)). The Gaussian draws are not flops: at d = 256, n = 4096, ~0.9 ms of a ~6.1 ms call (Zen 4).
  double flops(int64_t n, int64_t p, int64_t pv) const override {
    return 2.0 * 2.0 * static_cast<double>(params_.d) * n * (p + pv);
  }

 private:
  LinformerParams params_;
};

class LinformerJlt final : public Estimator {
 public:
  explicit LinformerJlt(LinformerParams params) : params_(params) {}

  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    // S is n × d: row j of S is row j of the stream, scaled by 1/√d.
    const MatrixF s =
        gaussian_matrix(view.n(), params_.d, params_.effective_stddev(), RandomStream(ctx.key, Purpose::kProjection));
    const MatrixF sketched_v = s * (s.transpose() * view.vf);  // S·Sᵀ·V, n × pv
    exact_attention_f32(view.qf, view.kf, sketched_v, static_cast<float>(view.scale), out, ctx.pool);
  }

  // out = A·S·Sᵀ·V, so Â = A·S·Sᵀ (rows × n) with A the exact softmax: unbiased for A entry by entry, rows
  // summing to A_i·S·Sᵀ·1 ≠ 1, entries of either sign. Float64 from the same S. O(rows·n·(p + d)) per block.
  WeightRows weights(const HeadView& view, const EstimateContext& ctx) const override {
    require_usage(view.mask == Mask::kFull, "linformer-jlt has no causal form");
    MatrixD s =
        gaussian_matrix(view.n(), params_.d, params_.effective_stddev(), RandomStream(ctx.key, Purpose::kProjection))
            .cast<double>();  // n × d
    return [&view, s = std::move(s)](int64_t r0, int64_t rows) {
      return MatrixD((attention_rows_f64(view.q, view.k, view.scale, r0, rows) * s) * s.transpose());
    };
  }

  // S (n × d), Sᵀ·V (d × pv) and S·Sᵀ·V (n × pv), float32.
  double memory_bytes(int64_t n, int64_t p, int64_t pv) const override {
    const double d = static_cast<double>(params_.d);
    return 4.0 * (d * n + d * pv + static_cast<double>(n) * pv) + 16.0 * n * (p + pv);
  }

  // Sᵀ·V and S·(Sᵀ·V) (2·n·d·pv each), then exact attention.
  double flops(int64_t n, int64_t p, int64_t pv) const override {
    return 2.0 * 2.0 * n * static_cast<double>(params_.d) * pv + 2.0 * n * static_cast<double>(n) * (p + pv);
  }

 private:
  LinformerParams params_;
};

[[maybe_unused]] const bool kRegisteredLinformer = register_estimator({
    .name = "linformer",
    .family = "sketching",
    .summary = "Linformer: keys and values projected to d rows by a Gaussian E, softmax(s*Q*(EK)^T)*(EV)",
    .params =
        {{"d", ParamKind::kInt, "64", 1, 1 << 20, {}, "projected length"},
         {"std", ParamKind::kReal, "0", 0, 1e6, {}, "std of E's entries; 0 = 1/sqrt(d) (JL), 0.02 = reference code"}},
    .samples_knob = "d",
    .random = true,
    .target = nullptr,
    .weights = true,
    .ablations = {"linformer(std=0.02)"},  // the reference code's unscaled projection
    .make = [](const Spec& spec) { return std::make_unique<Linformer>(LinformerParams::from_spec(spec)); },
});

[[maybe_unused]] const bool kRegisteredJlt = register_estimator({
    .name = "linformer-jlt",
    .family = "sketching",
    .summary = "unreduced JL sketch B*S*S^T*V, unbiased for B*V (O(n^2); what Linformer gave up)",
    .params = {{"d", ParamKind::kInt, "64", 1, 1 << 20, {}, "sketch width (S is n x d, entries N(0, 1/d))"}},
    .samples_knob = "d",
    .random = true,
    .target = nullptr,
    .weights = true,
    .make = [](const Spec& spec) { return std::make_unique<LinformerJlt>(LinformerParams::from_spec(spec)); },
});

}  // namespace
}  // namespace attnprobe
