#pragma once
// Reading and writing the long CSV files (columns: schema.h). Writing is append-only and
// crash-safe at row-block granularity: a block of rows is formatted in memory, written with one
// call and flushed, so an interrupted run leaves only whole blocks; the reader ignores a final
// unterminated line and says so.
#include <cstdio>
#include <string>
#include <vector>

#include "attnprobe/records/schema.h"

namespace attnprobe {

/// Appends trial rows to a CSV file, writing the header when the file is new or empty.
class TrialCsvWriter {
 public:
  /// append=false truncates. Throws InputError if the file cannot be opened or (when appending)
  /// its header is not the trial header.
  TrialCsvWriter(const std::string& path, bool append);
  ~TrialCsvWriter();
  TrialCsvWriter(const TrialCsvWriter&) = delete;
  TrialCsvWriter& operator=(const TrialCsvWriter&) = delete;
  /// Writes all rows with one write and flushes.
  void write(const std::vector<TrialRow>& rows);
  /// Writes rows already formatted as CSV lines (csv_line) with one write and flushes.
  void write_text(const std::string& lines);

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

/// A parsed CSV file of either layout.
struct CsvContents {
  bool summary = false;  ///< true for a summary file
  std::vector<TrialRow> trials;
  std::vector<SummaryRow> summaries;
  bool truncated_tail = false;  ///< the file ended in an unterminated (partial) line, ignored
  /// Where each row came from ("'f.csv' line 7", "new row 3"), in the order of trials or summaries;
  /// errors about a row name it. May be empty (then errors name the case only).
  std::vector<std::string> row_places;
};

/// Reads a trial or summary CSV. Throws InputError naming the file and line on malformed rows, and on a
/// negative value of a metric attnprobe computes (require_possible_values).
CsvContents read_csv(const std::string& path);

/// Reads the head diagnostics `attnprobe diagnose` writes. Throws InputError naming the file (and line) when it is
/// missing, has another header, a malformed row, or a value that is not finite; a final unterminated line is ignored.
std::vector<DiagnosticRow> read_diagnostics_csv(const std::string& path);

/// Every metric attnprobe computes is ≥ 0 (an error, a fraction, an angle), or NaN/+inf: a negative value
/// of one (a trial's value; a summary's mean, median, min or max) is a damaged or hand-edited file, refused
/// (InputError naming `where`) so that merge, summarize, check and --resume never carry it on, in the CLI
/// and the Python package alike. A metric name attnprobe does not compute (a team's own) is not checked.
void require_possible_values(const std::string& where, const TrialRow& row);
void require_possible_values(const std::string& where, const SummaryRow& row);

/// The text of a whole trial or summary CSV, header included.
std::string trial_csv_text(const std::vector<TrialRow>& rows);
std::string summary_csv_text(const std::vector<SummaryRow>& rows);

/// Rewrites `path` atomically with exactly these trial rows.
void rewrite_trial_csv(const std::string& path, const std::vector<TrialRow>& rows);

}  // namespace attnprobe
