#include "attnprobe/report/html/svg_chart.h"

#include <fmt/format.h>

#include "attnprobe/report/html/estimator_palette.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <limits>

namespace attnprobe {

std::string html_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::vector<double> axis_ticks(double low, double high, bool log) {
  std::vector<double> ticks;
  if (!(low < high) || !std::isfinite(low) || !std::isfinite(high)) return ticks;
  if (log) {
    if (low <= 0) return ticks;
    const int first = static_cast<int>(std::floor(std::log10(low))),
              last = static_cast<int>(std::ceil(std::log10(high)));
    const double span = std::log10(high / low);  // decades the axis shows
    const int stride = span > 8 ? 2 : 1;
    const std::vector<double> multiples = span < 2 ? std::vector<double>{1, 2, 5} : std::vector<double>{1};
    for (int e = first; e <= last; e += stride)
      for (const double m : multiples) {
        const double t = m * std::pow(10.0, e);
        if (t >= low * (1 - 1e-9) && t <= high * (1 + 1e-9)) ticks.push_back(t);
      }
    return ticks;
  }
  const double raw = (high - low) / 5, magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (const double m : {1.0, 2.0, 5.0, 10.0})
    if (m * magnitude >= raw) {
      step = m * magnitude;
      break;
    }
  for (double t = std::ceil(low / step) * step; t <= high + 1e-9 * step; t += step)
    ticks.push_back(std::fabs(t) < 1e-12 * step ? 0.0 : t);
  return ticks;
}

std::string tick_label(double value) {
  // Lengths and sample counts are whole numbers people read in full (1024, not 1.02e+03).
  if (std::fabs(value) >= 1000 && std::fabs(value) < 1e7 && value == std::round(value))
    return fmt::format("{:.0f}", value);
  return fmt::format("{:.3g}", value);
}

std::string palette_colour(size_t index) {
  // Tableau's ten (ordered so that neighbours differ most), then their light partners.
  static constexpr std::array<const char*, 20> kColours = {
      "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
      "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5"};
  return kColours[index % kColours.size()];
}

std::vector<std::pair<std::string, std::string>> estimator_palette() {
  std::vector<std::pair<std::string, std::string>> rows;
  for (const auto& [name, colour] : kEstimatorPalette) rows.emplace_back(name, colour);
  return rows;
}

std::map<std::string, std::string> estimator_colours(const std::set<std::string>& names) {
  const auto lower = [](std::string text) {
    for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return text;
  };
  std::map<std::string, std::string> colours;
  std::set<std::string> taken;  // lower-case: the index palette writes "#8c564b", the file "#8C564B"
  for (const auto& [name, colour] : kEstimatorPalette)
    if (names.count(std::string(name))) {
      colours[std::string(name)] = std::string(colour);
      taken.insert(lower(std::string(colour)));
    }
  // A name the file does not list (a custom py: estimator) takes the next index colour no name on the page has,
  // so it cannot be mistaken for a listed estimator drawn beside it.
  size_t next = 0;
  for (const std::string& name : names) {
    if (colours.count(name)) continue;
    for (size_t tries = 0; tries < 20 && taken.count(lower(palette_colour(next))); ++tries) ++next;
    colours[name] = palette_colour(next++);
    taken.insert(lower(colours[name]));
  }
  return colours;
}

namespace {

constexpr double kWidth = 620, kHeight = 340, kLeft = 72, kRight = 16, kTop = 34, kBottom = 52;

// One axis' mapping from data to pixels.
struct Scale {
  double low = 0, high = 1;
  bool log = false;
  double from = 0, to = 1;  // pixels of low and high
  double operator()(double v) const {
    const double f = log ? std::log10(v) : v, a = log ? std::log10(low) : low, b = log ? std::log10(high) : high;
    return from + (f - a) / (b - a) * (to - from);
  }
  bool drawable(double v) const { return std::isfinite(v) && (!log || v > 0); }
  double clamp(double v) const {
    if (log && !(v > 0)) return low;
    return std::clamp(v, low, high);
  }
};

// The data range of an axis, widened a little so no point sits on the frame; a single value gets a span around it.
Scale fit_scale(std::vector<double> values, bool log, const std::vector<double>& ticks, double from, double to) {
  Scale s;
  s.log = log;
  s.from = from;
  s.to = to;
  for (const double t : ticks) values.push_back(t);
  std::erase_if(values, [&](double v) { return !std::isfinite(v) || (log && v <= 0); });
  if (values.empty()) values = log ? std::vector<double>{1} : std::vector<double>{0};
  double low = *std::min_element(values.begin(), values.end()), high = *std::max_element(values.begin(), values.end());
  if (log) {
    const double pad = low == high ? 2.0 : std::pow(high / low, 0.04);
    s.low = low / pad;
    s.high = high * pad;
  } else {
    const double pad = low == high ? (low == 0 ? 1.0 : std::fabs(low) * 0.5) : (high - low) * 0.04;
    s.low = low - pad;
    s.high = high + pad;
    if (low >= 0 && s.low < 0) s.low = 0;  // errors are >= 0: no negative axis below them
  }
  return s;
}

std::string text_element(double x, double y, const std::string& text, const std::string& anchor,
                         const std::string& extra = "") {
  return fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"{}\"{}>{}</text>", x, y, anchor, extra,
                     html_escape(text));
}

// Frame, grid lines, ticks and axis labels of a plot area.
std::string axes_svg(const Scale& sx, const Scale& sy, const std::vector<double>& xt, const std::vector<double>& yt,
                     const std::string& x_label, const std::string& y_label) {
  std::string out = "<g class=\"axes\" font-size=\"11\" fill=\"#333\">";
  for (const double t : yt) {
    if (t < sy.low || t > sy.high) continue;
    const double y = sy(t);
    out += fmt::format("<line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#e4e4e4\"/>", sx.from,
                       sx.to, y, y);
    out += text_element(sx.from - 6, y + 4, tick_label(t), "end");
  }
  for (const double t : xt) {
    if (t < sx.low || t > sx.high) continue;
    const double x = sx(t);
    out += fmt::format("<line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#e4e4e4\"/>", x, x,
                       sy.from, sy.to);
    out += text_element(x, sy.from + 16, tick_label(t), "middle");
  }
  out +=
      fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" stroke=\"#888\"/>",
                  sx.from, sy.to, sx.to - sx.from, sy.from - sy.to);
  out += text_element((sx.from + sx.to) / 2, sy.from + 38, x_label, "middle", " font-size=\"12\"");
  out += fmt::format(
      "<text transform=\"translate(16,{:.1f}) rotate(-90)\" text-anchor=\"middle\" font-size=\"12\">{}</text>",
      (sy.from + sy.to) / 2, html_escape(y_label));
  return out + "</g>";
}

