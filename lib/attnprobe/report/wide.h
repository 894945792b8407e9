#pragma once
// The wide view of a summary (`summarize --wide`, docs/csv.md): one row per setting and metric, one column per
// length (or per samples value when the sweep varies the samples at one length), settings named by their non-default
// keys only — the table a person reads, where the long CSV is what programs read.
#include <string>
#include <vector>

#include "attnprobe/records/record.h"

namespace attnprobe {

struct WideTable {
  std::vector<std::string> header;             ///< row-key columns, then one per axis value ("n=256", "samples=16")
  std::vector<std::vector<std::string>> rows;  ///< "" where a setting has no case at that axis value
  std::string axis;                            ///< "n" or "samples"
};

/// Pivots per-case summaries (a slice's or, after --over, a pool's). The axis is n when the summaries hold two or
/// more lengths, else samples when they hold two or more samples values and every estimator has the same ones (a
/// --samples sweep), else n. Row keys: dump, layer, head,
/// batch, mask (when the cases have several), queries (when some case evaluates other rows than all), estimator
/// (Spec::brief: with its samples knob on the n axis, without it on the samples axis), reference (brief), metric; rows
/// in first-appearance order, columns ascending. A cell is the mean (`people`: "mean ± stderr" to 3 and 2 significant
/// digits, the mean alone for one value).
WideTable wide_summary(const std::vector<SummaryRow>& per_case, bool people);

}  // namespace attnprobe
