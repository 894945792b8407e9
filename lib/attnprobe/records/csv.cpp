#include "attnprobe/records/csv.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "attnprobe/common/atomic_file.h"
#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"
#include "attnprobe/metrics/catalogue.h"

namespace attnprobe {

TrialCsvWriter::TrialCsvWriter(const std::string& path, bool append) : path_(path) {
  bool need_header = true;
  if (append && std::filesystem::exists(path) && std::filesystem::file_size(path) > 0) {
    std::ifstream in(path);
    std::string first;
    std::getline(in, first);
    if (!first.empty() && first.back() == '\r') first.pop_back();
    for (size_t i = 1; i < trial_layouts().size(); ++i)
      if (first == csv_header(trial_layouts()[i]))
        throw InputError(
            fmt::format("'{}' was written by an older attnprobe (its columns lack some of today's); attnprobe "
                        "still reads it, but will not append rows of the new layout to it. Write the rest of the "
                        "sweep to another -o file (the two files summarize and merge together).",
                        path));
    if (first != csv_header(trial_columns()))
      throw InputError(
          fmt::format("'{}' is not an attnprobe trial CSV (its header differs); refusing to append. "
                      "Choose another -o file.",
                      path));
    need_header = false;
  }
  file_ = std::fopen(path.c_str(), append ? "ab" : "wb");
  if (!file_)
    throw InputError(fmt::format("cannot write '{}': {}. Check that the folder exists and is writable.", path,
                                 std::strerror(errno)));
  if (need_header) {
    const std::string header = csv_header(trial_columns()) + "\n";
    if (std::fwrite(header.data(), 1, header.size(), file_) != header.size() || std::fflush(file_) != 0)
      throw InputError(fmt::format("writing '{}' failed: {} (disk full?)", path_, std::strerror(errno)));
  }
}

TrialCsvWriter::~TrialCsvWriter() {
  if (file_) std::fclose(file_);
}

void TrialCsvWriter::write(const std::vector<TrialRow>& rows) {
  std::string block;
  for (const TrialRow& r : rows) block += csv_line(trial_columns(), r);
  write_text(block);
}

void TrialCsvWriter::write_text(const std::string& block) {
  if (std::fwrite(block.data(), 1, block.size(), file_) != block.size() || std::fflush(file_) != 0)
    throw InputError(fmt::format("writing '{}' failed: {} (disk full?)", path_, std::strerror(errno)));
}

namespace {
void require_possible_value(const std::string& where, const std::string& metric, std::string_view column,
                            double value) {
  if (!(value < 0) || !find_metric(metric)) return;
  throw InputError(fmt::format(
      "{}: {} of metric {} is {}, but {} is never negative. The file is damaged or was edited by hand: restore it, "
      "or delete that line and rerun the sweep that wrote it with --resume (it recomputes the missing row).",
      where, column, metric, format_real(value), metric));
}
}  // namespace

void require_possible_values(const std::string& where, const TrialRow& row) {
  require_possible_value(where, row.metric, "value", row.value);
}

void require_possible_values(const std::string& where, const SummaryRow& row) {
  for (const auto& [column, value] : {std::pair{"mean", row.mean}, std::pair{"median", row.median},
                                      std::pair{"min", row.min}, std::pair{"max", row.max}})
    require_possible_value(where, row.metric, column, value);
}

namespace {

std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("cannot read '{}': {}", path, std::strerror(errno)));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

struct CsvRecord {
  size_t line_no = 0;  ///< the line it starts on (1-based)
  std::string text;    ///< without its newline and a trailing CR
};

// The complete records of a CSV text: a record ends at the first newline outside quotes (a quoted field, a dump
// named with a newline, may span lines, as the writer's csv_field quotes it). A final record without its newline is
// an interrupted write: left out, and `truncated` set.
std::vector<CsvRecord> csv_records(const std::string& text, bool& truncated) {
  std::vector<CsvRecord> records;
  size_t pos = 0, next_line = 1;
  truncated = false;
  while (pos < text.size()) {
    size_t end = pos;
    for (bool quoted = false; end < text.size() && (quoted || text[end] != '\n'); ++end)
      if (text[end] == '"') quoted = !quoted;
    if (end == text.size()) {
      truncated = true;
      break;
    }
    CsvRecord record{next_line, text.substr(pos, end - pos)};
    pos = end + 1;
    next_line += 1 + static_cast<size_t>(std::count(record.text.begin(), record.text.end(), '\n'));
    if (!record.text.empty() && record.text.back() == '\r') record.text.pop_back();
    records.push_back(std::move(record));
  }
  return records;
}

std::vector<std::string> record_fields(const std::string& line, const std::string& where) {
  try {
    return parse_csv_line(line);
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: {}", where, e.what()));
  }
}

}  // namespace

