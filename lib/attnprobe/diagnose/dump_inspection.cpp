#include "attnprobe/diagnose/dump_inspection.h"

#include "attnprobe/metrics/head_diagnostics.h"

namespace attnprobe {

DumpInspection inspect_dump(const Dump& dump, bool entropy) {
  DumpInspection out;
  for (const LayerInfo& l : dump.layers()) {
    for (int h = 0; h < l.heads; ++h) {
      DumpInspection::Head head{l.number, h, 0, 0};
      for (int b = 0; b < l.batch; ++b) {
        const HeadView view = dump.read_slice(l.number, h, b, l.lengths[b]);
        // The upstream gradients too: their reader refuses NaN/Inf as the slice's does (info said "all
        // values finite" for a NaN in dy that eval --metrics grad_* then refused).
        if (!l.dy_path.empty()) dump.read_upstream(l.number, h, b, l.lengths[b]);
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
