#pragma once
// The row types of the long CSV schema (DESIGN.md §5). A trial row holds one metric value of
// one trial of one case; a summary row aggregates the trial rows of one case and metric.
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace attnprobe {

/// The columns that identify a case (everything but trial, seed, metric and value).
struct CaseKey {
  std::string dump;
  std::string layer, head, batch;  ///< integers as text, or "all" after `summarize --over`
  std::string n;                   ///< integer as text, or "all"
  int64_t p = 0;
  std::string estimator;  ///< estimator name
  std::string spec;       ///< canonical spec
  std::string samples;    ///< samples knob value, "" when the estimator has none
  std::string reference;  ///< canonical spec of the reference

  auto tie() const { return std::tie(dump, layer, head, batch, n, p, estimator, spec, samples, reference); }
  bool operator<(const CaseKey& o) const { return tie() < o.tie(); }
  bool operator==(const CaseKey& o) const { return tie() == o.tie(); }
};

struct TrialRow {
  CaseKey key;
  int64_t trial = 0;
  uint64_t seed = 0;
  std::string metric;
  double value = 0;
};

struct SummaryRow {
  CaseKey key;
  std::string metric;
  int64_t count = 0;
  double mean = 0, std = 0, stderr_ = 0, median = 0, min = 0, max = 0;
};

}  // namespace attnprobe
