#include "attnprobe/sweep/budget.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <set>

#include "attnprobe/common/error.h"
#include "attnprobe/common/parallel.h"
#include "attnprobe/common/text.h"

namespace attnprobe {

namespace {

// A rough single-thread rate for the --dry-run time figure: the order of magnitude of the
// estimators' measured GFLOP/s on one core (docs/performance.md); `attnprobe bench` measures yours.
constexpr double kRoughFlopsPerThread = 5e9;

std::string slice_text(const SliceRef& s) {
  return fmt::format("layer {} head {} batch item {} n={}", s.layer, s.head, s.batch, s.n);
}

}  // namespace

PlanBudget estimate_budget(const Dump& dump, const SweepPlan& plan, int threads) {
  PlanBudget budget;
  const double per_slice = static_cast<double>(plan.tasks_per_slice());
  budget.tasks = per_slice * static_cast<double>(plan.slices.size());
  budget.rows = plan.total_rows();
  budget.threads = resolve_threads(threads);
  if (budget.rows > static_cast<double>(kMaxGridRows))
    throw UsageError(fmt::format(
        "the grid has {:.4g} rows ({} settings x {} trials at most x {} slices x {} metrics), more than the {} one "
        "sweep may write: use fewer --trials, lengths, samples, layers, heads or batch items, or split the grid "
        "into several sweeps",
        budget.rows, plan.settings.size(),
        plan.settings.empty() ? 0
                              : std::max_element(plan.settings.begin(), plan.settings.end(),
                                                 [](const auto& a, const auto& b) { return a.trials < b.trials; })
                                    ->trials,
        plan.slices.size(), plan.metrics.size(), kMaxGridRows));

  // One instance per setting and per reference: memory_bytes and flops depend only on the spec.
  std::vector<std::unique_ptr<Estimator>> estimators;
  for (const EstimatorSetting& s : plan.settings) estimators.push_back(s.spec.make());
  std::map<std::string, std::unique_ptr<Estimator>> references;
  for (const EstimatorSetting& s : plan.settings)
    if (!references.count(s.reference)) references[s.reference] = parse_spec(s.reference).make();

  const double workers = std::min<double>(budget.threads, std::max(per_slice, 1.0));
  // With gradient metrics each trial also runs its estimator's backward pass, and each slice its reference's.
  const bool gradients = std::any_of(plan.metrics.begin(), plan.metrics.end(), is_gradient_metric);
  const auto call_bytes = [&](const Estimator& e, const SliceRef& s, const LayerInfo& info) {
    const double forward = e.memory_bytes(s.n, info.dim, info.value_dim);
    return gradients ? std::max(forward, e.backward_memory_bytes(s.n, info.dim, info.value_dim)) : forward;
  };
  // Below float32 a slice also holds its rounded copy and exact attention in the precision, and with the precision
  // metrics each trial runs its estimator a second time, in float32, beside the rounded estimate (docs/precision.md).
  // Counted for every slice when any is rounded: a plan's precisions share their slices' kinds below.
  const bool rounds =
      std::any_of(plan.slices.begin(), plan.slices.end(), [](const SliceRef& s) { return below_float32(s.precision); });
  const bool splits = rounds && std::any_of(plan.metrics.begin(), plan.metrics.end(), is_precision_metric);
  std::map<std::tuple<int, int, int>, int64_t> longest;
  for (const SliceRef& s : plan.slices) {
    auto& n = longest[{s.layer, s.head, s.batch}];
    n = std::max(n, s.n);
  }
  // Slices that differ only in (head, batch item) cost the same: estimate each (layer, n, n₀) once.
  std::map<std::tuple<int, int64_t, int64_t>, std::pair<SliceRef, double>> kinds;
  for (const SliceRef& s : plan.slices) {
    auto [it, added] = kinds.try_emplace({s.layer, s.n, longest[{s.layer, s.head, s.batch}]}, s, 0.0);
    it->second.second += 1;
  }
  // A deflated .npz member is inflated whole on its first read and kept (io/npz_container.cpp): every
  // layer the plan reads holds its q, k and v in memory for the rest of the run.
  double inflated = 0;
  if (dump.format() == "npz") {
    std::set<int> layers;
    for (const SliceRef& s : plan.slices) layers.insert(s.layer);
    for (int layer : layers) {
      const LayerInfo& info = dump.layer(layer);
      if (!info.compressed) continue;
      const double element = info.dtype == "float64" ? 8 : info.dtype == "float32" ? 4 : 2;
      inflated += element * static_cast<double>(info.batch) *
                  (static_cast<double>(info.heads * info.tokens * info.dim) +
                   static_cast<double>(info.kv_heads * info.key_tokens * (info.dim + info.value_dim)));
    }
  }
  for (const auto& [kind, first_and_count] : kinds) {
    const auto& [s, copies] = first_and_count;
    const int64_t n0 = std::get<2>(kind);
    const LayerInfo& info = dump.layer(s.layer);
    const double n = static_cast<double>(s.n), p = static_cast<double>(info.dim);
    const double pv = static_cast<double>(info.value_dim);
    double bytes = 12.0 * static_cast<double>(n0) * (2 * p + pv);
    if (s.n != n0) bytes += 12.0 * n * (2 * p + pv);
    if (rounds) bytes += 12.0 * n * (2 * p + pv) + 4.0 * n * pv;
    double slice_flops = 0;
    for (const auto& [name, ref] : references) {
      bytes += 8.0 * n * pv + call_bytes(*ref, s, info);
      slice_flops += ref->flops(s.n, info.dim, info.value_dim);
    }
    double largest = 0;
    size_t largest_setting = 0;
    for (size_t i = 0; i < estimators.size(); ++i) {
      const double mem = call_bytes(*estimators[i], s, info);
      if (mem > largest) largest = mem, largest_setting = i;
      slice_flops += (splits ? 2 : 1) * plan.settings[i].trials * estimators[i]->flops(s.n, info.dim, info.value_dim);
    }
    bytes += workers * ((splits ? 24.0 : 20.0) * n * pv + largest) + inflated;
    budget.flops += copies * slice_flops;
    if (bytes > budget.peak_bytes) {
      budget.peak_bytes = bytes;
      budget.peak_case = estimators.empty()
                             ? slice_text(s)
                             : fmt::format("{} at {}", plan.settings[largest_setting].canonical, slice_text(s));
      if (inflated > 0)
        budget.peak_case +=
            fmt::format(" (with {} of deflated .npz arrays, inflated whole and kept)", format_bytes(inflated));
    }
  }
  return budget;
}

void require_memory(const PlanBudget& budget, double limit_bytes) {
  require_input(budget.peak_bytes <= limit_bytes,
                "the largest case, {}, needs about {} of memory, more than the limit of {}. Use shorter --lengths, "
                "fewer samples or --threads, or raise the limit with --max-memory (default: the memory available "
                "now).",
                budget.peak_case, format_bytes(budget.peak_bytes), format_bytes(limit_bytes));
}

double default_memory_limit() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemAvailable:") return kib * 1024.0;
    meminfo.ignore(256, '\n');
  }
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 1e18;
}

