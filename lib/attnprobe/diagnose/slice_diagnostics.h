#pragma once
// The head diagnostics (metrics/head_diagnostics.h) of each slice a plan names, as the long rows of
// `attnprobe diagnose` (and the table of `info --diagnostics`). A stage above the metrics because it
// walks the planner's slices and labels its rows as the runner labels the trial rows.
#include <cstdint>
#include <functional>
#include <vector>

#include "attnprobe/io/dump.h"
#include "attnprobe/records/record.h"
#include "attnprobe/sweep/plan.h"

namespace attnprobe {

/// Diagnoses each slice (its prefix of n tokens) in order: one row per slice and diagnostic, in
/// diagnostic_names() order. Row blocks of a slice run on `threads` threads; `progress(done)` is
/// called after each slice.
std::vector<DiagnosticRow> diagnose_slices(const Dump& dump, const std::vector<SliceRef>& slices, int threads,
                                           const std::function<void(int64_t)>& progress = nullptr);

}  // namespace attnprobe
