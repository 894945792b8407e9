#pragma once
// Reading and writing the long CSV files. Writing is append-only and crash-safe at row-block
// granularity: a block of rows is formatted in memory, written with one call and flushed, so an
// interrupted run leaves only whole blocks; the reader ignores a final unterminated line.
#include <cstdio>
#include <string>
#include <vector>

#include "attnprobe/records/record.h"

namespace attnprobe {

extern const char* const kTrialHeader;    ///< dump,layer,...,metric,value
extern const char* const kSummaryHeader;  ///< dump,layer,...,metric,count,mean,...

/// Quotes a field when it contains a comma, quote or newline (RFC 4180).
std::string csv_field(const std::string& text);
/// Splits one CSV line into fields (RFC 4180 quoting); throws InputError on a broken quote.
std::vector<std::string> parse_csv_line(const std::string& line);

std::string format_trial_row(const TrialRow& row);
std::string format_summary_row(const SummaryRow& row);

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

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

/// A parsed CSV file of either kind.
struct CsvContents {
  bool summary = false;  ///< true for a summary file (kSummaryHeader)
  std::vector<TrialRow> trials;
  std::vector<SummaryRow> summaries;
  bool truncated_tail = false;  ///< the file ended in an unterminated (partial) line, ignored
};

/// Reads a trial or summary CSV. Throws InputError naming the file and line on malformed rows.
CsvContents read_csv(const std::string& path);

/// Rewrites `path` atomically (temp file + rename) with exactly these trial rows.
void rewrite_trial_csv(const std::string& path, const std::vector<TrialRow>& rows);

}  // namespace attnprobe
