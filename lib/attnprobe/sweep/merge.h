#pragma once
// Putting a sharded sweep back together (`attnprobe merge`), and the canonical row order that
// merge and the MPI runner write: the order of a single-process run — units in plan order (layer,
// head, batch item, length as given), within a unit the settings in plan order; per setting its
// trials ascending, each with the per-trial metrics in the selected order, then (for a setting of at
// least two trials, when case-level metrics are selected) its case row of trial −1 with the case
// metrics in the selected order (docs/metrics.md). Each row's place follows from run.json's plan record, so joining
// N shards is one pass over their rows: O(rows) time and memory.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "attnprobe/records/record.h"
#include "attnprobe/report/run_info.h"

namespace attnprobe {

/// Where each row of a plan goes. Built from a plan record whose `units` lists every unit (or
/// any subset: positions are still those of the whole plan).
class CanonicalOrder {
 public:
  explicit CanonicalOrder(const PlanRecord& plan);

  /// Number of rows the whole plan has: units_total × rows_per_unit().
  int64_t size() const { return units_total_ * rows_per_unit_; }
  /// The row's position in the whole plan, or nullopt when the plan has no such row (another
  /// dump, seed, setting, trial, metric or a unit not in the record). `unit` receives the unit's
  /// index into the record's `units`.
  std::optional<int64_t> position(const TrialRow& row, size_t* unit = nullptr) const;
  /// The row that belongs at `position` (value 0), for messages about a missing row.
  TrialRow row_at(int64_t position) const;
  int64_t rows_per_unit() const { return rows_per_unit_; }
  /// Whether setting `s` of the record has a case row (trial −1).
  bool has_case_row(size_t s) const;

 private:
  PlanRecord plan_;
  int64_t units_total_ = 0, rows_per_unit_ = 0;
  std::vector<int64_t> setting_offset_;                    ///< first row of each setting within a unit
  std::vector<std::string> trial_metrics_, case_metrics_;  ///< the record's metrics, split by kind
  /// (layer, head, batch, n, query rows) → units[i]
  std::map<std::tuple<int, int, int, long long, QueryRows, Precision>, size_t> unit_of_;
  std::map<std::pair<std::string, std::string>, size_t> setting_of_;  ///< (spec, reference) → settings[i]
  std::map<std::string, size_t> metric_of_;                           ///< index within its kind's list
  std::map<long long, size_t> unit_by_index_;                         ///< plan index → units[i]
};

/// "case layer=0;head=1;batch=0;n=64;spec=yoso(m=8) vs yoso-e, trial 3, metric nmse".
std::string describe_row(const TrialRow& row);

struct MergeResult {
  int shards = 0;
  int64_t units = 0, rows = 0;
  std::string info_path;  ///< the merged CSV's run.json
};

/// Checks that `inputs` (trial CSVs of `sweep --shard I/N`, each with its run.json beside it) are
/// all N shards of one plan, each exactly once and complete, with no row twice and none foreign,
/// then writes their rows in canonical order to `output` (atomically) and its run.json. Throws
/// InputError naming the file, the shard and the case at the first problem; UsageError when
/// `output` exists and `overwrite` is false. `info` carries the merge's command line.
MergeResult merge_shards(const std::vector<std::string>& inputs, const std::string& output, bool overwrite,
                         RunInfo info);

/// Sorts rows into canonical order of `plan` (rows not in the plan keep their order, after the
/// rest). Used by the MPI runner to write the single-process file.
std::vector<TrialRow> canonical_rows(const PlanRecord& plan, std::vector<TrialRow> rows);

}  // namespace attnprobe
