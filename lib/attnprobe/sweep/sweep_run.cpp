#include "attnprobe/sweep/sweep_run.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "attnprobe/common/error.h"
#include "attnprobe/common/output_paths.h"
#include "attnprobe/common/text.h"
#include "attnprobe/metrics/catalogue.h"
#include "attnprobe/records/csv.h"
#include "attnprobe/report/summary.h"
#include "attnprobe/sweep/merge.h"

namespace attnprobe {

namespace {

// run.json of an earlier run, or null when it is missing or unreadable (then only the rows tell).
nlohmann::json read_earlier_info(const std::string& path) {
  std::ifstream in(path);
  if (!in) return nullptr;
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str(), nullptr, false);  // discarded (not thrown) when malformed
}

// The process holding a flock on the file `fd` refers to, from /proc/locks (Linux: "N: FLOCK
// ADVISORY WRITE PID MAJOR:MINOR:INODE 0 EOF", major and minor in hex); 0 when it cannot be told.
long long lock_holder(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return 0;
  const std::string device = fmt::format("{:02x}:{:02x}:{}", major(st.st_dev), minor(st.st_dev), st.st_ino);
  std::ifstream locks("/proc/locks");
  std::string line;
  while (std::getline(locks, line)) {
    std::istringstream fields(line);
    std::string id, kind, mode, access, where;
    long long pid = 0;
    if (fields >> id >> kind >> mode >> access >> pid >> where && kind == "FLOCK" && where == device) return pid;
  }
  return 0;
}

}  // namespace

SweepRun::SweepRun(const Dump& dump, SweepPlan plan, std::string csv_path, OutputMode mode, RunOptions options,
                   RunInfo info)
    : dump_(dump),
      plan_(std::move(plan)),
      csv_path_(std::move(csv_path)),
      info_path_(run_info_path(csv_path_)),
      options_(std::move(options)),
      info_(std::move(info)) {
  namespace fs = std::filesystem;
  require_usage(!csv_path_.empty(), "-o needs a file name");
  require_separate_files({{"the dump", dump_.path()}}, {{"-o", csv_path_}, {"its run.json", info_path_}});
  const fs::path path(csv_path_);
  std::error_code ec;
  if (path.has_parent_path()) {
    fs::create_directories(path.parent_path(), ec);
    require_input(!ec, "cannot create the folder of '{}': {}. Choose an -o path in a folder you can write.", csv_path_,
                  ec.message());
  }
  const fs::file_status status = fs::status(path, ec);
  require_input(!fs::exists(status) || fs::is_regular_file(status), "'{}' is {}, not a CSV file: give -o a file path.",
                csv_path_, fs::is_directory(status) ? "a directory" : "not a regular file (a device, pipe or socket)");
  const bool existed = fs::exists(status);
  lock_output();
  // From here on, a failure removes a CSV this run created (or found empty), so nothing is left over.
  try {
    struct stat st {};
    ::fstat(lock_fd_, &st);
    const bool has_rows = st.st_size > 0;
    if (has_rows && mode == OutputMode::kCreate)
      throw UsageError(
          fmt::format("'{}' already exists: add --resume to continue it (finished trials are kept and "
                      "skipped) or --overwrite to replace it",
                      csv_path_));
    const bool resuming = has_rows && mode == OutputMode::kResume;
    info_.pid = ::getpid();
    std::vector<TrialRow> whole;
    bool rewrite = false;
    if (resuming) {
      const CsvContents old = read_csv(csv_path_);
      if (old.summary)
        throw InputError(fmt::format("'{}' is a summary CSV; --resume needs the trial CSV of a sweep", csv_path_));
      check_resumable(old.trials);
      options_.done = complete_trials(old.trials, plan_.metrics, plan_.recall_k);
      // A row written twice (two runs appended to one file) is kept once, so that summarize and check
      // take the result; two different values of one row cannot both be kept.
      std::map<TrialRowId, double> kept;
      for (const TrialRow& r : old.trials) {
        const TrialRowId id = row_id(r);
        if (!options_.done.count(id.trial)) continue;
        const auto [at, first] = kept.emplace(id, r.value);
        if (first) {
          whole.push_back(r);
          continue;
        }
        require_input(at->second == r.value || (std::isnan(at->second) && std::isnan(r.value)),
                      "--resume of '{}': trial {} of {} appears twice with different values ({} and {}): two runs "
                      "were written into one file. Write to another -o file.",
                      csv_path_, r.trial, case_label(r.key, r.metric), format_real(at->second), format_real(r.value));
      }
      rewrite = whole.size() != old.trials.size() || old.truncated_tail;
      kept_rows_ = static_cast<int64_t>(whole.size());
    }
    // run.json first: when it cannot be written, the CSV has not been touched yet.
    info_.resumed = resuming;
    info_.started = iso_time_now();
    write_run_info(info_path_, info_);
    if (rewrite) replace_csv(whole);
    TrialCsvWriter open_output(csv_path_, resuming);  // truncates, or checks the header of, the CSV
  } catch (...) {
    struct stat st {};
    if (!existed || (::fstat(lock_fd_, &st) == 0 && st.st_size == 0)) ::unlink(csv_path_.c_str());
    ::close(lock_fd_);
    lock_fd_ = -1;
    throw;
  }
}

