#pragma once
// Aggregation of trial rows into per-case statistics (`attnprobe summarize`), and of per-case
// statistics across slices (`--over layer,head,batch`).
#include <string>
#include <vector>

#include "attnprobe/records/record.h"

namespace attnprobe {

/// Per (case, metric): count, mean, sample std (n−1; NaN for one value: no spread to estimate), stderr = std/√count,
/// median, min, max. Rows of all seeds and trials of a case are pooled. NaN values make the
/// statistics NaN (never silently dropped). Output in first-appearance order. A trial given twice
/// (same case, trial, seed and metric: two runs in one file) is an InputError, its message prefixed
/// with `source` (e.g. the file) when given.
std::vector<SummaryRow> summarize_trials(const std::vector<TrialRow>& rows, const std::string& source = "");

/// The standard error a comparison holds a case to: its stderr, or 0 for a single value (a deterministic estimator's
/// one run, or one trial), whose stderr is NaN — the gate's atol and rtol then allow rounding only.
double stderr_or_zero(const SummaryRow& summary);

/// "DUMP L0 H1 B0 n=256 SPEC vs REFERENCE, METRIC": a case and metric in messages.
std::string case_label(const CaseKey& key, const std::string& metric);

/// Aggregates per-case summaries over the named columns (any of layer, head, batch, n): those
/// columns become "all"; each slice counts once (mean of per-slice means, std and stderr of the
/// per-slice means: the slices are the replicates). Throws UsageError on an unknown column.
std::vector<SummaryRow> summarize_over(const std::vector<SummaryRow>& per_case, const std::vector<std::string>& over);

/// One value per estimator setting from the rows of many slices (what `eval` prints): each case
/// summarised over its trials, then summarize_over() over layer, head, batch and n, so `eval`'s
/// mean ± stderr is exactly `summarize --over layer,head,batch,n`'s.
std::vector<SummaryRow> pool_over_slices(const std::vector<TrialRow>& rows);

}  // namespace attnprobe