// Drawn as HTML under the chart, so a long label wraps instead of covering data; each swatch is a short stretch of its
// series' line, dash included.
std::string legend_html(const std::vector<ChartSeries>& series) {
  std::string out = "<div class=\"legend\">";
  for (const ChartSeries& s : series)
    out += fmt::format(
        "<span data-estimator=\"{}\"><svg width=\"24\" height=\"10\"><line x1=\"1\" y1=\"5\" x2=\"23\" y2=\"5\" "
        "stroke=\"{}\" stroke-width=\"2.5\"{}/></svg> {}</span>",
        html_escape(s.estimator), s.colour, s.dash.empty() ? "" : " stroke-dasharray=\"" + s.dash + "\"",
        html_escape(s.label));
  return out + "</div>";
}

}  // namespace

std::string line_chart_svg(const LineChart& chart) {
  std::vector<double> xs, ys;
  for (const ChartSeries& s : chart.series)
    for (const ChartPoint& p : s.points) {
      xs.push_back(p.x);
      ys.push_back(p.y);
      for (const double v : {p.low, p.high})
        if (std::isfinite(v) && (!chart.y.log || v > 0)) ys.push_back(v);
    }
  const Scale sx = fit_scale(xs, chart.x.log, chart.x.ticks, kLeft, kWidth - kRight);
  const Scale sy = fit_scale(ys, chart.y.log, chart.y.ticks, kHeight - kBottom, kTop);
  const std::vector<double> xt = chart.x.ticks.empty() ? axis_ticks(sx.low, sx.high, sx.log) : chart.x.ticks;
  const std::vector<double> yt = chart.y.ticks.empty() ? axis_ticks(sy.low, sy.high, sy.log) : chart.y.ticks;

  std::string out = fmt::format(
      "<figure class=\"chart\"><svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {} {}\" width=\"{}\" "
      "height=\"{}\" role=\"img\"><title>{}</title>",
      kWidth, kHeight, kWidth, kHeight, html_escape(chart.title));
  out += text_element(kWidth / 2, 18, chart.title, "middle", " font-size=\"13\" font-weight=\"600\"");
  out += axes_svg(sx, sy, xt, yt, chart.x.label, chart.y.label);
  int left_out = 0;
  for (const ChartSeries& s : chart.series) {
    std::string path, marks;
    for (const ChartPoint& p : s.points) {
      if (!sx.drawable(p.x) || !sy.drawable(p.y)) {
        ++left_out;
        continue;
      }
      const double x = sx(p.x), y = sy(p.y);
      path += fmt::format("{}{:.1f},{:.1f}", path.empty() ? "M" : " L", x, y);
      if (std::isfinite(p.low) && std::isfinite(p.high) && (p.low != p.y || p.high != p.y)) {
        const double y0 = sy(sy.clamp(p.low)), y1 = sy(sy.clamp(p.high));
        marks += fmt::format(
            "<path d=\"M{0:.1f},{1:.1f} L{0:.1f},{2:.1f} M{3:.1f},{1:.1f} L{4:.1f},{1:.1f} M{3:.1f},{2:.1f} "
            "L{4:.1f},{2:.1f}\" stroke=\"{5}\" stroke-width=\"1.2\"/>",
            x, y0, y1, x - 3, x + 3, s.colour);
      }
      marks += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\"><title>{}</title></circle>", x, y,
                           s.colour, html_escape(p.tip));
    }
    out += fmt::format("<g class=\"series\" data-estimator=\"{}\">", html_escape(s.estimator));
    if (s.points.size() > 1 && !path.empty())
      out += fmt::format("<path d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.8\"{}/>", path, s.colour,
                         s.dash.empty() ? "" : " stroke-dasharray=\"" + s.dash + "\"");
    out += marks + "</g>";
  }
  out += "</svg>" + legend_html(chart.series);
  if (left_out > 0)
    out += fmt::format(
        "<figcaption class=\"note\">{} point{} not drawn: zero or undefined on a logarithmic axis "
        "(the tables hold them).</figcaption>",
        left_out, left_out == 1 ? "" : "s");
  return out + "</figure>";
}

