#include "attnprobe/view/rounded_view.h"

namespace attnprobe {

namespace {
// Rounds the float32 rows and makes the float64 copy their exact widening, so both read the same values.
void round_pair(MatrixF& single, MatrixD& wide, Precision precision) {
  round_in_place(single, precision);
  wide = single.cast<double>();
}
}  // namespace

HeadView rounded_view(const HeadView& view, Precision precision) {
  HeadView rounded = view;
  if (!below_float32(precision)) return rounded;
  round_pair(rounded.qf, rounded.q, precision);
  round_pair(rounded.kf, rounded.k, precision);
  round_pair(rounded.vf, rounded.v, precision);
  round_in_place(rounded.prompt_qf, precision);
  if (view.group) {
    auto group = std::make_shared<QueryGroup>(*view.group);
    for (MatrixF& rows : group->rows) round_in_place(rows, precision);
    for (MatrixF& rows : group->prompt) round_in_place(rows, precision);
    rounded.group = std::move(group);
  }
  return rounded;
}

}  // namespace attnprobe
