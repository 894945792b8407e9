#include "attnprobe/diagnose/slice_diagnostics.h"

#include "attnprobe/common/parallel.h"
#include "attnprobe/metrics/head_diagnostics.h"
#include "attnprobe/sweep/runner.h"

namespace attnprobe {

std::vector<DiagnosticRow> diagnose_slices(const Dump& dump, const std::vector<SliceRef>& slices, int threads,
                                           const std::function<void(int64_t)>& progress) {
  ThreadPool pool(threads);
  std::vector<DiagnosticRow> rows;
  const std::string label = dump_label(dump.path());
  for (size_t s = 0; s < slices.size(); ++s) {
    const SliceRef& slice = slices[s];
    HeadView read = dump.read_slice(slice.layer, slice.head, slice.batch, slice.n), cut;
    const HeadView& view = view_of_case(read, slice, cut);
    const std::vector<double> values = diagnostic_values(diagnose_head(view, &pool));
    for (size_t d = 0; d < values.size(); ++d)
      rows.push_back(DiagnosticRow{label, slice.layer, slice.head, slice.batch, slice.n, view.p(), slice.mask,
                                   slice.window, slice.queries, diagnostic_names()[d], values[d]});
    if (progress) progress(static_cast<int64_t>(s + 1));
  }
  return rows;
}

}  // namespace attnprobe
