#include "attnprobe/report/wide.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"
#include "attnprobe/records/schema.h"
#include "attnprobe/report/spec_text.h"

namespace attnprobe {

WideTable wide_summary(const std::vector<SummaryRow>& per_case, bool people) {
  std::set<Coordinate> lengths;
  std::set<int64_t> samples;
  std::map<std::string, std::set<int64_t>> samples_of;  // estimator name → its samples values
  std::set<std::string> masks;
  bool decode = false, rounded = false;
  for (const SummaryRow& s : per_case) {
    lengths.insert(s.key.n);
    if (s.key.samples) samples.insert(*s.key.samples);
    std::set<int64_t>& own = samples_of[s.key.estimator];
    if (s.key.samples) own.insert(*s.key.samples);
    masks.insert(mask_text(s.key.mask, s.key.window));
    decode = decode || !s.key.queries.all();
    rounded = rounded || s.key.precision != Precision::kF32;
  }
  const bool several_masks = masks.size() > 1;
  WideTable table;
  // Samples columns only for a samples sweep (every estimator at the same values, as --samples gives them); settings
  // whose knobs differ (topk's k beside streaming's window) are rows of one length column instead.
  const bool one_sweep =
      std::all_of(samples_of.begin(), samples_of.end(), [&](const auto& entry) { return entry.second == samples; });
  table.axis = lengths.size() < 2 && samples.size() >= 2 && one_sweep ? "samples" : "n";
  const bool by_samples = table.axis == "samples";
  table.header = {"dump", "layer", "head", "batch"};
  if (several_masks) table.header.push_back("mask");
  if (decode) table.header.push_back("queries");
  if (rounded) table.header.push_back("precision");
  for (const char* column : {"estimator", "reference", "metric"}) table.header.push_back(column);
  const size_t key_columns = table.header.size();

  // A summary's place on the axis, ordered: an unset value (an estimator without a knob, or a pooled n) first.
  auto axis_value = [by_samples](const SummaryRow& s) {
    return by_samples ? std::pair(s.key.samples ? 1 : 0, s.key.samples.value_or(0))
                      : std::pair(s.key.n.is_all() ? 0 : 1, s.key.n.is_all() ? 0 : s.key.n.value());
  };
  std::map<std::pair<int, int64_t>, size_t> column_of;  // each axis value its column, ascending
  for (const SummaryRow& s : per_case) column_of.emplace(axis_value(s), 0);
  for (auto& [at, column] : column_of) {
    column = table.header.size();
    table.header.push_back(at.first == 0 ? fmt::format("{}=all", by_samples ? "samples" : "n")
                                         : fmt::format("{}={}", table.axis, at.second));
  }

  std::map<std::vector<std::string>, size_t> row_of;
  std::map<std::string, std::string> briefs;  // spec → its brief label (parse once per spec)
  auto brief = [&](const std::string& spec, Spec::Knob knob) {
    const std::string cache_key = fmt::format("{}|{}", spec, static_cast<int>(knob));
    auto it = briefs.find(cache_key);
    if (it == briefs.end()) it = briefs.emplace(cache_key, brief_spec(spec, knob)).first;
    return it->second;
  };
  for (const SummaryRow& s : per_case) {
    std::vector<std::string> key = {s.key.dump, s.key.layer.text(), s.key.head.text(), s.key.batch.text()};
    if (several_masks) key.push_back(mask_text(s.key.mask, s.key.window));
    if (decode) key.push_back(query_rows_text(s.key.queries));
    if (rounded) key.push_back(precision_name(s.key.precision));
    key.push_back(brief(s.key.spec, by_samples ? Spec::Knob::kNever : Spec::Knob::kAlways));
    key.push_back(brief(s.key.reference, Spec::Knob::kIfNotDefault));
    key.push_back(s.metric);
    if (by_samples)
      key.push_back("");  // the lengths all agree: n is no row key
    else
      key.push_back(s.key.samples ? std::to_string(*s.key.samples) : "");
    auto [it, added] = row_of.emplace(key, table.rows.size());
    if (added) {
      table.rows.emplace_back(key.begin(), key.begin() + static_cast<std::ptrdiff_t>(key_columns));
      table.rows.back().resize(table.header.size());
    }
    std::string& cell = table.rows[it->second][column_of.at(axis_value(s))];
    if (!cell.empty()) throw std::logic_error("summarize --wide: two summaries for one cell (" + join(key, ",") + ")");
    cell = !people       ? format_real(s.mean)
           : s.count > 1 ? fmt::format("{:.3g} ± {:.2g}", s.mean, s.stderr_)
                         : fmt::format("{:.3g}", s.mean);
  }
  return table;
}

}  // namespace attnprobe
