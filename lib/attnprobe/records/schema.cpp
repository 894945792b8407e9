#include "attnprobe/records/schema.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"

namespace attnprobe {

std::optional<Coordinate> Coordinate::parse(const std::string& text) {
  if (text == "all") return Coordinate::all();
  int64_t v;
  if (!parse_int(text, v) || v < 0) return std::nullopt;
  return Coordinate(v);
}

namespace {

int64_t to_int(const std::string& text) {
  int64_t v;
  if (!parse_int(text, v)) throw std::invalid_argument("not an integer");
  return v;
}

uint64_t to_seed(const std::string& text) {
  uint64_t v = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end) throw std::invalid_argument("not a seed (an integer 0..2^64-1)");
  return v;
}

// The shortest text that round-trips the double exactly (docs/csv.md: at least 9 digits), with
// nan and ±inf spelled out.
double to_real(const std::string& text) {
  if (text == "nan") return std::numeric_limits<double>::quiet_NaN();
  if (text == "inf") return std::numeric_limits<double>::infinity();
  if (text == "-inf") return -std::numeric_limits<double>::infinity();
  double v;
  if (!parse_real(text, v)) throw std::invalid_argument("not a number");
  return v;
}

Coordinate to_coordinate(const std::string& text) {
  const auto c = Coordinate::parse(text);
  if (!c) throw std::invalid_argument("not a non-negative integer or 'all'");
  return *c;
}

using KeyColumn = Column<CaseKey>;

}  // namespace

const std::vector<KeyColumn>& case_key_columns() {
  static const std::vector<KeyColumn> kColumns = {
      {"dump", [](const CaseKey& k) { return k.dump; }, [](CaseKey& k, const std::string& t) { k.dump = t; }},
      {"layer", [](const CaseKey& k) { return k.layer.text(); },
       [](CaseKey& k, const std::string& t) { k.layer = to_coordinate(t); }},
      {"head", [](const CaseKey& k) { return k.head.text(); },
       [](CaseKey& k, const std::string& t) { k.head = to_coordinate(t); }},
      {"batch", [](const CaseKey& k) { return k.batch.text(); },
       [](CaseKey& k, const std::string& t) { k.batch = to_coordinate(t); }},
      {"n", [](const CaseKey& k) { return k.n.text(); },
       [](CaseKey& k, const std::string& t) { k.n = to_coordinate(t); }},
      {"p", [](const CaseKey& k) { return std::to_string(k.p); },
       [](CaseKey& k, const std::string& t) { k.p = to_int(t); }},
      {"mask", [](const CaseKey& k) { return mask_text(k.mask, k.window); },
       [](CaseKey& k, const std::string& t) {
         const auto mask = parse_mask(t);
         if (!mask) throw std::invalid_argument("not 'full', 'causal' or 'window:W'");
         k.mask = mask->mask;
         k.window = mask->window;
       }},
      {"queries", [](const CaseKey& k) { return query_rows_text(k.queries); },
       [](CaseKey& k, const std::string& t) {
         const auto rows = parse_query_rows(t);
         if (!rows) throw std::invalid_argument("not 'all', 'last:W' or 'dump'");
         k.queries = *rows;
       }},
      {"precision", [](const CaseKey& k) { return std::string(precision_name(k.precision)); },
       [](CaseKey& k, const std::string& t) {
         for (Precision precision : kAllPrecisions)
           if (t == precision_name(precision)) {
             k.precision = precision;
             return;
           }
         throw std::invalid_argument("not 'f64', 'f32', 'bf16' or 'f16'");
       }},
      {"estimator", [](const CaseKey& k) { return k.estimator; },
       [](CaseKey& k, const std::string& t) { k.estimator = t; }},
      {"spec", [](const CaseKey& k) { return k.spec; }, [](CaseKey& k, const std::string& t) { k.spec = t; }},
      {"samples", [](const CaseKey& k) { return k.samples ? std::to_string(*k.samples) : std::string(); },
       [](CaseKey& k, const std::string& t) { k.samples = t.empty() ? std::nullopt : std::optional(to_int(t)); }},
      {"reference", [](const CaseKey& k) { return k.reference; },
       [](CaseKey& k, const std::string& t) { k.reference = t; }},
  };
  return kColumns;
}

namespace {

template <class Row>
Column<Row> real_column(std::string name, double Row::*field) {
  return {std::move(name), [field](const Row& r) { return format_real(r.*field); },
          [field](Row& r, const std::string& t) { r.*field = to_real(t); }};
}

}  // namespace

const std::vector<Column<TrialRow>>& trial_columns() {
  static const std::vector<Column<TrialRow>> kColumns = [] {
    std::vector<Column<TrialRow>> c = lifted_key_columns<TrialRow>();
    c.push_back({"trial", [](const TrialRow& r) { return std::to_string(r.trial); },
                 [](TrialRow& r, const std::string& t) { r.trial = to_int(t); }});
    c.push_back({"seed", [](const TrialRow& r) { return std::to_string(r.seed); },
                 [](TrialRow& r, const std::string& t) { r.seed = to_seed(t); }});
    c.push_back({"metric", [](const TrialRow& r) { return r.metric; },
                 [](TrialRow& r, const std::string& t) { r.metric = t; }});
    c.push_back(real_column("value", &TrialRow::value));
    return c;
  }();
  return kColumns;
}

