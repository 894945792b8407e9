#pragma once
// What a grid needs before anyone runs it: rows, trials, floating-point work and the peak memory of
// its largest case, and the limits that refuse a grid or a case up front (exit 2 for a grid larger
// than any run can write, exit 3 for a case that cannot fit in memory) instead of a bad_alloc, an
// hour-long run or a machine that swaps. Memory per slice, with T = min(threads, tasks of a slice):
//   12·n₀·(2p + pv)            the slice read once at its longest length n₀, float64 + float32
//   + 12·n·(2p + pv)           a shorter prefix's own copy
//   + Σ_refs (8·n·pv + mem_ref) each reference's float64 output and working memory
//   + T · (4·n·pv + 16·n·pv + max_s mem_s)  per task: the estimate, the metrics' temporaries, the estimator's own
// where mem_e = Estimator::memory_bytes(n, p, pv). An upper-bound estimate, not an accounting.
#include <cstdint>
#include <string>

#include "attnprobe/io/dump.h"
#include "attnprobe/sweep/plan.h"

namespace attnprobe {

/// The most rows one grid may plan (about 15 GB of CSV); larger grids are usage errors.
constexpr int64_t kMaxGridRows = int64_t{100} * 1000 * 1000;

struct PlanBudget {
  double rows = 0;        ///< rows written (SweepPlan::total_rows)
  double tasks = 0;       ///< estimator calls
  double flops = 0;       ///< Σ Estimator::flops over the tasks (0 for estimators that do not say)
  double peak_bytes = 0;  ///< the largest per-slice memory estimate
  std::string peak_case;  ///< the setting and slice that needs it, e.g. "performer(M=64) at layer 0 head 1 ... n=512"
  int threads = 1;        ///< the worker threads the estimate is for (--threads, or every core for 0)
};

/// Estimates the plan's size and memory for `threads` workers (0: all cores). Throws UsageError
/// when the grid has more than kMaxGridRows rows.
PlanBudget estimate_budget(const Dump& dump, const SweepPlan& plan, int threads);

/// Throws InputError naming the case, the figure and the limit when `budget.peak_bytes` > `limit_bytes`.
void require_memory(const PlanBudget& budget, double limit_bytes);

/// The default memory limit: the memory available now (MemAvailable), or the physical memory.
double default_memory_limit();

/// Parses a byte size: an integer with an optional K, M, G or T suffix (powers of 1024) and an
/// optional trailing B or iB ("512M", "2GiB", "1000000"). Throws UsageError naming `what`.
double parse_byte_size(const std::string& text, const std::string& what);

/// "1.5 GiB", "12 MiB", "900 B".
std::string format_bytes(double bytes);

/// A few lines for --dry-run: rows, trials, work, and the largest case's memory against the limit.
std::string describe_budget(const PlanBudget& budget, double limit_bytes);

}  // namespace attnprobe
