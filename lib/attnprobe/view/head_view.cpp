#include "attnprobe/view/head_view.h"

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

}  // namespace attnprobe
