#include "attnprobe/report/html/html_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"
#include "attnprobe/metrics/catalogue.h"
#include "attnprobe/report/compare.h"
#include "attnprobe/report/html/svg_chart.h"
#include "attnprobe/report/pareto.h"
#include "attnprobe/report/spec_text.h"
#include "attnprobe/report/student_t.h"
#include "attnprobe/report/summary.h"
#include "attnprobe/report/wide.h"

namespace attnprobe {

namespace {

// What one chart is drawn over: the cases that differ only in slice, length and setting. A run of one dump, one
// mask, one kind of query rows and one precision has one panel; `--queries all,last:16` gives two.
struct Panel {
  std::string dump;
  int64_t p = 0;
  Mask mask = Mask::kFull;
  int64_t window = 0;
  QueryRows queries;
  Precision precision = Precision::kF32;
  auto operator<=>(const Panel&) const = default;
  bool operator==(const Panel&) const = default;
};

Panel panel_of(const CaseKey& k) { return {k.dump, k.p, k.mask, k.window, k.queries, k.precision}; }

std::string panel_text(const Panel& p) {
  std::string text = fmt::format("{}, p = {}, mask {}", p.dump, p.p, mask_text(p.mask, p.window));
  if (p.queries.kind != QueryRows::Kind::kAll) text += ", queries " + query_rows_text(p.queries);
  if (p.precision != Precision::kF32) text += fmt::format(", in {}", precision_name(p.precision));
  return text;
}

// A setting as people read it: its non-default keys, and its reference when that is not exact softmax.
std::string setting_label(const CaseKey& k, Spec::Knob knob = Spec::Knob::kIfNotDefault) {
  std::string label = brief_spec(k.spec, knob);
  if (k.reference != "softmax") label += " vs " + brief_spec(k.reference);
  return label;
}

// Exact attention in float32 against the float64 reference: the rounding floor, kept in the tables and left out of
// the charts, where its 1e-7 would spend most of a log axis on nothing an estimator decides.
bool is_floor(const CaseKey& k) { return k.estimator == "softmax" && k.reference == "softmax"; }

// The 95% interval of a mean over `count` replicates with standard error `se` (Student t, count − 1 dof).
std::pair<double, double> interval(double mean, double se, int64_t count) {
  if (count < 2 || !std::isfinite(se)) return {mean, mean};
  const double half = student_t_quantile(0.975, static_cast<double>(count - 1)) * se;
  return {mean - half, mean + half};
}

std::string number(double v) { return std::isfinite(v) ? fmt::format("{:.4g}", v) : (std::isnan(v) ? "NaN" : "inf"); }

struct Page {
  std::string body;
  std::vector<std::pair<std::string, std::string>> sections;  // id, title: the table of contents
  std::map<std::string, std::string> colours;                 // estimator -> colour
  int map_count = 0;

