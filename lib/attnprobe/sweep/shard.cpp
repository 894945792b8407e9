#include "attnprobe/sweep/shard.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"
#include "attnprobe/sweep/runner.h"

namespace attnprobe {

ShardSpec ShardSpec::parse(const std::string& text) {
  const size_t slash = text.find('/');
  int64_t index = -1, count = 0;
  if (slash == std::string::npos || !parse_int(trim(text.substr(0, slash)), index) ||
      !parse_int(trim(text.substr(slash + 1)), count) || count < 1 || index < 0 || index >= count || count > 1000000)
    throw UsageError(
        fmt::format("--shard '{}' is not I/N with 0 <= I < N (0-based: the shards of --shard x/3 are 0/3, 1/3 and "
                    "2/3)",
                    text));
  return ShardSpec{static_cast<int>(index), static_cast<int>(count)};
}

std::string ShardSpec::text() const { return fmt::format("{}/{}", index, count); }

std::vector<int64_t> unit_costs(const Dump& dump, const SweepPlan& plan) {
  struct SettingCost {
    std::unique_ptr<Estimator> estimator;
    std::optional<int64_t> samples;
    int trials;
  };
  std::vector<SettingCost> settings;
  std::set<std::string> references;
  for (const EstimatorSetting& s : plan.settings) {
    settings.push_back(SettingCost{s.spec.make(), s.samples, s.trials});
    references.insert(s.reference);
  }
  const double metrics = static_cast<double>(plan.metrics.size());
  std::vector<int64_t> costs;
  for (const SliceRef& slice : plan.slices) {
    const LayerInfo& info = dump.layer(slice.layer);
    const double n = static_cast<double>(slice.n), p = static_cast<double>(info.dim),
                 pv = static_cast<double>(info.value_dim);
    const double exact = 2.0 * n * n * (p + pv);
    double cost = exact * static_cast<double>(references.size());
    for (const SettingCost& s : settings) {
      double per_trial = s.estimator->flops(slice.n, info.dim, info.value_dim);
      if (!(per_trial > 0))
        per_trial = s.samples ? 2.0 * n * std::min(static_cast<double>(*s.samples), n) * (p + pv) : exact;
      cost += s.trials * (per_trial + 8.0 * n * pv * metrics);
    }
    costs.push_back(std::llround(cost));  // whole numbers: the deal cannot depend on rounding
  }
  return costs;
}

std::vector<size_t> largest_first(const std::vector<int64_t>& costs) {
  std::vector<size_t> order(costs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return costs[a] > costs[b]; });
  return order;
}

std::vector<std::vector<size_t>> deal_units(const std::vector<int64_t>& costs, int count) {
  std::vector<std::vector<size_t>> shards(count);
  std::vector<int64_t> load(count, 0);
  for (size_t unit : largest_first(costs)) {
    const size_t lightest = std::min_element(load.begin(), load.end()) - load.begin();  // first of equals
    shards[lightest].push_back(unit);
    load[lightest] += costs[unit];
  }
  for (std::vector<size_t>& units : shards) std::sort(units.begin(), units.end());
  return shards;
}

SweepPlan restrict_plan(const SweepPlan& plan, const std::vector<size_t>& units) {
  SweepPlan out = plan;
  out.slices.clear();
  for (size_t u : units) out.slices.push_back(plan.slices.at(u));
  return out;
}

PlanRecord plan_record(const Dump& dump, const SweepPlan& plan, const std::vector<size_t>& units, ShardSpec shard) {
  PlanRecord record;
  record.dump = dump_label(dump.path());
  record.seed = plan.seed;
  for (const EstimatorSetting& s : plan.settings)
    record.settings.push_back(SettingRecord{.estimator = s.spec.name(),
                                            .spec = s.canonical,
                                            .samples = s.samples ? std::optional<long long>(*s.samples) : std::nullopt,
                                            .reference = s.reference,
                                            .trials = s.trials});
  for (Metric m : plan.metrics) record.metrics.push_back(metric_name(m, plan.recall_k));
  record.eps = plan.eps;
  record.units_total = static_cast<long long>(plan.slices.size());
  record.shard_index = shard.index;
  record.shard_count = shard.count;
  auto unit = [&](size_t i) {
    const SliceRef& s = plan.slices[i];
    return UnitRecord{static_cast<long long>(i), s.layer, s.head,   s.batch,   s.n,
                      dump.layer(s.layer).dim,   s.mask,  s.window, s.queries, s.precision};
  };
  // The fingerprint covers everything that decides the rows: two runs with equal fingerprints
  // write the same rows for the same unit.
  std::string text = fmt::format("dump={}\nseed={}\n", record.dump, record.seed);
  for (const SettingRecord& s : record.settings)
    text += fmt::format("setting={}|{}|{}|{}|{}\n", s.estimator, s.spec, s.samples ? std::to_string(*s.samples) : "",
                        s.reference, s.trials);
  text += fmt::format("metrics={}\n", fmt::join(record.metrics, ","));
  // --eps decides only eps_cover's rows: fingerprinted with it, so every other plan keeps its fingerprint.
  if (std::find(plan.metrics.begin(), plan.metrics.end(), Metric::kEpsCover) != plan.metrics.end())
    text += fmt::format("eps={}\n", record.eps);
  for (size_t i = 0; i < plan.slices.size(); ++i) text += unit_name(unit(i)) + fmt::format(";p={}\n", unit(i).p);
  record.fingerprint = fmt::format("{:016x}", fnv1a(text));
  for (size_t i : units) record.units.push_back(unit(i));
  return record;
}

ShardPlan plan_shard(const Dump& dump, const SweepPlan& plan, const std::vector<int64_t>& costs, ShardSpec shard) {
  const std::vector<size_t> units = deal_units(costs, shard.count).at(shard.index);
  return ShardPlan{restrict_plan(plan, units), plan_record(dump, plan, units, shard)};
}

std::string unit_name(const UnitRecord& unit) {
  // The mask, query rows and precision only where not full, all and f32, as in the case id: full-mask float32
  // self-attention plans keep their fingerprints.
  return fmt::format("layer={};head={};batch={};n={}{}{}", unit.layer, unit.head, unit.batch, unit.n,
                     geometry_suffix(unit.mask, unit.window, unit.queries), precision_suffix(unit.precision));
}

}  // namespace attnprobe