SweepRun::~SweepRun() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the lock
}

void SweepRun::lock_output() {
  // The CSV may be replaced by a rename (a resumed file is rewritten atomically), so after locking,
  // check that the locked file is still the one at the path; if not, lock the new one.
  for (int attempt = 0; attempt < 16; ++attempt) {
    const int fd = ::open(csv_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    require_input(fd >= 0, "cannot write '{}': {}. Check that the folder exists and is writable.", csv_path_,
                  std::strerror(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int error = errno;
      const long long holder = error == EWOULDBLOCK ? lock_holder(fd) : 0;
      ::close(fd);
      if (error != EWOULDBLOCK) throw InputError(fmt::format("cannot lock '{}': {}", csv_path_, std::strerror(error)));
      // /proc/locks names the holder; else run.json (written a moment after the lock is taken).
      const nlohmann::json earlier = read_earlier_info(existing_run_info_path(csv_path_));
      const std::string who = holder > 0 ? fmt::format("process {}", holder)
                              : earlier.is_object() && earlier.contains("pid") && earlier["pid"].is_number_integer()
                                  ? fmt::format("process {}", earlier["pid"].get<long long>())
                                  : std::string("another process");
      throw InputError(
          fmt::format("'{}' is in use by {} (another sweep is writing it). Wait for it to finish, then --resume; "
                      "or write to another -o file.",
                      csv_path_, who));
    }
    struct stat locked {
    }, current{};
    if (::fstat(fd, &locked) == 0 && ::stat(csv_path_.c_str(), &current) == 0 && locked.st_dev == current.st_dev &&
        locked.st_ino == current.st_ino) {
      lock_fd_ = fd;
      return;
    }
    ::close(fd);  // replaced between open and flock: try the new file
  }
  throw InputError(fmt::format("cannot lock '{}': it keeps being replaced by another process", csv_path_));
}

void SweepRun::check_resumable(const std::vector<TrialRow>& rows) const {
  const std::string earlier_path = existing_run_info_path(csv_path_);
  const nlohmann::json earlier = read_earlier_info(earlier_path);
  const std::string command =
      earlier.is_object() && earlier.contains("command_line") && earlier["command_line"].is_array()
          ? fmt::format(" (its command: {})", earlier["command_line"].dump())
          : "";
  // The seed: from run.json, else from the rows' seed column.
  if (earlier.is_object() && earlier.contains("seed") && earlier["seed"].is_number_unsigned())
    require_usage(earlier["seed"].get<uint64_t>() == plan_.seed,
                  "--resume of '{}' with --seed {}, but it was written with --seed {}{}. Resume with the same seed, "
                  "or write to another -o file.",
                  csv_path_, plan_.seed, earlier["seed"].get<uint64_t>(), command);
  for (const TrialRow& r : rows)
    require_usage(r.seed == plan_.seed,
                  "--resume of '{}' with --seed {}, but its rows were written with seed {}. Resume with the same "
                  "seed, or write to another -o file.",
                  csv_path_, plan_.seed, r.seed);
  // The plan record's fingerprint (seed, settings, metrics, units and shard: report/run_info.h).
  const std::string earlier_plan = earlier.is_object() && earlier.contains("plan") && earlier["plan"].is_object() &&
                                           earlier["plan"].contains("fingerprint") &&
                                           earlier["plan"]["fingerprint"].is_string()
                                       ? earlier["plan"]["fingerprint"].get<std::string>()
                                       : std::string();
  if (!earlier_plan.empty() && info_.plan && !info_.plan->fingerprint.empty())
    require_usage(earlier_plan == info_.plan->fingerprint,
                  "--resume of '{}' with another grid: the estimators, samples, lengths, layers, heads, batch items, "
                  "trials, metrics, mask, query rows or precisions differ from the earlier run's{}. Resume with the "
                  "same command, or write "
                  "to another -o file.",
                  csv_path_, command);
  // The dump's contents and how they are read, and the device (its rounding differs): rows of two dumps
  // or devices would be summarized as one run.
  auto earlier_text = [&](const char* field) {
    return earlier.is_object() && earlier.contains(field) && earlier[field].is_string()
               ? earlier[field].get<std::string>()
               : std::string();
  };
  const std::string earlier_dump = earlier_text("dump_fingerprint");
  require_usage(earlier_dump.empty() || info_.dump_fingerprint.empty() || earlier_dump == info_.dump_fingerprint,
                "--resume of '{}': the dump '{}' is not the one the earlier run read (then: {}; now: {}), so its "
                "rows would mix two dumps. Write to another -o file, or --overwrite to start again.",
                csv_path_, dump_.path(), earlier_dump, info_.dump_fingerprint);
  const std::string earlier_device = earlier_text("device");
  require_usage(earlier_device.empty() || earlier_device == info_.device,
                "--resume of '{}' with --device {}, but it was written with --device {}{}: the two devices round "
                "differently, and one file must hold one run's numbers. Resume on {}, or write to another -o file.",
                csv_path_, info_.device, earlier_device, command, earlier_device);
  // Without run.json the rows must pin the grid themselves: a metric or a trial this command does not
  // measure would be kept beside its rows (another --metrics or --trials, mixed into one file).
  if (!earlier.is_object()) {
    std::set<std::string> metrics;
    for (Metric m : plan_.metrics) metrics.insert(metric_name(m, plan_.recall_k));
    std::map<std::pair<std::string, std::string>, int64_t> trials;
    for (const EstimatorSetting& s : plan_.settings) trials[{s.canonical, s.reference}] = s.trials;
    for (const TrialRow& r : rows) {
      require_usage(metrics.count(r.metric),
                    "--resume of '{}' without its run.json ({}): it has rows of the metric {}, which this command "
                    "does not measure (another --metrics?). Resume with the metrics it was written with, or write "
                    "to another -o file.",
                    csv_path_, earlier_path, r.metric);
      const auto it = trials.find({r.key.spec, r.key.reference});
      require_usage(it == trials.end() || r.trial < it->second,
                    "--resume of '{}' without its run.json ({}): it has trial {} of {}, but this command runs {} "
                    "trials (another --trials?). Resume with the trials it was written with, or write to another "
                    "-o file.",
                    csv_path_, earlier_path, r.trial, r.key.spec, it->second);
    }
  }
  // Every row must be a case of this grid (a check that needs no run.json).
  std::set<std::tuple<int64_t, int64_t, int64_t, int64_t, Mask, int64_t, QueryRows, Precision>> slices;
  for (const SliceRef& s : plan_.slices)
    slices.emplace(s.layer, s.head, s.batch, s.n, s.mask, s.window, s.queries, s.precision);
  std::set<std::pair<std::string, std::string>> settings;
  for (const EstimatorSetting& s : plan_.settings) settings.emplace(s.canonical, s.reference);
  const std::string label = dump_label(dump_.path());
  std::set<CaseKey> checked;
  for (const TrialRow& r : rows) {
    if (!checked.insert(r.key).second) continue;
    const CaseKey& k = r.key;
    const bool in_grid = k.dump == label && !k.layer.is_all() && !k.head.is_all() && !k.batch.is_all() &&
                         !k.n.is_all() &&
                         slices.count({k.layer.value(), k.head.value(), k.batch.value(), k.n.value(), k.mask, k.window,
                                       k.queries, k.precision}) &&
                         settings.count({k.spec, k.reference});
    require_usage(
        in_grid,
        "--resume of '{}' with another grid: it has rows of {} L{} H{} B{} n={} mask={} queries={} precision={} {} "
        "vs {}, which this command does not measure{}. Resume with the same command, or write to another -o file.",
        csv_path_, k.dump, k.layer.text(), k.head.text(), k.batch.text(), k.n.text(), mask_text(k.mask, k.window),
        query_rows_text(k.queries), precision_name(k.precision), k.spec, k.reference, command);
  }
}

void SweepRun::replace_csv(const std::vector<TrialRow>& rows) {
  // Written beside, locked, then renamed over the CSV: a crash leaves the old file or the new one,
  // and the lock moves to the new file before the old one is released.
  const std::string temp = fmt::format("{}.tmp.{}", csv_path_, ::getpid());
  const int fd = ::open(temp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  require_input(fd >= 0, "cannot write '{}': {}", temp, std::strerror(errno));
  const std::string text = trial_csv_text(rows);
  size_t written = 0;
  int error = ::flock(fd, LOCK_EX | LOCK_NB) == 0 ? 0 : errno;
  while (error == 0 && written < text.size()) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      error = n < 0 ? errno : ENOSPC;
    else
      written += static_cast<size_t>(n);
  }
  if (error == 0 && ::fsync(fd) != 0) error = errno;
  if (error == 0 && ::rename(temp.c_str(), csv_path_.c_str()) != 0) error = errno;
  if (error != 0) {
    ::close(fd);
    ::unlink(temp.c_str());
    throw InputError(fmt::format("rewriting '{}' failed: {} (disk full?)", csv_path_, std::strerror(error)));
  }
  ::close(lock_fd_);
  lock_fd_ = fd;
}

RunStats SweepRun::run() {
  TrialCsvWriter writer(csv_path_, true);
  auto sink = [&](const std::vector<TrialRow>& rows) {
    writer.write(rows);
    info_.rows_written += static_cast<long long>(rows.size());
  };
  RunStats stats;
  try {
    stats = run_sweep(dump_, plan_, options_, sink);
  } catch (const Interrupted&) {  // the finished trials are in the CSV; say so in run.json too
    info_.interrupted = iso_time_now();
    write_run_info(info_path_, info_);
    throw;
  }
  info_.finished = iso_time_now();
  write_run_info(info_path_, info_);
  return stats;
}

void SweepRun::append(const std::string& lines, int64_t rows) {
  if (!writer_) {
    writer_ = std::make_unique<TrialCsvWriter>(csv_path_, true);
    info_written_ = std::chrono::steady_clock::now();
  }
  writer_->write_text(lines);
  info_.rows_written += rows;
  if (std::chrono::steady_clock::now() - info_written_ > std::chrono::seconds(10)) {
    write_run_info(info_path_, info_);
    info_written_ = std::chrono::steady_clock::now();
  }
}

void SweepRun::finish_canonical() {
  writer_.reset();
  if (!info_.plan) throw std::logic_error("finish_canonical needs the plan record in RunInfo");
  CsvContents contents = read_csv(csv_path_);
  rewrite_trial_csv(csv_path_, canonical_rows(*info_.plan, std::move(contents.trials)));
  info_.finished = iso_time_now();
  write_run_info(info_path_, info_);
}

}  // namespace attnprobe