const std::vector<Column<SummaryRow>>& summary_columns() {
  static const std::vector<Column<SummaryRow>> kColumns = [] {
    std::vector<Column<SummaryRow>> c = lifted_key_columns<SummaryRow>();
    c.push_back({"metric", [](const SummaryRow& r) { return r.metric; },
                 [](SummaryRow& r, const std::string& t) { r.metric = t; }});
    c.push_back({"count", [](const SummaryRow& r) { return std::to_string(r.count); },
                 [](SummaryRow& r, const std::string& t) { r.count = to_int(t); }});
    c.push_back(real_column("mean", &SummaryRow::mean));
    c.push_back(real_column("std", &SummaryRow::std));
    c.push_back(real_column("stderr", &SummaryRow::stderr_));
    c.push_back(real_column("median", &SummaryRow::median));
    c.push_back(real_column("min", &SummaryRow::min));
    c.push_back(real_column("max", &SummaryRow::max));
    return c;
  }();
  return kColumns;
}

namespace {

CaseKey slice_key(const DiagnosticRow& r) {
  return CaseKey{.dump = r.dump,
                 .layer = r.layer,
                 .head = r.head,
                 .batch = r.batch,
                 .n = r.n,
                 .p = r.p,
                 .mask = r.mask,
                 .window = r.window,
                 .queries = r.queries};
}

void set_slice(DiagnosticRow& r, const CaseKey& k) {
  r.dump = k.dump;
  r.layer = k.layer;
  r.head = k.head;
  r.batch = k.batch;
  r.n = k.n;
  r.p = k.p;
  r.mask = k.mask;
  r.window = k.window;
  r.queries = k.queries;
}

}  // namespace

const std::vector<Column<DiagnosticRow>>& diagnostic_columns() {
  // The slice columns reuse the case key's text forms and parsers, so they cannot drift apart.
  static const std::vector<Column<DiagnosticRow>> kColumns = [] {
    std::vector<Column<DiagnosticRow>> c;
    for (const KeyColumn& k : case_key_columns()) {
      // dump, layer, head, batch, n, p, mask, queries: diagnostics describe the case's rows in float64, not an
      // estimator or a precision
      if (k.name == "precision") break;
      c.push_back({k.name, [get = k.get](const DiagnosticRow& r) { return get(slice_key(r)); },
                   [set = k.set](DiagnosticRow& r, const std::string& t) {
                     CaseKey key = slice_key(r);
                     set(key, t);
                     set_slice(r, key);
                   }});
    }
    c.push_back({"diagnostic", [](const DiagnosticRow& r) { return r.diagnostic; },
                 [](DiagnosticRow& r, const std::string& t) { r.diagnostic = t; }});
    c.push_back(real_column("value", &DiagnosticRow::value));
    return c;
  }();
  return kColumns;
}

namespace {
// Each earlier layout is the current one without the columns added since (docs/csv.md): before `precision`, before
// `queries` too, and before `mask` too.
template <class Row>
std::vector<std::vector<Column<Row>>> layouts_of(const std::vector<Column<Row>>& current) {
  const std::vector<Column<Row>> before_precision = without_column(current, "precision");
  const std::vector<Column<Row>> before_queries = without_column(before_precision, "queries");
  return {current, before_precision, before_queries, without_column(before_queries, "mask")};
}
}  // namespace

const std::vector<std::vector<Column<TrialRow>>>& trial_layouts() {
  static const auto kLayouts = layouts_of(trial_columns());
  return kLayouts;
}

const std::vector<std::vector<Column<SummaryRow>>>& summary_layouts() {
  static const auto kLayouts = layouts_of(summary_columns());
  return kLayouts;
}

template <class Row>
void parse_row(const std::vector<Column<Row>>& columns, const std::vector<std::string>& fields,
               const std::string& where, Row& row) {
  if (fields.size() != columns.size())
    throw InputError(fmt::format("{}: {} fields where the header has {}", where, fields.size(), columns.size()));
  for (size_t i = 0; i < columns.size(); ++i) {
    try {
      columns[i].set(row, fields[i]);
    } catch (const std::invalid_argument& e) {
      throw InputError(fmt::format("{}: column {} is '{}', {}", where, columns[i].name, fields[i], e.what()));
    }
  }
}

template void parse_row(const std::vector<Column<TrialRow>>&, const std::vector<std::string>&, const std::string&,
                        TrialRow&);
template void parse_row(const std::vector<Column<SummaryRow>>&, const std::vector<std::string>&, const std::string&,
                        SummaryRow&);
template void parse_row(const std::vector<Column<DiagnosticRow>>&, const std::vector<std::string>&, const std::string&,
                        DiagnosticRow&);

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n\r") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::vector<std::string> parse_csv_line(const std::string& line) {
  std::vector<std::string> fields;
  std::string field;
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (quoted) {
      if (c == '"') {
        if (i + 1 < line.size() && line[i + 1] == '"') {
          field += '"';
          ++i;
        } else {
          quoted = false;
        }
      } else {
        field += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      fields.push_back(std::move(field));
      field.clear();
    } else if (c != '\r') {
      field += c;
    }
  }
  if (quoted) throw InputError("unterminated quote");
  fields.push_back(std::move(field));
  return fields;
}

}  // namespace attnprobe
