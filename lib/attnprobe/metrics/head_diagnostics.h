#pragma once
// What a head's attention looks like, independent of any estimator (`attnprobe info --diagnostics`,
// `attnprobe diagnose`; docs/metrics.md "Head diagnostics"): the quantities that explain why one
// head is harder to approximate than another. A = softmax(s·QKᵀ) row by row; never formed whole.
// The maths of one slice; diagnose/ walks a dump's slices with it.
#include <string>
#include <vector>

#include "attnprobe/common/parallel.h"
#include "attnprobe/view/head_view.h"

namespace attnprobe {

/// Mean over queries of the entropy (nats) of the softmax row softmax_j(s·q_i·k_j): ln n for
/// uniform attention, 0 when every query attends to one key. O(n²p), one row at a time.
double mean_attention_entropy(const HeadView& view);

struct HeadDiagnostics {
  double entropy = 0;            ///< mean row entropy (nats); ln n is uniform
  double effective_support = 0;  ///< mean over rows of the fewest keys holding 90% of the row's mass
  double max_logit = 0;          ///< max over i, j of s·q_i·k_j
  double stable_rank = 0;        ///< ‖A‖_F² / ‖A‖₂² (1 for rank one, e.g. uniform attention; up to n)
  double mean_distance = 0;      ///< mean over rows of Σ_j A_ij·|t_i − j| (tokens; t_i the row's position)
  double q_norm_cv = 0;          ///< std / mean of the query row norms (the norms' spread)
  double k_norm_cv = 0;          ///< std / mean of the key row norms
  double sink_mass = 0;          ///< mean over rows of the weight on the first 4 keys (StreamingLLM's sinks)
};

/// The diagnostics' names in the order of HeadDiagnostics (the `diagnostic` column of `diagnose`).
const std::vector<std::string>& diagnostic_names();
std::vector<double> diagnostic_values(const HeadDiagnostics& d);

/// All diagnostics of one slice's query rows under its mask (the rows and keys of `view`'s geometry): O(n²p) for the
/// row statistics plus ~30 power iterations of AᵀA (each O(n²p)) for ‖A‖₂, in row blocks over `pool` (nullptr: one
/// thread). Deterministic: the power iteration starts from the all-ones vector, and row blocks are summed in a fixed
/// order.
HeadDiagnostics diagnose_head(const HeadView& view, ThreadPool* pool = nullptr);

}  // namespace attnprobe
