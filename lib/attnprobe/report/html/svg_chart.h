#pragma once
// The charts of `attnprobe report` (docs/report.md), drawn as inline SVG by us rather than by a plotting library:
// the page must be one self-contained file that renders without a network and without JavaScript, the charts are
// few and simple (lines with intervals, a scatter of fronts, bars, heatmaps), and SVG text is what the tests can
// read. Hover text is SVG's <title>; every drawn series carries data-estimator, which the page's filter toggles.
#include <cstddef>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace attnprobe {

/// Text made safe inside HTML and SVG (& < > " ').
std::string html_escape(const std::string& text);

/// Tick positions for an axis spanning [low, high] (low < high): on a log axis the powers of ten inside, with 2 and 5
/// times them when the span is under two decades, every other power over eight decades; on a linear axis 1-2-5 steps,
/// about five ticks.
std::vector<double> axis_ticks(double low, double high, bool log);

/// A tick label: up to three significant digits, no trailing zeros ("0.001", "250", "1e+06").
std::string tick_label(double value);

/// The `index`-th colour of a 20-colour qualitative palette (cycling beyond): the colours of the estimators the palette
/// file does not list (estimator_colours).
std::string palette_colour(size_t index);

/// The rows of plots/palette.csv, (estimator name, "#RRGGBB") in the file's order: each estimator's colour in every
/// figure and every report page.
std::vector<std::pair<std::string, std::string>> estimator_palette();

/// Each of `names` (the estimators of one page) with its colour: the palette file's for a name it lists, and for
/// any other name (a custom py: estimator) the next colour of palette_colour() that no name of the page has.
std::map<std::string, std::string> estimator_colours(const std::set<std::string>& names);

struct ChartPoint {
  double x = 0, y = 0;
  double low = 0, high = 0;  ///< the interval drawn as a bar; no bar when low == high == y or either is NaN
  std::string tip;           ///< hover text
};

struct ChartSeries {
  std::string label;      ///< legend text
  std::string estimator;  ///< what the page's filter knows it by (data-estimator)
  std::string colour;
  std::vector<ChartPoint> points;  ///< drawn in this order
  std::string
      dash;  ///< SVG stroke-dasharray ("" solid): tells apart the settings of one estimator, which share its colour
};

struct ChartAxis {
  std::string label;
  bool log = false;
  std::vector<double> ticks;  ///< explicit ticks (e.g. the lengths swept); empty: axis_ticks
};

struct LineChart {
  std::string title;
  ChartAxis x, y;
  std::vector<ChartSeries> series;
};

/// The chart as an <svg> element with its legend below the plot. Points that a log axis cannot draw (≤ 0, NaN) are
/// left out and counted in a note under the chart.
std::string line_chart_svg(const LineChart& chart);

struct HeatCell {
  int row = 0, col = 0;
  double value = 0;
  std::string tip;
};

struct Heatmap {
  std::string title;
  std::string row_axis, col_axis;  ///< "layer", "head"
  int rows = 0, cols = 0;
  std::vector<HeatCell> cells;  ///< cells absent from the list are drawn empty (hatched grey)
  std::string estimator;        ///< data-estimator of the whole map
  std::string id;               ///< unique within the page (names the colour bar's gradient)
};

/// A grid coloured on its own scale (viridis; logarithmic when every value is > 0 and they span over a factor of
/// 10), with a colour bar labelled by the scale's ends, so each map shows which of its heads are hard.
std::string heatmap_svg(const Heatmap& map);

struct BarRow {
  std::string label, estimator, colour;
  std::vector<double> values;  ///< one bar per entry of BarChart::parts
  std::string tip;
};

struct BarChart {
  std::string title, axis;         ///< the value axis' label
  std::vector<std::string> parts;  ///< what each bar of a row is ("bias", "one trial's spread")
  std::vector<BarRow> rows;
};

/// Horizontal grouped bars on a linear axis from zero, so a bar's length is its value.
std::string bar_chart_svg(const BarChart& chart);

}  // namespace attnprobe
