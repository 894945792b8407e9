#pragma once
// The row types of the long CSV schema (docs/csv.md). A trial row holds one metric value of one
// trial of one case; a summary row aggregates the trial rows of one case and metric. The columns,
// their names and their text form are defined once, in schema.h.
#include <compare>
#include <cstdint>
#include <optional>
#include <string>

#include "attnprobe/common/rounding.h"
#include "attnprobe/view/mask.h"

namespace attnprobe {

/// A slice coordinate of a case (layer, head, batch item, n): a number, or the wildcard `all` once
/// `summarize --over` has pooled it. Typed, so `all` orders and compares as itself, never as text.
class Coordinate {
 public:
  Coordinate() = default;                       ///< all
  Coordinate(int64_t value) : value_(value) {}  // NOLINT: a coordinate is a number unless pooled
  static Coordinate all() { return {}; }

  bool is_all() const { return !value_; }
  int64_t value() const { return *value_; }  ///< only when !is_all()
  std::string text() const { return value_ ? std::to_string(*value_) : "all"; }
  /// "all" or a non-negative integer; nullopt otherwise.
  static std::optional<Coordinate> parse(const std::string& text);

  auto operator<=>(const Coordinate&) const = default;  ///< `all` first, then numbers in order
  bool operator==(const Coordinate&) const = default;

 private:
  std::optional<int64_t> value_;  ///< nullopt: all
};

/// The columns that identify a case (everything but trial, seed, metric and value).
struct CaseKey {
  std::string dump;  ///< the dump file's base name
  Coordinate layer, head, batch;
  Coordinate n;                    ///< tokens (prefix length)
  int64_t p = 0;                   ///< head dim
  Mask mask = Mask::kFull;         ///< `full` for files written before the column existed
  int64_t window = 0;              ///< W of `window:W`
  QueryRows queries;               ///< the rows evaluated; `all` for files written before the column existed
  std::string estimator;           ///< estimator name
  std::string spec;                ///< canonical spec
  std::optional<int64_t> samples;  ///< samples knob value; none when the estimator has no knob
  std::string reference;           ///< canonical spec of the reference
  /// What it is computed in; `f32` for files written before the column. Last here (the CSV puts it after
  /// `queries`): cases of one setting in several precisions sort together.
  Precision precision = Precision::kF32;

  auto operator<=>(const CaseKey&) const = default;
  bool operator==(const CaseKey&) const = default;
};

struct TrialRow {
  CaseKey key;
  int64_t trial = 0;
  uint64_t seed = 0;
  std::string metric;
  double value = 0;
};

/// The `trial` of a case-level row (bias and variance over all the case's trials; docs/metrics.md).
inline constexpr int64_t kCaseTrial = -1;

/// One trial of one case: what `--resume` checks off.
struct TrialId {
  CaseKey key;
  int64_t trial = 0;
  uint64_t seed = 0;
  auto operator<=>(const TrialId&) const = default;
};

/// One row of a trial CSV: a trial and a metric. Two rows with one id are one trial written twice.
struct TrialRowId {
  TrialId trial;
  std::string metric;
  auto operator<=>(const TrialRowId&) const = default;
};
inline TrialRowId row_id(const TrialRow& r) { return {TrialId{r.key, r.trial, r.seed}, r.metric}; }

/// One diagnostic of one slice at one length (`attnprobe diagnose`): long, like the trial CSV.
struct DiagnosticRow {
  std::string dump;
  Coordinate layer, head, batch, n;
  int64_t p = 0;
  Mask mask = Mask::kFull;
  int64_t window = 0;
  QueryRows queries;
  std::string diagnostic;
  double value = 0;
};

struct SummaryRow {
  CaseKey key;
  std::string metric;
  int64_t count = 0;
  double mean = 0, std = 0, stderr_ = 0, median = 0, min = 0, max = 0;
};

}  // namespace attnprobe