double parse_byte_size(const std::string& text_in, const std::string& what) {
  std::string text = trim(text_in);
  auto fail = [&] {
    return UsageError(fmt::format("{} '{}' is not a size: write bytes, or a number with K, M, G or T (e.g. 512M, 8G)",
                                  what, text_in));
  };
  for (const char* unit : {"iB", "B"})
    if (text.size() > std::char_traits<char>::length(unit) &&
        text.compare(text.size() - std::char_traits<char>::length(unit), std::string::npos, unit) == 0) {
      text.resize(text.size() - std::char_traits<char>::length(unit));
      break;
    }
  double factor = 1;
  if (!text.empty()) {
    const char last = static_cast<char>(std::toupper(static_cast<unsigned char>(text.back())));
    const std::string units = "KMGT";
    if (const size_t pos = units.find(last); pos != std::string::npos) {
      factor = std::ldexp(1.0, 10 * static_cast<int>(pos + 1));
      text.pop_back();
    }
  }
  double value = 0;
  if (!parse_real(text, value) || !std::isfinite(value) || value <= 0) throw fail();
  return value * factor;
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) bytes /= 1024, ++u;
  return u == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.3g} {}", bytes, units[u]);
}

std::string describe_budget(const PlanBudget& budget, double limit_bytes) {
  const double threads = budget.threads;
  return fmt::format(
      "needs: {:.0f} rows, {:.0f} estimator calls, {:.3g} GFLOP of estimator and reference work (roughly {:.3g} s "
      "on {} threads at {:.0f} GFLOP/s each; `attnprobe bench` measures this machine)\n"
      "memory: the largest case ({}) needs about {}; limit {}{}\n",
      budget.rows, budget.tasks, budget.flops / 1e9, budget.flops / (kRoughFlopsPerThread * threads), threads,
      kRoughFlopsPerThread / 1e9, budget.peak_case.empty() ? "none" : budget.peak_case, format_bytes(budget.peak_bytes),
      format_bytes(limit_bytes), budget.peak_bytes > limit_bytes ? " (too much: the run would be refused)" : "");
}

}  // namespace attnprobe