namespace {

// Viridis, sampled at six evenly spaced points and interpolated in RGB: perceptually ordered, readable in grey.
std::string viridis(double t) {
  static constexpr std::array<std::array<int, 3>, 6> kStops = {
      {{68, 1, 84}, {65, 68, 135}, {42, 120, 142}, {34, 168, 132}, {122, 209, 81}, {253, 231, 37}}};
  t = std::clamp(std::isfinite(t) ? t : 0.0, 0.0, 1.0) * (kStops.size() - 1);
  const size_t i = std::min(static_cast<size_t>(t), kStops.size() - 2);
  const double f = t - i;
  std::array<int, 3> c{};
  for (int k = 0; k < 3; ++k) c[k] = static_cast<int>(std::lround(kStops[i][k] * (1 - f) + kStops[i + 1][k] * f));
  return fmt::format("#{:02x}{:02x}{:02x}", c[0], c[1], c[2]);
}

}  // namespace

std::string heatmap_svg(const Heatmap& map) {
  double low = std::numeric_limits<double>::infinity(), high = -low;
  for (const HeatCell& c : map.cells)
    if (std::isfinite(c.value)) {
      low = std::min(low, c.value);
      high = std::max(high, c.value);
    }
  const bool any = low <= high, log = any && low > 0 && high > 10 * low;
  const auto position = [&](double v) {
    if (!any || high == low) return 0.5;
    return log ? std::log(v / low) / std::log(high / low) : (v - low) / (high - low);
  };
  const double cell = std::clamp(440.0 / std::max({map.cols, map.rows, 1}), 6.0, 36.0);
  const double left = 46, top = 54, grid_w = cell * map.cols, grid_h = cell * map.rows;
  const double width = std::max(left + grid_w + 90, 12 + 7.0 * static_cast<double>(map.title.size())),
               height = top + grid_h + 40;
  std::string out = fmt::format(
      "<figure class=\"heatmap\" data-estimator=\"{}\"><svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {:.0f} "
      "{:.0f}\" width=\"{:.0f}\" height=\"{:.0f}\" role=\"img\"><title>{}</title>",
      html_escape(map.estimator), width, height, width, height, html_escape(map.title));
  out += text_element(4, 14, map.title, "start", " font-size=\"12\" font-weight=\"600\"");
  out += "<g font-size=\"10\" fill=\"#333\">";
  const int label_every = std::max(1, static_cast<int>(std::ceil(14 / cell)));
  for (int c = 0; c < map.cols; c += label_every)
    out += text_element(left + (c + 0.5) * cell, top - 5, std::to_string(c), "middle");
  for (int r = 0; r < map.rows; r += label_every)
    out += text_element(left - 4, top + (r + 0.5) * cell + 3.5, std::to_string(r), "end");
  out += text_element(left + grid_w / 2, top - 19, map.col_axis, "middle");
  out += fmt::format("<text transform=\"translate(14,{:.1f}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
                     top + grid_h / 2, html_escape(map.row_axis));
  out += "</g>";
  out += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"#d9d9d9\"/>", left, top,
                     grid_w, grid_h);
  for (const HeatCell& c : map.cells)
    out += fmt::format(
        "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\"><title>{}</title></rect>",
        left + c.col * cell, top + c.row * cell, cell, cell,
        std::isfinite(c.value) ? viridis(position(c.value)) : "#ff00ff", html_escape(c.tip));
  // The colour bar: its ends are the map's own extremes, labelled, so colours compare within a map only.
  const double bar_x = left + grid_w + 14, bar_h = std::max(grid_h, 60.0);
  out += fmt::format("<defs><linearGradient id=\"{}\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">", html_escape(map.id));
  for (int k = 0; k <= 10; ++k)
    out += fmt::format("<stop offset=\"{:.1f}\" stop-color=\"{}\"/>", k / 10.0, viridis(k / 10.0));
  out += "</linearGradient></defs>";
  out += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"10\" height=\"{:.1f}\" fill=\"url(#{})\"/>", bar_x, top,
                     bar_h, html_escape(map.id));
  if (any) {
    out += text_element(bar_x + 14, top + 8, tick_label(high), "start", " font-size=\"10\"");
    out += text_element(bar_x + 14, top + bar_h, tick_label(low), "start", " font-size=\"10\"");
    out += text_element(bar_x + 14, top + bar_h / 2 + 3, log ? "log" : "linear", "start",
                        " font-size=\"9\" fill=\"#777\"");
  }
  return out + "</svg></figure>";
}

