#pragma once
// Paired comparison of two estimator settings over heads (`summarize --compare A B`, docs/csv.md). Two settings are
// compared on the slices where both ran; the unit of replication is the head (dump, layer, head): batch items of one
// head see the same weights and agree closely, so they are averaged into one value per head rather than counted as
// independent replicates. For each (dump, n, mask, queries, reference, metric) the output separates the two sources
// of uncertainty a ranking can confuse:
//   - Monte-Carlo: how well the trials pin each head's difference (mc_stderr, from the trials' standard errors);
//   - heads: how much the difference varies from head to head (head_sd, the sign count, the bootstrap interval).
// A ranking "A beats B on this model" needs the second; a difference within mc_stderr needs more trials, not heads.
#include <cstdint>
#include <string>
#include <vector>

#include "attnprobe/records/record.h"

namespace attnprobe {

struct ComparisonRow {
  CaseKey key;         ///< layer, head and batch are `all`; estimator, spec and samples empty (a and b name them)
  std::string a, b;    ///< the two specs, as matched in the input
  std::string metric;  ///< the metric compared
  int64_t heads = 0;   ///< heads with both settings (the replicates)
  int64_t slices = 0;  ///< slices (head × batch item) with both
  double mean_a = 0, mean_b = 0;                 ///< means over heads of each head's mean over its batch items
  double diff = 0;                               ///< mean over heads of (A − B)
  double ci_low = 0, ci_high = 0;                ///< 95% percentile bootstrap interval of `diff`, resampling heads
  int64_t a_better = 0, b_better = 0, ties = 0;  ///< heads where A's value is better (lower; higher for recalls)
  double sign_p = 0;        ///< two-sided exact sign test over the heads that are not ties (NaN when all tie)
  double median_ratio = 0;  ///< median over heads of A/B (NaN where some B is 0)
  double mc_stderr = 0;     ///< Monte-Carlo standard error of `diff` (the trials' stderrs, propagated)
  double head_sd = 0;       ///< standard deviation of the heads' differences (n−1; 0 for one head)
};

/// Resamples the bootstrap draws (a fixed count and a fixed key, so the interval is reproducible).
inline constexpr int kBootstrapResamples = 10000;

/// Compares setting `a` with setting `b` (specs as typed: written_spec matches them to the CSV's canonical text, so
/// defaults may be left out) over per-case summaries of slices (not pooled with --over). Rows come in the
/// first-appearance order of their (case, metric) among A's summaries. Throws UsageError when a or b has no row, when
/// they are the same, when the input is already pooled over slices, or when no slice has both (the message lists the
/// specs present).
std::vector<ComparisonRow> compare_paired(const std::vector<SummaryRow>& per_case, const std::string& a,
                                          const std::string& b);

/// Two-sided exact sign test: P(|X − m/2| ≥ |k − m/2|) for X ~ Binomial(m, 1/2); 1 when m = 0.
double sign_test_p(int64_t k, int64_t m);

/// CSV text: dump,n,p,mask,queries,reference,metric,a,b,heads,slices,mean_a,mean_b,diff,ci_low,ci_high,a_better,
/// b_better,ties,sign_p,median_ratio,mc_stderr,head_sd.
std::string comparison_csv_text(const std::vector<ComparisonRow>& rows);

}  // namespace attnprobe
