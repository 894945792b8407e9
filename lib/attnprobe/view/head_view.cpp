#include "attnprobe/view/head_view.h"

#include <fmt/format.h>

#include <cmath>

namespace attnprobe {

const char* mask_name(Mask mask) { return mask == Mask::kCausal ? "causal" : "full"; }

std::optional<Mask> parse_mask(std::string_view text) {
  if (text == "full") return Mask::kFull;
  if (text == "causal") return Mask::kCausal;
  return std::nullopt;
}

HeadView make_head_view(SliceId id, double scale, MatrixD q, MatrixD k, MatrixD v, Mask mask) {
  HeadView view;
  view.mask = mask;
  view.id = id;
  view.scale = scale;
  view.q = std::move(q);
  view.k = std::move(k);
  view.v = std::move(v);
  view.qf = view.q.cast<float>();
  view.kf = view.k.cast<float>();
  view.vf = view.v.cast<float>();
  return view;
}

std::string magnitude_problem(const MatrixD& q, const MatrixD& k, const MatrixD& v, double scale) {
  constexpr double kMaxRowNorm = 1e18, kMaxScore = 1e30;  // float32 holds 3.4e38
  auto norm_bound = [](const MatrixD& m) {
    return m.size() == 0 ? 0.0 : m.cwiseAbs().maxCoeff() * std::sqrt(static_cast<double>(m.cols()));
  };
  const double bq = norm_bound(q), bk = norm_bound(k), bv = norm_bound(v), score = scale * bq * bk;
  if (bq <= kMaxRowNorm && bk <= kMaxRowNorm && bv <= kMaxRowNorm && score <= kMaxScore) return "";
  return fmt::format(
      "values this large overflow (largest row norms: q {:.3g}, k {:.3g}, v {:.3g}; scale {:.3g}; scale·|q|·|k| "
      "{:.3g}, limits {:.0e} per row and {:.0e} per score)",
      bq, bk, bv, scale, score, kMaxRowNorm, kMaxScore);
}

}  // namespace attnprobe