std::string bar_chart_svg(const BarChart& chart) {
  double high = 0;
  for (const BarRow& r : chart.rows)
    for (const double v : r.values)
      if (std::isfinite(v)) high = std::max(high, v);
  const size_t parts = std::max<size_t>(chart.parts.size(), 1);
  const double bar = 9, group = bar * parts + 8, left = 220, right = 30, top = 30;
  const double height = top + group * chart.rows.size() + 44, plot_w = kWidth - left - right;
  const Scale sx{.low = 0, .high = high > 0 ? high * 1.05 : 1, .log = false, .from = left, .to = left + plot_w};
  const Scale sy{.low = 0, .high = 1, .log = false, .from = height - 44, .to = top};
  std::string out = fmt::format(
      "<figure class=\"chart\"><svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {} {:.0f}\" width=\"{}\" "
      "height=\"{:.0f}\" role=\"img\"><title>{}</title>",
      kWidth, height, kWidth, height, html_escape(chart.title));
  out += text_element(kWidth / 2, 18, chart.title, "middle", " font-size=\"13\" font-weight=\"600\"");
  out += axes_svg(sx, sy, axis_ticks(sx.low, sx.high, false), {}, chart.axis, "");
  for (size_t i = 0; i < chart.rows.size(); ++i) {
    const BarRow& r = chart.rows[i];
    const double y0 = top + i * group + 4;
    out += fmt::format("<g class=\"series\" data-estimator=\"{}\"><title>{}</title>", html_escape(r.estimator),
                       html_escape(r.tip));
    out += text_element(left - 6, y0 + bar * parts / 2 + 4, r.label, "end", " font-size=\"11\"");
    for (size_t k = 0; k < r.values.size(); ++k) {
      const double v = std::isfinite(r.values[k]) ? r.values[k] : 0;
      out += fmt::format(
          "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\" fill-opacity=\"{}\"/>", left,
          y0 + k * bar, sx(v) - left, bar - 1, r.colour, k == 0 ? "1" : "0.45");
    }
    out += "</g>";
  }
  out += "</svg><div class=\"legend\">";
  for (size_t k = 0; k < chart.parts.size(); ++k)
    out += fmt::format("<span><i style=\"background:#555;opacity:{}\"></i>{}</span>", k == 0 ? "1" : "0.45",
                       html_escape(chart.parts[k]));
  return out + "</div></figure>";
}

}  // namespace attnprobe
