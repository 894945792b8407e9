#include "attnprobe/sweep/sweep_run.h"

#include <fmt/format.h>

#include <filesystem>

#include "attnprobe/common/error.h"
#include "attnprobe/records/csv.h"
#include "attnprobe/sweep/merge.h"

namespace attnprobe {

SweepRun::SweepRun(const Dump& dump, SweepPlan plan, std::string csv_path, OutputMode mode, RunOptions options,
                   RunInfo info)
    : dump_(dump),
      plan_(std::move(plan)),
      csv_path_(std::move(csv_path)),
      info_path_(run_info_path(csv_path_)),
      options_(std::move(options)),
      info_(std::move(info)) {
  const std::filesystem::path path(csv_path_);
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  const bool exists = std::filesystem::exists(path) && std::filesystem::file_size(path) > 0;
  if (exists && mode == OutputMode::kCreate)
    throw UsageError(
        fmt::format("'{}' already exists: add --resume to continue it (finished trials are kept and "
                    "skipped) or --overwrite to replace it",
                    csv_path_));
  const bool resuming = exists && mode == OutputMode::kResume;
  if (resuming) {
    const CsvContents old = read_csv(csv_path_);
    if (old.summary)
      throw InputError(fmt::format("'{}' is a summary CSV; --resume needs the trial CSV of a sweep", csv_path_));
    options_.done = complete_trials(old.trials, plan_.metrics);
    std::vector<TrialRow> whole;
    for (const TrialRow& r : old.trials)
      if (options_.done.count(TrialId{r.key, r.trial, r.seed})) whole.push_back(r);
    if (whole.size() != old.trials.size() || old.truncated_tail) rewrite_trial_csv(csv_path_, whole);
    kept_rows_ = static_cast<int64_t>(whole.size());
  }
  {  // truncates (or checks the header of) the CSV now, before run.json says the run started
    TrialCsvWriter open_output(csv_path_, resuming);
  }
  info_.resumed = resuming;
  info_.started = iso_time_now();
  write_run_info(info_path_, info_);
}

RunStats SweepRun::run() {
  TrialCsvWriter writer(csv_path_, true);
  const RunStats stats = run_sweep(dump_, plan_, options_, [&](const std::vector<TrialRow>& rows) {
    writer.write(rows);
    info_.rows_written += static_cast<long long>(rows.size());
  });
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
