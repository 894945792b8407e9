#include "attnprobe/records/csv.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"

namespace attnprobe {

const char* const kTrialHeader = "dump,layer,head,batch,n,p,estimator,spec,samples,reference,trial,seed,metric,value";
const char* const kSummaryHeader =
    "dump,layer,head,batch,n,p,estimator,spec,samples,reference,metric,count,mean,std,stderr,median,min,max";

namespace {

constexpr size_t kKeyColumns = 10;

std::string format_key(const CaseKey& k) {
  return fmt::format("{},{},{},{},{},{},{},{},{},{}", csv_field(k.dump), k.layer, k.head, k.batch, k.n, k.p,
                     csv_field(k.estimator), csv_field(k.spec), k.samples, csv_field(k.reference));
}

// The shortest text that round-trips the double exactly (DESIGN.md §5 asks for at least 9 digits).
std::string number(double v) { return format_real(v); }

CaseKey parse_key(const std::vector<std::string>& f, const std::string& where) {
  CaseKey k;
  k.dump = f[0];
  k.layer = f[1];
  k.head = f[2];
  k.batch = f[3];
  k.n = f[4];
  int64_t p;
  if (!parse_int(f[5], p)) throw InputError(fmt::format("{}: column p is '{}', not an integer", where, f[5]));
  k.p = p;
  k.estimator = f[6];
  k.spec = f[7];
  k.samples = f[8];
  k.reference = f[9];
  return k;
}

double parse_number(const std::string& text, const std::string& column, const std::string& where) {
  double v;
  if (text == "nan") return std::numeric_limits<double>::quiet_NaN();
  if (text == "inf") return std::numeric_limits<double>::infinity();
  if (text == "-inf") return -std::numeric_limits<double>::infinity();
  if (!parse_real(text, v)) throw InputError(fmt::format("{}: column {} is '{}', not a number", where, column, text));
  return v;
}

int64_t parse_integer(const std::string& text, const std::string& column, const std::string& where) {
  int64_t v;
  if (!parse_int(text, v)) throw InputError(fmt::format("{}: column {} is '{}', not an integer", where, column, text));
  return v;
}

}  // namespace

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

std::string format_trial_row(const TrialRow& r) {
  return fmt::format("{},{},{},{},{}\n", format_key(r.key), r.trial, r.seed, r.metric, number(r.value));
}

std::string format_summary_row(const SummaryRow& r) {
  return fmt::format("{},{},{},{},{},{},{},{},{}\n", format_key(r.key), r.metric, r.count, number(r.mean),
                     number(r.std), number(r.stderr_), number(r.median), number(r.min), number(r.max));
}

TrialCsvWriter::TrialCsvWriter(const std::string& path, bool append) : path_(path) {
  bool need_header = true;
  if (append && std::filesystem::exists(path) && std::filesystem::file_size(path) > 0) {
    std::ifstream in(path);
    std::string first;
    std::getline(in, first);
    if (!first.empty() && first.back() == '\r') first.pop_back();
    if (first != kTrialHeader)
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
    std::fprintf(file_, "%s\n", kTrialHeader);
    std::fflush(file_);
  }
}

TrialCsvWriter::~TrialCsvWriter() {
  if (file_) std::fclose(file_);
}

void TrialCsvWriter::write(const std::vector<TrialRow>& rows) {
  std::string block;
  for (const TrialRow& r : rows) block += format_trial_row(r);
  if (std::fwrite(block.data(), 1, block.size(), file_) != block.size() || std::fflush(file_) != 0)
    throw InputError(fmt::format("writing '{}' failed: {} (disk full?)", path_, std::strerror(errno)));
}

CsvContents read_csv(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("cannot read '{}': {}", path, std::strerror(errno)));
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  CsvContents out;
  size_t pos = 0, line_no = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) {  // an interrupted write: ignore the partial line
      out.truncated_tail = true;
      break;
    }
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line_no == 1) {
      if (line == kTrialHeader)
        out.summary = false;
      else if (line == kSummaryHeader)
        out.summary = true;
      else
        throw InputError(fmt::format("'{}' is not an attnprobe CSV: its header is not\n  {}\nnor\n  {}", path,
                                     kTrialHeader, kSummaryHeader));
      continue;
    }
    if (line.empty()) continue;
    const std::string where = fmt::format("'{}' line {}", path, line_no);
    std::vector<std::string> f;
    try {
      f = parse_csv_line(line);
    } catch (const InputError& e) {
      throw InputError(fmt::format("{}: {}", where, e.what()));
    }
    const size_t expected = out.summary ? kKeyColumns + 8 : kKeyColumns + 4;
    if (f.size() != expected)
      throw InputError(fmt::format("{}: {} fields where the header has {}", where, f.size(), expected));
    if (out.summary) {
      SummaryRow r;
      r.key = parse_key(f, where);
      r.metric = f[10];
      r.count = parse_integer(f[11], "count", where);
      r.mean = parse_number(f[12], "mean", where);
      r.std = parse_number(f[13], "std", where);
      r.stderr_ = parse_number(f[14], "stderr", where);
      r.median = parse_number(f[15], "median", where);
      r.min = parse_number(f[16], "min", where);
      r.max = parse_number(f[17], "max", where);
      out.summaries.push_back(std::move(r));
    } else {
      TrialRow r;
      r.key = parse_key(f, where);
      r.trial = parse_integer(f[10], "trial", where);
      r.seed = static_cast<uint64_t>(parse_integer(f[11], "seed", where));
      r.metric = f[12];
      r.value = parse_number(f[13], "value", where);
      out.trials.push_back(std::move(r));
    }
  }
  if (line_no == 0) throw InputError(fmt::format("'{}' is empty: it has no CSV header", path));
  return out;
}

void rewrite_trial_csv(const std::string& path, const std::vector<TrialRow>& rows) {
  const std::string temp = path + ".tmp";
  {
    TrialCsvWriter writer(temp, false);
    writer.write(rows);
  }
  std::error_code ec;
  std::filesystem::rename(temp, path, ec);
  if (ec) throw InputError(fmt::format("cannot replace '{}': {}", path, ec.message()));
}

}  // namespace attnprobe
