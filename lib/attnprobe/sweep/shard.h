#pragma once
// Work units and shards (docs/cli.md, "Beyond one machine"). A plan's unit of work is one slice at
// one length (plan.slices[i]) with every estimator setting and trial of it, so its references are
// computed once. Units are dealt to N shards by a deterministic cost-balanced rule: longest
// processing time first — units in order of estimated cost (largest first, then plan order), each
// to the shard with the least estimated cost so far (ties: the lower shard). The same plan gives
// the same deal on every machine: costs are whole numbers derived from the plan alone.
// Cost: O(U log U + U·N) for U units and N shards.
#include <cstdint>
#include <string>
#include <vector>

#include "attnprobe/io/dump.h"
#include "attnprobe/report/run_info.h"
#include "attnprobe/sweep/plan.h"

namespace attnprobe {

/// `--shard I/N`: shard I (0-based) of N.
struct ShardSpec {
  int index = 0, count = 1;
  /// Parses "I/N" with 0 <= I < N; throws UsageError saying the form otherwise.
  static ShardSpec parse(const std::string& text);
  std::string text() const;  ///< "I/N"
};

/// Estimated cost of each unit, in floating-point operations rounded to a whole number, indexed like
/// plan.slices. Per unit of length n, head dims p (keys) and pv (values):
///   each distinct reference: 2·n²·(p + pv) (exact attention in float64);
///   each trial of a setting: the estimator's own flops(n, p, pv) when it states one, otherwise
///   2·n·min(s, n)·(p + pv) for a samples knob s (sampling and feature estimators are linear in n
///   per sample) and 2·n²·(p + pv) without a knob (an exact-cost estimator);
///   each trial's metrics: 8·n·pv per metric.
std::vector<int64_t> unit_costs(const Dump& dump, const SweepPlan& plan);

/// The unit indices (into plan.slices) of each of `count` shards, each list in plan order.
std::vector<std::vector<size_t>> deal_units(const std::vector<int64_t>& costs, int count);

/// Unit indices in the order a dynamic scheduler hands them out: largest estimated cost first,
/// then plan order.
std::vector<size_t> largest_first(const std::vector<int64_t>& costs);

/// The plan restricted to these units (indices into plan.slices, in plan order).
SweepPlan restrict_plan(const SweepPlan& plan, const std::vector<size_t>& units);

/// run.json's record of the plan (whole-plan fingerprint) and of the units this run does.
/// dump_label: the `dump` column's value.
PlanRecord plan_record(const Dump& dump, const SweepPlan& plan, const std::vector<size_t>& units, ShardSpec shard);

/// What one process of a sweep runs: the plan restricted to shard `shard`'s units (the whole plan
/// for shard 0/1) and run.json's record of it.
struct ShardPlan {
  SweepPlan plan;
  PlanRecord record;
};
ShardPlan plan_shard(const Dump& dump, const SweepPlan& plan, const std::vector<int64_t>& costs, ShardSpec shard);

/// "layer=L;head=H;batch=B;n=N": how messages name a unit (the slice part of the case id).
std::string unit_name(const UnitRecord& unit);

}  // namespace attnprobe
