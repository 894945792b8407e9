#include "attnprobe/estimators/sketching/linformer/linformer.h"

#include <algorithm>
#include <cmath>

#include "attnprobe/common/error.h"
#include "attnprobe/common/parallel.h"
#include "attnprobe/estimators/common/landmarks.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/sketching/gaussian_projection.h"
#include "attnprobe/exact/exact_attention.h"
#include "attnprobe/exact/tile_product.h"

namespace attnprobe {

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

// Below float32 (`stored`), E's entries are stored in the precision as drawn (a model's projection weights are in
// its dtype), the tile sums stay float32, and E·K and E·V are stored in the precision once summed.
void project_keys_values(const MatrixF& k, const MatrixF& v, double stddev, const RandomStream& stream, int64_t d,
                         ThreadPool* pool, MatrixF& k_proj, MatrixF& v_proj, Precision stored = Precision::kF32) {
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
        for (int64_t r = 0; r < rows; ++r) {
          gaussian_row(stream, r0 + r, t0, cols, scale, work.tile.row(r).data());
          round_in_place(work.tile.row(r).data(), cols, stored);
        }
        // Each tile's products into zeroed buffers, then added: chaining every tile's FMAs onto EK would make
        // one float32 sum of all n terms per element (the exact kernel's P·V does the same, for that reason).
        tile_product(work.tile.topLeftCorner(rows, cols), k.middleRows(t0, cols), work.k_part);
        tile_product(work.tile.topLeftCorner(rows, cols), v.middleRows(t0, cols), work.v_part);
        k_proj.middleRows(r0, rows) += work.k_part;
        v_proj.middleRows(r0, rows) += work.v_part;
      }
    });
  round_in_place(k_proj, stored);
  round_in_place(v_proj, stored);
}

class Linformer final : public Estimator {
 public:
  explicit Linformer(LinformerParams params) : params_(params) {}

  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    MatrixF k_proj, v_proj;  // d × p, d × pv
    project_keys_values(view.kf, view.vf, params_.effective_stddev(), RandomStream(ctx.key, Purpose::kProjection),
                        params_.d, ctx.pool, k_proj, v_proj, ctx.precision);
    // The query rows' geometry keeps their blocks at their absolute positions (the same bits for any rows). Below
    // float32 the attention over the projected keys is exact attention's at FlashAttention-2's rounding points.
    exact_attention_in(view.qf, k_proj, v_proj, static_cast<float>(view.scale), ctx.precision, out, ctx.pool,
                       view.geometry());
  }

  // out = P·(E·V) with P = softmax(s·Q(EK)ᵀ) (n × d), so Â = P·E (rows × keys): row i is a mixture of E's rows,
  // summing to Σ_r P_ir·Σ_j E_rj, not one, with entries of either sign (E is Gaussian). Float64 from the same
  // E. Setup O(d·n·p); O(rows·d·(p + n)) per block.
  WeightRows weights(const HeadView& view, const EstimateContext& ctx) const override {
    require_usage(view.mask == Mask::kFull, "linformer has no causal form");
    MatrixD e =
        gaussian_matrix(params_.d, view.keys(), params_.effective_stddev(), RandomStream(ctx.key, Purpose::kProjection))
            .cast<double>();      // d × keys
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

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<LinformerParams>{
    .name = "linformer",
    .family = "sketching",
    .summary = "Linformer: keys and values projected to d rows by a Gaussian E, softmax(s*Q*(EK)^T)*(EV)",
    .page = "estimators/sketching.md",
    .params = ParamSet<LinformerParams>()
                  .integer("d", &LinformerParams::d, 1, 1 << 20, "projected length")
                  .real("std", &LinformerParams::stddev, 0, 1e6,
                        "std of E's entries; 0 = 1/sqrt(d) (JL), 0.02 = reference code"),
    .samples_knob = "d",
    .capabilities = {.random = true,
                     .decode = kFullOnly,
                     .weights = kFullOnly,
                     .rounding = "E stored in the precision as drawn; E·K and E·V summed float32 (per key tile, then "
                                 "across tiles) and stored in it; the attention over the d projected keys at "
                                 "FlashAttention-2's rounding points (softmax's)"},
    // Its attention over the projected keys runs on the tf32x3 kernel: observed ≤ 1.2e-6 (H100, seed 12345).
    .devices = {{.device = Device::kCuda, .forms = kFullOnly, .tolerance = 1e-4}},
    .ablations = {"linformer(std=0.02)"},  // the reference code's unscaled projection
    .make = [](const LinformerParams& params) { return std::make_unique<Linformer>(params); },
});

}  // namespace
}  // namespace attnprobe
