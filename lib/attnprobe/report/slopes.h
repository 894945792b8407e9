#pragma once
// How an estimator's error falls with its sample count (`summarize --slopes`, docs/csv.md): for
// each case and metric, a least-squares line through (log samples, log mean error) over the sample
// counts of the sweep. A Monte-Carlo estimator whose error is all variance falls as samples^(−1/2)
// (slope −½ for a norm such as spec_rel or fro_rel, −1 for a squared one such as mse or nmse);
// a flatter slope means bias (or a floor) dominates.
#include <cstdint>
#include <string>
#include <vector>

#include "attnprobe/records/record.h"

namespace attnprobe {

struct SlopeRow {
  CaseKey key;  ///< samples unset; spec with the samples knob written as `KNOB=*`
  std::string metric;
  int64_t points = 0;  ///< sample counts in the fit
  double slope = 0;    ///< d log(error) / d log(samples)
  double stderr_ = 0;  ///< standard error of the slope (residuals, points − 2 degrees of freedom); NaN for 2 points
  double intercept = 0;
  double min_samples = 0, max_samples = 0;
};

/// Fits one line per (case without samples, metric) from per-case summaries (one mean per sample
/// count). Cases with fewer than two positive sample counts, and means that are ≤ 0 or not finite,
/// are left out (a zero error has no logarithm). Output in first-appearance order.
std::vector<SlopeRow> fit_slopes(const std::vector<SummaryRow>& per_case);

/// CSV text: the case-key columns but samples, then metric,points,slope,stderr,intercept,min_samples,max_samples.
std::string slopes_csv_text(const std::vector<SlopeRow>& rows);

}  // namespace attnprobe