  void section(const std::string& id, const std::string& title, const std::string& intro) {
    if (!sections.empty()) body += "</section>\n";
    sections.push_back({id, title});
    body += fmt::format("<section id=\"{}\"><h2>{}</h2>", id, html_escape(title));
    if (!intro.empty()) body += "<p class=\"intro\">" + intro + "</p>";
  }
  void note(const std::string& html) { body += "<p class=\"note\">" + html + "</p>"; }
  const std::string& colour(const std::string& estimator) { return colours.at(estimator); }
};

std::string table_html(const std::vector<std::vector<std::string>>& rows,
                       const std::vector<std::string>& row_estimators, const std::string& css_class = "") {
  std::string out = fmt::format("<div class=\"scroll\"><table class=\"{}\"><thead><tr>", css_class);
  for (const std::string& h : rows.front()) out += "<th>" + html_escape(h) + "</th>";
  out += "</tr></thead><tbody>";
  for (size_t r = 1; r < rows.size(); ++r) {
    const std::string& estimator = row_estimators.at(r - 1);
    out += estimator.empty() ? "<tr>" : fmt::format("<tr data-estimator=\"{}\">", html_escape(estimator));
    for (const std::string& cell : rows[r]) out += "<td>" + html_escape(cell) + "</td>";
    out += "</tr>";
  }
  return out + "</tbody></table></div>";
}

void context_section(Page& page, const ReportInputs& in, const std::vector<SummaryRow>& run) {
  std::set<std::string> dumps, settings;
  std::set<Coordinate> lengths;
  std::set<std::tuple<std::string, Coordinate, Coordinate, Coordinate>> slices;
  for (const SummaryRow& r : run) {
    dumps.insert(r.key.dump);
    settings.insert(r.key.spec + " vs " + r.key.reference);
    lengths.insert(r.key.n);
    slices.insert({r.key.dump, r.key.layer, r.key.head, r.key.batch});
  }
  std::string length_text;
  for (const Coordinate& n : lengths) length_text += (length_text.empty() ? "" : ", ") + n.text();
  std::vector<std::vector<std::string>> rows = {{"", ""}};
  rows.push_back({"CSV", in.run_path});
  rows.push_back({"dump", join(std::vector<std::string>(dumps.begin(), dumps.end()), ", ")});
  rows.push_back({"settings", std::to_string(settings.size())});
  rows.push_back({"slices (layer × head × batch item)", std::to_string(slices.size())});
  rows.push_back({"lengths n", length_text});
  if (in.run_info) {
    const RunInfo& info = *in.run_info;
    rows.push_back({"command", join(info.command_line, " ")});
    rows.push_back({"attnprobe", info.version + (info.git_hash.empty() ? "" : " (git " + info.git_hash + ")")});
    rows.push_back({"device, threads", fmt::format("{}, {}", info.device, info.threads)});
    rows.push_back({"seed", std::to_string(info.seed)});
    rows.push_back({"started", info.started});
    rows.push_back({"finished", info.finished.empty()
                                    ? (info.interrupted.empty() ? "not finished (still running, or "
                                                                  "killed: rerun with --resume)"
                                                                : "interrupted at " + info.interrupted)
                                    : info.finished});
    if (info.plan && info.plan->shard_count > 1)
      rows.push_back({"shard", fmt::format("{} of {}", info.plan->shard_index, info.plan->shard_count)});
    if (!info.merged_from.empty()) rows.push_back({"merged from", join(info.merged_from, ", ")});
  }
  page.section("run", "The run", "");
  page.body += table_html(rows, std::vector<std::string>(rows.size() - 1), "context");
  if (!in.run_info)
    page.note("No run.json beside the CSV: the command, version and seed that produced it are unknown.");
  if (in.run_info && in.run_info->finished.empty())
    page.note("<b>This run did not finish</b>: the numbers below are of the cases it completed.");
}

void tables_section(Page& page, const std::vector<SummaryRow>& pooled, const std::vector<std::string>& metrics) {
  page.section("numbers", "The numbers",
               "Each setting's mean over the slices (layer × head × batch item) ± its standard error over them — the "
               "spread over heads, not Monte-Carlo error (<code>attnprobe summarize --compare</code> separates the "
               "two). The reference each setting is measured against is in its row.");
  for (const std::string& metric : metrics) {
    std::vector<SummaryRow> rows;
    for (const SummaryRow& r : pooled)
      if (r.metric == metric) rows.push_back(r);
    WideTable wide = wide_summary(rows, true);
    // A key column with one value on every row (the pooled `all`s, one dump, the metric) says nothing: left out;
    // the reference stays, since a number is read against it.
    for (size_t at = wide.header.size(); at-- > 0;) {
      if (wide.header[at] == "estimator" || wide.header[at] == "reference" ||
          wide.header[at].find('=') != std::string::npos)
        continue;
      const bool constant = std::all_of(wide.rows.begin(), wide.rows.end(),
                                        [&](const auto& row) { return row[at] == wide.rows.front()[at]; });
      if (!constant || wide.rows.size() < 2) continue;
      wide.header.erase(wide.header.begin() + static_cast<long>(at));
      for (auto& row : wide.rows) row.erase(row.begin() + static_cast<long>(at));
    }
    const auto column = std::find(wide.header.begin(), wide.header.end(), "estimator") - wide.header.begin();
    std::vector<std::vector<std::string>> table = {wide.header};
    std::vector<std::string> estimators;
    for (const auto& row : wide.rows) {
      table.push_back(row);
      const std::string& spec = row.at(static_cast<size_t>(column));
      estimators.push_back(spec.substr(0, spec.find('(')));
    }
    page.body += fmt::format("<h3>{}</h3>", html_escape(metric)) + table_html(table, estimators);
  }
}

// The pooled rows of one metric, per panel and setting (spec + reference), each in ascending n or samples.
using SeriesRows = std::map<std::pair<std::string, std::string>, std::vector<const SummaryRow*>>;

ChartPoint point_of(const SummaryRow& r, double x, const std::string& what) {
  const auto [low, high] = interval(r.mean, r.stderr_, r.count);
  return {.x = x,
          .y = r.mean,
          .low = low,
          .high = high,
          .tip = fmt::format("{}: {} = {} ({} {}; 95% interval {} .. {} over {} slices)", setting_label(r.key),
                             r.metric, number(r.mean), what, x, number(low), number(high), r.count)};
}

// The settings of one estimator share its colour; their lines differ in dash, in the order they are drawn.
void dash_settings(std::vector<ChartSeries>& series) {
  static const std::vector<std::string> kDashes = {"", "7,3", "2,2", "9,3,2,3", "4,4"};
  std::map<std::string, size_t> seen;
  for (ChartSeries& s : series) s.dash = kDashes[seen[s.estimator]++ % kDashes.size()];
}

// A chart of settings: each series' points in ascending x, in the map's order (estimator, then knob), dashed apart.
template <class Key>
std::string settings_chart(LineChart chart, std::map<Key, ChartSeries>& series) {
  for (auto& [key, s] : series) {
    std::sort(s.points.begin(), s.points.end(), [](const ChartPoint& a, const ChartPoint& b) { return a.x < b.x; });
    chart.series.push_back(std::move(s));
  }
  dash_settings(chart.series);
  return line_chart_svg(chart);
}

bool log_worthy(const std::vector<double>& values) {
  double low = INFINITY, high = 0;
  for (const double v : values) {
    if (!std::isfinite(v)) continue;
    if (v <= 0) return false;
    low = std::min(low, v);
    high = std::max(high, v);
  }
  return high > 0 && high > 8 * low;
}

void length_section(Page& page, const std::vector<SummaryRow>& pooled, const std::vector<std::string>& metrics) {
  page.section("length", "Error against length",
               "Mean over slices with 95% intervals (Student t over the slices). Exact float32 attention (the rounding "
               "floor) is in the tables only.");
  std::map<Panel, std::set<int64_t>> lengths;
  for (const SummaryRow& r : pooled)
    if (!r.key.n.is_all()) lengths[panel_of(r.key)].insert(r.key.n.value());
  bool drew = false;
  for (const auto& [panel, ns] : lengths) {
    if (ns.size() < 2) continue;
    for (const std::string& metric : metrics) {
      // Ordered by estimator, then by the samples knob, so one estimator's settings read in order down the legend.
      std::map<std::tuple<std::string, int64_t, std::string, std::string>, ChartSeries> series;
      std::vector<double> ys;
      for (const SummaryRow& r : pooled) {
        if (r.metric != metric || panel_of(r.key) != panel || is_floor(r.key) || r.key.n.is_all()) continue;
        ChartSeries& s = series[{r.key.estimator, r.key.samples.value_or(-1), r.key.spec, r.key.reference}];
        s.label = setting_label(r.key);
        s.estimator = r.key.estimator;
        s.colour = page.colour(r.key.estimator);
        s.points.push_back(point_of(r, static_cast<double>(r.key.n.value()), "n ="));
        ys.push_back(r.mean);
      }
      if (series.empty()) continue;
      LineChart chart{.title = fmt::format("{} against n — {}", metric, panel_text(panel)),
                      .x = {.label = "n (keys)", .log = true, .ticks = {}},
                      .y = {.label = metric, .log = log_worthy(ys), .ticks = {}},
                      .series = {}};
      if (ns.size() <= 12)
        for (const int64_t n : ns) chart.x.ticks.push_back(static_cast<double>(n));
      page.body += settings_chart(std::move(chart), series);
      drew = true;
    }
  }
  if (!drew) page.note("The run has one length per panel: sweep <code>--lengths 256..4096:x2</code> to draw this.");
}

// The largest length of each panel: where the maps, fronts and bias/variance are drawn.
std::map<Panel, Coordinate> largest_lengths(const std::vector<SummaryRow>& rows) {
  std::map<Panel, Coordinate> largest;
  for (const SummaryRow& r : rows) {
    auto [it, fresh] = largest.try_emplace(panel_of(r.key), r.key.n);
    if (!fresh && it->second < r.key.n) it->second = r.key.n;
  }
  return largest;
}

// Settings ranked by their mean at each panel's largest length, each step down the ranking backed by the paired
// comparison over heads (report/compare.h): a ranking the heads do not support says so.
void ranking_section(Page& page, const std::vector<SummaryRow>& per_case, const std::vector<SummaryRow>& pooled,
                     const std::string& metric) {
  page.section(
      "ranking", "Ranking",
      fmt::format("The settings by their mean {} at each panel's largest length, best first, among those "
                  "measured against the same reference. Each step down is the paired comparison over heads "
                  "of <code>attnprobe summarize --compare</code>: the mean difference over heads with its 95% "
                  "bootstrap interval, on how many heads the higher-ranked setting is better, and the exact "
                  "sign test. A step whose interval holds 0 is not supported by this model's heads. The "
                  "Monte-Carlo se is the trials' share of the uncertainty: where it is small beside the spread "
                  "over slices, more trials would not change the ranking, more heads might.",
                  html_escape(metric)));
  for (const SummaryRow& r : per_case)
    if (r.key.layer.is_all() || r.key.head.is_all()) {
      page.note("The input is already pooled over layers or heads: the paired comparison needs per-slice rows.");
      return;
    }
  const std::optional<Metric> known = find_metric(metric);
  const bool larger_better = known && larger_is_better(*known);
  bool drew = false;
  for (const auto& [panel, n] : largest_lengths(per_case)) {
    std::map<std::string, std::vector<const SummaryRow*>> by_reference;
    for (const SummaryRow& r : pooled)
      if (r.metric == metric && panel_of(r.key) == panel && r.key.n == n && !is_floor(r.key))
        by_reference[r.key.reference].push_back(&r);
    std::vector<SummaryRow> slices;  // the per-slice rows the comparisons pair (this metric only: fast)
    // The Monte-Carlo standard error of each setting's mean over slices, √(Σ se_i²)/k from its slices' trial
    // standard errors (a single run counts 0): beside the spread over slices, it says whether more trials or more
    // heads would move the ranking.
    std::map<std::pair<std::string, std::string>, std::pair<double, int64_t>> monte_carlo;
    for (const SummaryRow& r : per_case)
      if (r.metric == metric && panel_of(r.key) == panel && r.key.n == n) {
        slices.push_back(r);
        auto& [squares, count] = monte_carlo[{r.key.spec, r.key.reference}];
        squares += std::pow(stderr_or_zero(r), 2);
        ++count;
      }
    for (auto& [reference, settings] : by_reference) {
      if (settings.size() < 2) continue;
      std::stable_sort(settings.begin(), settings.end(), [&](const SummaryRow* a, const SummaryRow* b) {
        return larger_better ? a->mean > b->mean : a->mean < b->mean;
      });
      std::vector<std::vector<std::string>> table = {
          {"rank", "setting", fmt::format("{} (mean ± se over slices)", metric), "Monte-Carlo se", "vs the next",
           "difference over heads [95% interval]", "better on heads", "sign test p"}};
      std::vector<std::string> estimators;
      for (size_t i = 0; i < settings.size(); ++i) {
        const SummaryRow& a = *settings[i];
        const auto [squares, count] = monte_carlo[{a.key.spec, a.key.reference}];
        std::vector<std::string> row = {std::to_string(i + 1), setting_label(a.key),
                                        fmt::format("{} ± {}", number(a.mean), number(a.stderr_)),
                                        number(std::sqrt(squares) / static_cast<double>(count))};
        if (i + 1 < settings.size()) {
          const SummaryRow& b = *settings[i + 1];
          row.push_back(brief_spec(b.key.spec));
          try {
            const std::vector<ComparisonRow> paired = compare_paired(slices, a.key.spec, b.key.spec);
            const auto it = std::find_if(paired.begin(), paired.end(),
                                         [&](const ComparisonRow& c) { return c.key.reference == reference; });
            if (it == paired.end()) throw UsageError("no common slice");
            row.push_back(fmt::format("{} [{}, {}]", number(it->diff), number(it->ci_low), number(it->ci_high)));
            row.push_back(fmt::format("{} of {}", it->a_better, it->heads));
            row.push_back(number(it->sign_p));
          } catch (const UsageError&) {
            row.insert(row.end(), {"no slice has both", "", ""});
          }
        } else {
          row.insert(row.end(), {"", "", "", ""});
        }
        table.push_back(row);
        estimators.push_back(a.key.estimator);
      }
      page.body += fmt::format("<h3>{}, n = {}{}</h3>", html_escape(panel_text(panel)), n.text(),
                               reference == "softmax" ? "" : ", against " + html_escape(brief_spec(reference)));
      page.body += table_html(table, estimators);
      drew = true;
    }
  }
  if (!drew) page.note("Fewer than two settings share a reference: nothing to rank.");
}

void samples_section(Page& page, const std::vector<SummaryRow>& pooled, const std::vector<std::string>& metrics) {
  page.section("samples", "Error against samples",
               "At each panel's largest length, each estimator's samples knob (m, d, M, k, …) on the x axis. The knob "
               "is not a common cost: compare methods on the fronts of the next-but-one section.");
  const std::map<Panel, Coordinate> largest = largest_lengths(pooled);
  bool drew = false;
  for (const auto& [panel, n] : largest)
    for (const std::string& metric : metrics) {
      std::map<std::pair<std::string, std::string>, ChartSeries> series;
      std::vector<double> xs, ys;
      for (const SummaryRow& r : pooled) {
        if (r.metric != metric || panel_of(r.key) != panel || r.key.n != n || !r.key.samples || is_floor(r.key))
          continue;
        ChartSeries& s = series[{brief_spec(r.key.spec, Spec::Knob::kNever), r.key.reference}];
        s.label = setting_label(r.key, Spec::Knob::kNever);
        s.estimator = r.key.estimator;
        s.colour = page.colour(r.key.estimator);
        s.points.push_back(point_of(r, static_cast<double>(*r.key.samples), "samples ="));
        xs.push_back(static_cast<double>(*r.key.samples));
        ys.push_back(r.mean);
      }
      std::erase_if(series, [](const auto& s) { return s.second.points.size() < 2; });
      if (series.empty()) continue;
      LineChart chart{.title = fmt::format("{} against samples — {}, n = {}", metric, panel_text(panel), n.text()),
                      .x = {.label = "samples knob", .log = log_worthy(xs), .ticks = {}},
                      .y = {.label = metric, .log = log_worthy(ys), .ticks = {}},
                      .series = {}};
      page.body += settings_chart(std::move(chart), series);
      drew = true;
    }
  if (!drew)
    page.note("No estimator ran at two or more samples values: sweep <code>--samples 16..256:x2</code> to draw this.");
}

// The head diagnostics of one slice grid: (layer, head) -> value, mean over batch items, at length n.
std::map<std::pair<int64_t, int64_t>, std::pair<double, int>> diagnostic_grid(const std::vector<DiagnosticRow>& rows,
                                                                              const Panel& panel, const Coordinate& n,
                                                                              const std::string& diagnostic) {
  std::map<std::pair<int64_t, int64_t>, std::pair<double, int>> grid;
  for (const DiagnosticRow& d : rows) {
    if (d.diagnostic != diagnostic || d.dump != panel.dump || d.n != n || d.mask != panel.mask ||
        d.window != panel.window || d.queries != panel.queries || d.layer.is_all() || d.head.is_all())
      continue;
    auto& [sum, count] = grid[{d.layer.value(), d.head.value()}];
    sum += d.value;
    ++count;
  }
  return grid;
}

void heads_section(Page& page, const ReportInputs& in, const std::vector<SummaryRow>& per_case,
                   const std::string& metric) {
  page.section("heads", "Which heads are hard",
               fmt::format("{} per layer and head at each panel's largest length (mean over batch items), one map per "
                           "setting, each on its own colour scale: a map shows which of its heads are hard, the tables "
                           "compare settings. Hover a cell for its value.",
                           html_escape(metric)));
  bool pooled_input = false;
  for (const SummaryRow& r : per_case) pooled_input = pooled_input || r.key.layer.is_all() || r.key.head.is_all();
  if (pooled_input) {
    page.note("The input is already pooled over layers or heads (<code>summarize --over</code>): no maps.");
    return;
  }
  const std::vector<SummaryRow> per_head = summarize_over(per_case, {"batch"});
  const std::map<Panel, Coordinate> largest = largest_lengths(per_head);
  for (const auto& [panel, n] : largest) {
    std::map<std::tuple<std::string, int64_t, std::string, std::string>, std::vector<const SummaryRow*>> maps;
    int64_t layers = 0, heads = 0;
    for (const SummaryRow& r : per_head) {
      if (r.metric != metric || panel_of(r.key) != panel || r.key.n != n || is_floor(r.key)) continue;
      maps[{r.key.estimator, r.key.samples.value_or(-1), r.key.spec, r.key.reference}].push_back(&r);
      layers = std::max(layers, r.key.layer.value() + 1);
      heads = std::max(heads, r.key.head.value() + 1);
    }
    if (maps.empty()) continue;
    page.body += fmt::format("<h3>{}, n = {}</h3><div class=\"maps\">", html_escape(panel_text(panel)), n.text());
    // The head diagnostics of the same slices first: the property a hard head has, beside the maps of its error.
    std::set<std::string> diagnostics;
    for (const DiagnosticRow& d : in.diagnostics) diagnostics.insert(d.diagnostic);
    for (const std::string& diagnostic :
         {std::string("entropy"), std::string("effective_support"), std::string("sink_mass")}) {
      if (!diagnostics.contains(diagnostic)) continue;
      const auto grid = diagnostic_grid(in.diagnostics, panel, n, diagnostic);
      if (grid.empty()) continue;
      Heatmap map{.title = "diagnostic: " + diagnostic,
                  .row_axis = "layer",
                  .col_axis = "head",
                  .rows = static_cast<int>(layers),
                  .cols = static_cast<int>(heads),
                  .cells = {},
                  .estimator = "",
                  .id = fmt::format("map{}", page.map_count++)};
      for (const auto& [where, sum_count] : grid) {
        const double value = sum_count.first / sum_count.second;
        map.cells.push_back(
            {.row = static_cast<int>(where.first),
             .col = static_cast<int>(where.second),
             .value = value,
             .tip = fmt::format("layer {} head {}: {} = {}", where.first, where.second, diagnostic, number(value))});
      }
      page.body += heatmap_svg(map);
    }
    for (const auto& [setting, rows] : maps) {
      Heatmap map{.title = setting_label(rows.front()->key),
                  .row_axis = "layer",
                  .col_axis = "head",
                  .rows = static_cast<int>(layers),
                  .cols = static_cast<int>(heads),
                  .cells = {},
                  .estimator = rows.front()->key.estimator,
                  .id = fmt::format("map{}", page.map_count++)};
      for (const SummaryRow* r : rows)
        map.cells.push_back(
            {.row = static_cast<int>(r->key.layer.value()),
             .col = static_cast<int>(r->key.head.value()),
             .value = r->mean,
             .tip = fmt::format("layer {} head {}: {} = {} ({} batch item{})", r->key.layer.text(), r->key.head.text(),
                                metric, number(r->mean), r->count, r->count == 1 ? "" : "s")});
      page.body += heatmap_svg(map);
    }
    page.body += "</div>";
  }
  if (in.diagnostics.empty())
    page.note(
        "Run <code>attnprobe diagnose DUMP --lengths N -o diag.csv</code> and pass <code>--diagnostics "
        "diag.csv</code> to draw each head's attention entropy and support beside these maps.");
}

void cost_section(Page& page, const std::vector<SummaryRow>& pooled, const std::vector<std::string>& metrics) {
  page.section("cost", "Error against cost",
               "Each estimator's front at each panel's largest length: the settings that no other setting of it beats "
               "with fewer keys read (density: the fraction of the visible keys a row reads). Methods compare at "
               "equal cost along the x axis.");
  bool has_density = false;
  for (const SummaryRow& r : pooled) has_density = has_density || r.metric == "density";
  if (!has_density) {
    page.note(
        "No cost in this run: the selection and sampling estimators record the keys each row reads with "
        "<code>--metrics all,selection</code> (the samples knob is not a cost that compares methods).");
    return;
  }
  const std::vector<ParetoRow> fronts = pareto_fronts(pooled, "density");
  const std::map<Panel, Coordinate> largest = largest_lengths(pooled);
  for (const auto& [panel, n] : largest)
    for (const std::string& metric : metrics) {
      if (metric == "density") continue;
      std::map<std::string, ChartSeries> series;
      std::vector<double> xs, ys;
      for (const ParetoRow& f : fronts) {
        if (f.metric != metric || panel_of(f.key) != panel || f.key.n != n) continue;
        ChartSeries& s = series[f.key.estimator + " vs " + f.key.reference];
        s.label = f.key.estimator + (f.key.reference == "softmax" ? "" : " vs " + brief_spec(f.key.reference));
        s.estimator = f.key.estimator;
        s.colour = page.colour(f.key.estimator);
        s.points.push_back({.x = f.axis,
                            .y = f.value,
                            .low = f.value,
                            .high = f.value,
                            .tip = fmt::format("{}: density {}, {} {}", brief_spec(f.key.spec), number(f.axis), metric,
                                               number(f.value))});
        xs.push_back(f.axis);
        ys.push_back(f.value);
      }
      if (series.empty()) continue;
      LineChart chart{.title = fmt::format("{} against keys read — {}, n = {}", metric, panel_text(panel), n.text()),
                      .x = {.label = "density (fraction of visible keys read)", .log = log_worthy(xs), .ticks = {}},
                      .y = {.label = metric, .log = log_worthy(ys), .ticks = {}},
                      .series = {}};
      for (auto& [key, s] : series) chart.series.push_back(std::move(s));
      page.body += line_chart_svg(chart);
    }
}

void bias_section(Page& page, const std::vector<SummaryRow>& pooled) {
  page.section("bias", "Bias and variance",
               "For each random setting at each panel's largest length, over its trials: the bias ‖R̄ − R*‖_F / ‖R*‖_F "
               "(what averaging trials cannot remove) and one trial's spread √var_fro_rel, in the same units, on a "
               "linear axis from zero, means over slices.");
  std::map<std::tuple<Panel, std::string, int64_t, std::string, std::string>,
           std::pair<const SummaryRow*, const SummaryRow*>>
      settings;
  const std::map<Panel, Coordinate> largest = largest_lengths(pooled);
  for (const SummaryRow& r : pooled) {
    if (largest.at(panel_of(r.key)) != r.key.n) continue;
    const auto setting =
        std::make_tuple(panel_of(r.key), r.key.estimator, r.key.samples.value_or(-1), r.key.spec, r.key.reference);
    if (r.metric == "bias_fro_rel") settings[setting].first = &r;
    if (r.metric == "var_fro_rel") settings[setting].second = &r;
  }
  std::erase_if(settings, [](const auto& s) { return !s.second.first || !s.second.second; });
  if (settings.empty()) {
    page.note(
        "No bias/variance split in this run: sweep with <code>--metrics all,case</code> (and two or more "
        "trials) to draw it.");
    return;
  }
  BarChart chart{.title = "bias and one trial's spread (relative Frobenius)",
                 .axis = "relative Frobenius error",
                 .parts = {"bias", "one trial's spread"},
                 .rows = {}};
  std::vector<std::vector<std::string>> table = {{"setting", "n", "bias_fro_rel", "√var_fro_rel", "bias / spread"}};
  std::vector<std::string> estimators;
  for (const auto& [key, rows] : settings) {
    const double bias = rows.first->mean, spread = std::sqrt(rows.second->mean);
    const std::string label =
        setting_label(rows.first->key) + (largest.size() > 1 ? " — " + panel_text(panel_of(rows.first->key)) : "");
    chart.rows.push_back({.label = label,
                          .estimator = rows.first->key.estimator,
                          .colour = page.colour(rows.first->key.estimator),
                          .values = {bias, spread},
                          .tip = fmt::format("{}: bias {}, spread {}", label, number(bias), number(spread))});
    table.push_back({label, rows.first->key.n.text(), number(bias), number(spread), number(bias / spread)});
    estimators.push_back(rows.first->key.estimator);
  }
  page.body += bar_chart_svg(chart) + table_html(table, estimators);
}

std::string gate_case_text(const Comparison& c) {
  return fmt::format("{} L{} H{} B{} n={} {}", c.key.dump, c.key.layer.text(), c.key.head.text(), c.key.batch.text(),
                     c.key.n.text(), setting_label(c.key));
}

void gate_section(Page& page, const ReportInputs& in) {
  page.section("gate", "Against the baseline",
               fmt::format("The regression gate of <code>attnprobe check</code> against <code>{}</code>: a case is "
                           "worse when its mean rose by more than z·√(se_new² + se_base²) + atol + rtol·|mean_base| (z "
                           "= {}, atol = {}, rtol = {}; the fractions found count the other way).",
                           html_escape(in.baseline_path), in.gate.z, in.gate.atol, in.gate.rtol));
  const CheckReport report = check_regressions(in.baseline, in.run, in.gate);
  const bool failed = report.failed();
  page.body += fmt::format(
      "<p class=\"verdict {}\">{} — {} comparisons, {} regressions, {} missing cases, {} improvements, {} new</p>",
      failed ? "failed" : "passed", failed ? "FAILED" : "passed", report.compared, report.regressions, report.missing,
      report.improvements, report.added);
  std::vector<std::vector<std::string>> table = {{"verdict", "case", "metric", "baseline", "new", "z"}};
  std::vector<std::string> estimators;
  constexpr size_t kShown = 200;
  size_t hidden = 0;
  for (const Comparison& c : report.comparisons) {
    if (table.size() > kShown) {
      ++hidden;
      continue;
    }
    table.push_back(
        {verdict_name(c.verdict), gate_case_text(c), c.metric,
         fmt::format("{} ± {}", number(c.base_mean), number(c.base_se)),
         c.verdict == Verdict::kMissing ? "(missing)" : fmt::format("{} ± {}", number(c.new_mean), number(c.new_se)),
         c.verdict == Verdict::kNew ? "" : fmt::format("{:.2f}", c.z)});
    estimators.push_back(c.key.estimator);
  }
  if (table.size() > 1) page.body += table_html(table, estimators, "gate");
  if (hidden > 0)
    page.note(
        fmt::format("{} more comparisons, all less severe than those shown: <code>attnprobe check {} --baseline {} "
                    "--all</code> lists every one.",
                    hidden, html_escape(in.run_path), html_escape(in.baseline_path)));
}

std::vector<std::string> chosen_metrics(const ReportInputs& in) {
  std::vector<std::string> present;
  for (const SummaryRow& r : in.run)
    if (std::find(present.begin(), present.end(), r.metric) == present.end()) present.push_back(r.metric);
  if (!in.metrics.empty()) {
    for (const std::string& m : in.metrics)
      if (std::find(present.begin(), present.end(), m) == present.end())
        throw UsageError(fmt::format("--metric {}: the run has no such metric; it has {}", m, join(present, ", ")));
    return in.metrics;
  }
  std::vector<std::string> chosen;
  for (const std::string& m : kDefaultReportMetrics)
    if (chosen.size() < 3 && std::find(present.begin(), present.end(), m) != present.end()) chosen.push_back(m);
  if (chosen.empty()) chosen.push_back(present.front());
  return chosen;
}

constexpr const char* kStyle = R"(
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#222;margin:0;background:#fafafa}
header{background:#fff;border-bottom:1px solid #ddd;padding:14px 28px;position:sticky;top:0;z-index:2}
header h1{font-size:19px;margin:0 0 4px}
nav a{margin-right:14px;color:#1f5fa8;text-decoration:none}
main{padding:8px 28px 40px;max-width:1400px}
section{background:#fff;border:1px solid #e2e2e2;border-radius:6px;margin:18px 0;padding:6px 18px 14px}
h2{font-size:17px;margin:12px 0 6px}h3{font-size:14px;margin:14px 0 6px}
.intro{color:#444;max-width:980px}.note{color:#6a6a6a;font-size:13px}
figure{display:inline-block;margin:8px 18px 8px 0;vertical-align:top}
.maps figure{margin:4px 10px 4px 0}
.legend{max-width:620px;font-size:12px}.legend span{display:inline-block;margin:2px 12px 2px 0}
.legend i{display:inline-block;width:12px;height:12px;margin-right:5px;vertical-align:-1px;border-radius:2px}
.scroll{overflow-x:auto}
table{border-collapse:collapse;font-size:12.5px;margin:6px 0}
th,td{border-bottom:1px solid #e6e6e6;padding:3px 10px 3px 0;text-align:left;white-space:nowrap}
th{color:#555;font-weight:600}
table.context td:first-child{color:#555}table.context td{white-space:normal}
.verdict{font-weight:600;padding:6px 10px;border-radius:4px;display:inline-block}
.verdict.passed{background:#e3f4e3;color:#1d5e1d}.verdict.failed{background:#fbe3e3;color:#8e1b1b}
#filter label{margin-right:12px;font-size:13px;white-space:nowrap}
#filter i{display:inline-block;width:11px;height:11px;margin:0 4px 0 3px;border-radius:2px;vertical-align:-1px}
.hidden{display:none!important}
#errors{color:#a00}
)";

// Filtering by estimator (every drawn series, map and table row carries data-estimator; #hide=a,b in the address
// hides some from the start), and the marks the
// headless-browser test reads: data-ready once the script ran, data-errors with the count of script errors.
constexpr const char* kScript = R"(
(function(){
  var boxes=document.querySelectorAll('#filter input');
  function apply(){
    var off={};
    boxes.forEach(function(b){if(!b.checked)off[b.value]=true;});
    document.querySelectorAll('[data-estimator]').forEach(function(el){
      var name=el.getAttribute('data-estimator');
      el.classList.toggle('hidden',name!==''&&off[name]===true);
    });
  }
  // A link can hide estimators: report.html#hide=performer,yoso
  var hash=/hide=([^&]*)/.exec(location.hash);
  if(hash)hash[1].split(',').forEach(function(name){
    boxes.forEach(function(b){if(b.value===decodeURIComponent(name))b.checked=false;});
  });
  boxes.forEach(function(b){b.addEventListener('change',apply);});
  var all=document.getElementById('filter-all');
  if(all)all.addEventListener('click',function(){boxes.forEach(function(b){b.checked=true;});apply();});
  apply();
  document.body.setAttribute('data-charts',String(document.querySelectorAll('svg').length));
  document.body.setAttribute('data-ready','yes');
})();
)";

}  // namespace

std::string html_report(const ReportInputs& in) {
  if (in.run.empty()) throw InputError(fmt::format("'{}' has no rows to report", in.run_path));
  const std::vector<std::string> metrics = chosen_metrics(in);
  Page page;
  std::set<std::string> estimators;
  for (const SummaryRow& r : in.run) estimators.insert(r.key.estimator);
  for (const SummaryRow& r : in.baseline) estimators.insert(r.key.estimator);
  page.colours = estimator_colours(estimators);

  bool sliced = true;
  for (const SummaryRow& r : in.run) sliced = sliced && !r.key.layer.is_all() && !r.key.head.is_all();
  std::vector<std::string> over = {"layer", "head", "batch"};
  const std::vector<SummaryRow> pooled = sliced ? summarize_over(in.run, over) : in.run;

  context_section(page, in, in.run);
  if (!in.baseline_path.empty()) gate_section(page, in);
  tables_section(page, pooled, metrics);
  ranking_section(page, in.run, pooled, metrics.front());
  length_section(page, pooled, metrics);
  samples_section(page, pooled, metrics);
  heads_section(page, in, in.run, metrics.front());
  cost_section(page, pooled, metrics);
  bias_section(page, pooled);
  page.body += "</section>\n";

  std::set<std::string> dumps;
  for (const SummaryRow& r : in.run) dumps.insert(r.key.dump);
  const std::string title = "attnprobe report: " + join(std::vector<std::string>(dumps.begin(), dumps.end()), ", ");
  std::string out = "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">";
  out += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">";
  out += fmt::format("<title>{}</title><style>{}</style>", html_escape(title), kStyle);
  out +=
      "<script>window.reportErrors=[];window.addEventListener('error',function(e){window.reportErrors.push("
      "String(e.message));document.body&&document.body.setAttribute('data-errors',String(window.reportErrors."
      "length));});</script>";
  out += "</head>\n<body data-errors=\"0\"><header>";
  out += fmt::format("<h1>{}</h1>", html_escape(title));
  out += "<nav>";
  for (const auto& [id, name] : page.sections) out += fmt::format("<a href=\"#{}\">{}</a>", id, html_escape(name));
  out += "</nav><div id=\"filter\">estimators: ";
  for (const std::string& e : estimators)
    out += fmt::format(
        "<label><input type=\"checkbox\" value=\"{0}\" checked><i style=\"background:{1}\"></i>{0}"
        "</label>",
        html_escape(e), page.colour(e));
  out += "<button id=\"filter-all\" type=\"button\">all</button></div></header>\n<main>";
  out += page.body;
  out += fmt::format("<p class=\"note\">Written by {}. <span id=\"errors\"></span></p></main>",
                     html_escape(in.generated_by.empty() ? std::string("attnprobe report") : in.generated_by));
  out += fmt::format("<script>{}</script></body></html>\n", kScript);
  return out;
}

}  // namespace attnprobe
