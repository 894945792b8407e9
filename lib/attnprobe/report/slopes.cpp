#include "attnprobe/report/slopes.h"

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <utility>

#include "attnprobe/common/text.h"
#include "attnprobe/records/schema.h"

namespace attnprobe {

namespace {

// The spec with its samples value replaced by `*`, so the settings of one sample sweep share a key:
// "yoso(m=16,tau=8,...)" with samples 16 → "yoso(m=*,tau=8,...)". The knob is the key whose value
// is the samples column; specs of estimators without a knob never reach here.
std::string spec_without_samples(const std::string& spec, int64_t samples) {
  const std::string value = "=" + std::to_string(samples);
  for (size_t at = spec.find(value); at != std::string::npos; at = spec.find(value, at + 1)) {
    const size_t end = at + value.size();
    if (end < spec.size() && spec[end] != ',' && spec[end] != ')') continue;
    return spec.substr(0, at) + "=*" + spec.substr(end);
  }
  return spec;
}

}  // namespace

std::vector<SlopeRow> fit_slopes(const std::vector<SummaryRow>& per_case) {
  std::map<std::pair<CaseKey, std::string>, size_t> index;
  std::vector<SlopeRow> rows;
  std::vector<std::vector<std::pair<double, double>>> points;
  for (const SummaryRow& s : per_case) {
    if (!s.key.samples || *s.key.samples <= 0 || !(s.mean > 0) || !std::isfinite(s.mean)) continue;
    CaseKey key = s.key;
    key.spec = spec_without_samples(key.spec, *key.samples);
    key.samples.reset();
    auto [it, added] = index.emplace(std::pair(key, s.metric), rows.size());
    if (added) {
      rows.push_back(SlopeRow{.key = key, .metric = s.metric});
      points.emplace_back();
    }
    points[it->second].emplace_back(std::log(static_cast<double>(*s.key.samples)), std::log(s.mean));
  }
  std::vector<SlopeRow> out;
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& xy = points[i];
    const double count = static_cast<double>(xy.size());
    double mx = 0, my = 0;
    for (const auto& [x, y] : xy) mx += x / count, my += y / count;
    double sxx = 0, sxy = 0;
    for (const auto& [x, y] : xy) sxx += (x - mx) * (x - mx), sxy += (x - mx) * (y - my);
    if (xy.size() < 2 || sxx == 0) continue;  // one sample count: no slope
    SlopeRow r = rows[i];
    r.points = static_cast<int64_t>(xy.size());
    r.slope = sxy / sxx;
    r.intercept = my - r.slope * mx;
    double residuals = 0;
    for (const auto& [x, y] : xy) residuals += std::pow(y - r.intercept - r.slope * x, 2);
    r.stderr_ = xy.size() > 2 ? std::sqrt(residuals / (count - 2) / sxx) : std::nan("");
    r.min_samples = r.max_samples = std::round(std::exp(xy.front().first));  // x = log of an integer
    for (const auto& [x, y] : xy) {
      r.min_samples = std::min(r.min_samples, std::round(std::exp(x)));
      r.max_samples = std::max(r.max_samples, std::round(std::exp(x)));
    }
    out.push_back(std::move(r));
  }
  return out;
}

std::string slopes_csv_text(const std::vector<SlopeRow>& rows) {
  // Written only (nothing reads it back), so the columns have no setters.
  static const std::vector<Column<SlopeRow>> kColumns = [] {
    std::vector<Column<SlopeRow>> c = lifted_key_columns<SlopeRow>({"samples"});
    auto add = [&](std::string name, std::function<std::string(const SlopeRow&)> get) {
      c.push_back({std::move(name), std::move(get), nullptr});
    };
    add("metric", [](const SlopeRow& r) { return r.metric; });
    add("points", [](const SlopeRow& r) { return std::to_string(r.points); });
    add("slope", [](const SlopeRow& r) { return format_real(r.slope); });
    add("stderr", [](const SlopeRow& r) { return format_real(r.stderr_); });
    add("intercept", [](const SlopeRow& r) { return format_real(r.intercept); });
    add("min_samples", [](const SlopeRow& r) { return format_real(r.min_samples); });
    add("max_samples", [](const SlopeRow& r) { return format_real(r.max_samples); });
    return c;
  }();
  return csv_text(kColumns, rows);
}

}  // namespace attnprobe
