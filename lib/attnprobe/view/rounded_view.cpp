#include "attnprobe/view/rounded_view.h"

#include <map>
#include <memory>

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
    std::map<const MatrixF*, std::shared_ptr<const MatrixF>> rounded_keys;  // one per kv head, as they were shared
    for (std::shared_ptr<const MatrixF>& keys : group->keys) {
      if (!keys) continue;
      std::shared_ptr<const MatrixF>& done = rounded_keys[keys.get()];
      if (!done) {
        auto copy = std::make_shared<MatrixF>(*keys);
        round_in_place(*copy, precision);
        done = std::move(copy);
      }
      keys = done;
    }
    rounded.group = std::move(group);
  }
  return rounded;
}

}  // namespace attnprobe
