#pragma once
// Error against cost fronts (`summarize --pareto AXIS`, docs/csv.md): for each estimator on each case (a slice or,
// after --over, a pool of them) and each metric, the settings that no other setting of the same estimator beats —
// none reads no more of the axis (density: the fraction of the cache a row reads) and errs less. A method is then
// compared with another at equal cost by its front, not at equal parameters.
#include <string>
#include <vector>

#include "attnprobe/records/record.h"

namespace attnprobe {

struct ParetoRow {
  CaseKey key;         ///< the setting on the front (its spec and samples)
  std::string metric;  ///< the error (or recall) the front is of
  double axis = 0;     ///< the setting's mean of the axis metric
  double value = 0;    ///< its mean of `metric`
};

/// The fronts from per-case summaries: the settings of each (case but spec and samples, metric) ordered by the
/// axis ascending, keeping a setting when its value is better than every setting at a smaller or equal axis (lower
/// for errors, higher for larger-is-better metrics such as mass_recall; ties at equal axis keep the better value
/// only). Settings without the axis metric, and NaN means, are left out. Throws UsageError when no summary holds
/// the axis (the sweep did not write it: `--metrics selection`).
std::vector<ParetoRow> pareto_fronts(const std::vector<SummaryRow>& per_case, const std::string& axis);

/// CSV text: the case-key columns, then metric, AXIS (named by the axis metric), value.
std::string pareto_csv_text(const std::vector<ParetoRow>& rows, const std::string& axis);

}  // namespace attnprobe
