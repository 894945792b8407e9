#pragma once
// The one definition of the long CSV schema (docs/csv.md): each column's name, how a row gives its
// text, and how its text sets a row. The header, the row writer and the row reader of both layouts
// (trial and summary) are driven by these tables, so a column is added in one place.
#include <functional>
#include <string>
#include <vector>

#include "attnprobe/records/record.h"

namespace attnprobe {

template <class Row>
struct Column {
  std::string name;
  std::function<std::string(const Row&)> get;  ///< the field's text (unquoted; the writer quotes)
  /// Parses the text into the row; throws std::invalid_argument with a short reason when malformed.
  std::function<void(Row&, const std::string&)> set;
};

/// dump,layer,head,batch,n,p,mask,queries,estimator,spec,samples,reference: the case key, shared by every layout.
const std::vector<Column<CaseKey>>& case_key_columns();

/// The case-key columns as columns of a row type that holds a `key`; `skip` names columns to leave out.
template <class Row>
std::vector<Column<Row>> lifted_key_columns(const std::vector<std::string>& skip = {}) {
  std::vector<Column<Row>> columns;
  for (const Column<CaseKey>& c : case_key_columns()) {
    bool skipped = false;
    for (const std::string& name : skip) skipped = skipped || name == c.name;
    if (skipped) continue;
    columns.push_back({c.name, [get = c.get](const Row& r) { return get(r.key); },
                       [set = c.set](Row& r, const std::string& t) { set(r.key, t); }});
  }
  return columns;
}

/// dump,layer,head,batch,n,p,mask,queries,estimator,spec,samples,reference,trial,seed,metric,value
const std::vector<Column<TrialRow>>& trial_columns();
/// dump,layer,head,batch,n,p,mask,queries,estimator,spec,samples,reference,metric,count,mean,std,stderr,median,min,max
const std::vector<Column<SummaryRow>>& summary_columns();

/// Every layout a reader accepts, the current one first, then those written before the `queries` column (read
/// as `all`) and before the `mask` column too (read as `full`; docs/csv.md).
const std::vector<std::vector<Column<TrialRow>>>& trial_layouts();
const std::vector<std::vector<Column<SummaryRow>>>& summary_layouts();

/// A table without the column `name`.
template <class Row>
std::vector<Column<Row>> without_column(std::vector<Column<Row>> columns, const std::string& name) {
  std::erase_if(columns, [&](const Column<Row>& c) { return c.name == name; });
  return columns;
}

/// Quotes a field when it contains a comma, quote or newline (RFC 4180).
std::string csv_field(const std::string& text);

/// The header line (without newline) of a layout.
template <class Row>
std::string csv_header(const std::vector<Column<Row>>& columns) {
  std::string out;
  for (const Column<Row>& c : columns) out += (out.empty() ? "" : ",") + c.name;
  return out;
}

/// One CSV line (with newline) of a row: every column's text, quoted where needed.
template <class Row>
std::string csv_line(const std::vector<Column<Row>>& columns, const Row& row) {
  std::string out;
  for (size_t i = 0; i < columns.size(); ++i) {
    if (i) out += ',';
    out += csv_field(columns[i].get(row));
  }
  out += '\n';
  return out;
}

/// A whole CSV text: the header, then one line per row.
template <class Row>
std::string csv_text(const std::vector<Column<Row>>& columns, const std::vector<Row>& rows) {
  std::string text = csv_header(columns) + "\n";
  for (const Row& r : rows) text += csv_line(columns, r);
  return text;
}

/// dump,layer,head,batch,n,p,mask,queries,diagnostic,value: the head diagnostics of `attnprobe diagnose`
const std::vector<Column<DiagnosticRow>>& diagnostic_columns();

/// Sets every column of `row` from `fields` (in the table's order). Throws InputError naming
/// `where` and the column on a malformed field.
template <class Row>
void parse_row(const std::vector<Column<Row>>& columns, const std::vector<std::string>& fields,
               const std::string& where, Row& row);

/// Splits one CSV line into fields (RFC 4180 quoting); throws InputError on a broken quote.
std::vector<std::string> parse_csv_line(const std::string& line);

}  // namespace attnprobe