CsvContents read_csv(const std::string& path) {
  const std::string text = read_whole_file(path);
  const std::string trial_header = csv_header(trial_columns()), summary_header = csv_header(summary_columns());
  // Files written before the `mask` or `queries` column existed are read as `full` and `all` (docs/csv.md).
  const std::vector<Column<TrialRow>>* trial_layout = &trial_columns();
  const std::vector<Column<SummaryRow>>* summary_layout = &summary_columns();
  CsvContents out;
  const std::vector<CsvRecord> records = csv_records(text, out.truncated_tail);
  for (const CsvRecord& record : records) {
    const std::string& line = record.text;
    if (record.line_no == 1) {
      bool known = false;
      for (const auto& layout : trial_layouts())
        if (!known && line == csv_header(layout)) {
          known = true;
          out.summary = false;
          trial_layout = &layout;
        }
      for (const auto& layout : summary_layouts())
        if (!known && line == csv_header(layout)) {
          known = true;
          out.summary = true;
          summary_layout = &layout;
        }
      if (!known)
        throw InputError(fmt::format("'{}' is not an attnprobe CSV: its header is not\n  {}\nnor\n  {}", path,
                                     trial_header, summary_header));
      continue;
    }
    if (line.empty()) continue;
    const std::string where = fmt::format("'{}' line {}", path, record.line_no);
    const std::vector<std::string> fields = record_fields(line, where);
    if (out.summary) {
      parse_row(*summary_layout, fields, where, out.summaries.emplace_back());
      require_possible_values(where, out.summaries.back());
    } else {
      parse_row(*trial_layout, fields, where, out.trials.emplace_back());
      require_possible_values(where, out.trials.back());
    }
    out.row_places.push_back(where);
  }
  if (records.empty())
    throw InputError(text.empty() ? fmt::format("'{}' is empty: it has no CSV header", path)
                                  : fmt::format("'{}' has no complete line ({} bytes without a newline): it is not an "
                                                "attnprobe CSV, or its first write was cut off",
                                                path, text.size()));
  return out;
}

std::vector<DiagnosticRow> read_diagnostics_csv(const std::string& path) {
  const std::string header = csv_header(diagnostic_columns());
  bool truncated = false;  // a final line without its newline is a cut-off write, ignored as read_csv does
  const std::vector<CsvRecord> records = csv_records(read_whole_file(path), truncated);
  if (records.empty()) throw InputError(fmt::format("'{}' has no complete line: it is not a diagnostics CSV", path));
  std::vector<DiagnosticRow> rows;
  for (const CsvRecord& record : records) {
    if (record.line_no == 1) {
      if (record.text != header)
        throw InputError(fmt::format("'{}' is not a diagnostics CSV of `attnprobe diagnose`: its header is not\n  {}",
                                     path, header));
      continue;
    }
    if (record.text.empty()) continue;
    const std::string where = fmt::format("'{}' line {}", path, record.line_no);
    parse_row(diagnostic_columns(), record_fields(record.text, where), where, rows.emplace_back());
    if (!std::isfinite(rows.back().value))
      throw InputError(fmt::format("{}: the diagnostic {} is {}, not a finite number", where, rows.back().diagnostic,
                                   format_real(rows.back().value)));
  }
  return rows;
}

std::string trial_csv_text(const std::vector<TrialRow>& rows) { return csv_text(trial_columns(), rows); }
std::string summary_csv_text(const std::vector<SummaryRow>& rows) { return csv_text(summary_columns(), rows); }

void rewrite_trial_csv(const std::string& path, const std::vector<TrialRow>& rows) {
  write_file_atomically(path, trial_csv_text(rows));
}

}  // namespace attnprobe
