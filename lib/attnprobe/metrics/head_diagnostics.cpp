#include "attnprobe/metrics/head_diagnostics.h"

#include <cmath>

namespace attnprobe {

double mean_attention_entropy(const HeadView& view) {
  double total = 0;
  for (int64_t i = 0; i < view.n(); ++i) {
    Eigen::RowVectorXd logits = view.scale * (view.q.row(i) * view.k.transpose());
    logits.array() -= logits.maxCoeff();
    const double z = logits.array().exp().sum();
    const Eigen::RowVectorXd prob = logits.array().exp() / z;
    total += -(prob.array() * (logits.array() - std::log(z))).sum();
  }
  return total / view.n();
}

DumpInspection inspect_dump(const Dump& dump, bool entropy) {
  DumpInspection out;
  for (const LayerInfo& l : dump.layers()) {
    for (int h = 0; h < l.heads; ++h) {
      DumpInspection::Head head{l.number, h, 0, 0};
      for (int b = 0; b < l.batch; ++b) {
        const HeadView view = dump.read_slice(l.number, h, b, l.lengths[b]);
        ++out.slices;
        out.zero_query_rows += (view.q.rowwise().squaredNorm().array() == 0).count();
        out.zero_key_rows += (view.k.rowwise().squaredNorm().array() == 0).count();
        if (entropy) {
          head.mean_entropy += mean_attention_entropy(view) / l.batch;
          head.mean_tokens += static_cast<double>(view.n()) / l.batch;
        }
      }
      if (entropy) out.heads.push_back(head);
    }
  }
  return out;
}

}  // namespace attnprobe
