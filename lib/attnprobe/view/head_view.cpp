#include "attnprobe/view/head_view.h"

namespace attnprobe {

HeadView make_head_view(SliceId id, double scale, MatrixD q, MatrixD k, MatrixD v) {
  HeadView view;
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
