// The MPI runner (mpi_sweep.h), compiled only with ATTNPROBE_MPI. Protocol on MPI_COMM_WORLD, all
// messages between rank 0 and one worker:
//   rank 0 → worker  kTagWork   one int64: the unit's index into plan.slices
//   rank 0 → worker  kTagStop   empty: no more work (or rank 0 failed); the worker returns
//   worker → rank 0  kTagResult bytes: 'R' + the unit's rows as CSV lines, or 'U'/'I'/'X' + an
//                               error message (usage, input, internal), after which it waits for more
// Rank 0's main thread alone calls MPI (MPI_THREAD_FUNNELED); it polls with MPI_Iprobe and a 1 ms
// sleep rather than a blocking receive, which in OpenMPI spins and would take the core that rank 0's
// compute thread needs. The rows of a unit are the same bytes whichever rank computes them: the
// runner's output depends only on the plan and the unit (docs/randomness.md).
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>

#include "attnprobe/common/error.h"
#include "attnprobe/metrics/catalogue.h"
#include "attnprobe/records/csv.h"
#include "attnprobe/sweep/mpi_sweep.h"
#include "attnprobe/sweep/shard.h"

namespace attnprobe {

namespace {

constexpr int kTagWork = 1, kTagStop = 2, kTagResult = 3;

// MPI_Init once per process, MPI_Finalize when the sweep returns or throws.
class MpiSession {
 public:
  MpiSession() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
      owner_ = true;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  ~MpiSession() {
    if (owner_) MPI_Finalize();
  }
  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  bool owner_ = false;
  int rank_ = 0, size_ = 1;
};

// Ranks on this node, to split its cores among them when --threads is 0.
int ranks_on_node() {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int size = 1;
  MPI_Comm_size(node, &size);
  MPI_Comm_free(&node);
  return size;
}

// One unit computed here: its rows as CSV lines. Throws what the runner throws.
std::string compute_unit(const Dump& dump, const SweepPlan& plan, size_t unit, const RunOptions& options,
                         int64_t* rows_out, int64_t* tasks_out) {
  RunOptions local = options;
  local.progress = nullptr;
  std::string lines;
  const RunStats stats = run_sweep(dump, restrict_plan(plan, {unit}), local, [&](const std::vector<TrialRow>& rows) {
    for (const TrialRow& r : rows) lines += csv_line(trial_columns(), r);
  });
  if (rows_out) *rows_out = stats.rows;
  if (tasks_out) *tasks_out = stats.tasks_run;
  return lines;
}

char error_kind(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const UsageError&) {
    return 'U';
  } catch (const InputError&) {
    return 'I';
  } catch (...) {
    return 'X';
  }
}

std::string error_text(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

[[noreturn]] void rethrow_as(char kind, const std::string& text) {
  if (kind == 'U') throw UsageError(text);
  if (kind == 'I') throw InputError(text);
  throw std::runtime_error(text);
}

void worker_loop(const Dump& dump, const SweepPlan& plan, const RunOptions& options, RunStats& stats) {
  for (;;) {
    MPI_Status status;
    int64_t unit = 0;
    MPI_Recv(&unit, 1, MPI_INT64_T, 0, MPI_ANY_TAG, MPI_COMM_WORLD, &status);
    if (status.MPI_TAG == kTagStop) return;
    std::string message;
    try {
      int64_t rows = 0, tasks = 0;
      message = 'R';  // appended, not "R" + text: GCC 12 warns falsely (-Wrestrict) on that
      message += compute_unit(dump, plan, static_cast<size_t>(unit), options, &rows, &tasks);
      stats.rows += rows;
      stats.tasks_run += tasks;
    } catch (...) {
      const std::exception_ptr error = std::current_exception();
      message = error_kind(error);
      message += error_text(error);
    }
    MPI_Send(message.data(), static_cast<int>(message.size()), MPI_CHAR, 0, kTagResult, MPI_COMM_WORLD);
  }
}

// Rank 0's own compute thread: takes units from the shared queue, hands back their rows.
class LocalWorker {
 public:
  LocalWorker(const Dump& dump, const SweepPlan& plan, const RunOptions& options)
      : dump_(dump), plan_(plan), options_(options), thread_([this] { loop(); }) {}
  ~LocalWorker() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  bool idle() {
    std::lock_guard lock(mutex_);
    return !busy_ && todo_.empty();
  }
  void give(size_t unit) {
    {
      std::lock_guard lock(mutex_);
      todo_.push_back(unit);
    }
    wake_.notify_all();
  }
  /// A finished unit, if any: (unit, rows text or error, error kind or 'R').
  std::optional<std::tuple<size_t, std::string, char>> take(std::chrono::milliseconds wait) {
    std::unique_lock lock(mutex_);
    finished_cv_.wait_for(lock, wait, [&] { return !finished_.empty(); });
    if (finished_.empty()) return std::nullopt;
    auto out = std::move(finished_.front());
    finished_.pop_front();
    return out;
  }

 private:
  void loop() {
    for (;;) {
      size_t unit = 0;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || !todo_.empty(); });
        if (stop_) return;
        unit = todo_.front();
        todo_.pop_front();
        busy_ = true;
      }
      std::tuple<size_t, std::string, char> result{unit, "", 'R'};
      try {
        std::get<1>(result) = compute_unit(dump_, plan_, unit, options_, nullptr, nullptr);
      } catch (...) {
        const std::exception_ptr error = std::current_exception();
        result = {unit, error_text(error), error_kind(error)};
      }
      {
        std::lock_guard lock(mutex_);
        finished_.push_back(std::move(result));
        busy_ = false;
      }
      finished_cv_.notify_all();
    }
  }

  const Dump& dump_;
  const SweepPlan& plan_;
  RunOptions options_;  // its `done` skips a resumed unit's finished trials here
  std::mutex mutex_;
  std::condition_variable wake_, finished_cv_;
  std::deque<size_t> todo_;
  std::deque<std::tuple<size_t, std::string, char>> finished_;
  bool busy_ = false, stop_ = false;
  std::thread thread_;
};

// Rank 0: the queue, the output and the bookkeeping.
RunStats coordinate(const Dump& dump, const SweepPlan& plan, const std::vector<int64_t>& costs,
                    const std::string& csv_path, OutputMode mode, const RunOptions& options, RunInfo info, int ranks) {
  std::vector<size_t> all(plan.slices.size());
  std::iota(all.begin(), all.end(), size_t{0});
  info.plan = plan_record(dump, plan, all, ShardSpec{});
  const std::string label = info.plan->dump;
  auto stop_workers = [&] {
    for (int r = 1; r < ranks; ++r) MPI_Send(nullptr, 0, MPI_INT64_T, r, kTagStop, MPI_COMM_WORLD);
  };
  std::optional<SweepRun> run;
  try {
    run.emplace(dump, plan, csv_path, mode, options, info);
  } catch (...) {
    stop_workers();
    throw;
  }

  // Finished trials per unit (a resumed file): whole units are skipped, partial ones recomputed
  // and their finished trials' rows dropped from the result.
  std::map<std::tuple<int, int, int, int64_t>, size_t> unit_of;
  for (size_t u = 0; u < plan.slices.size(); ++u) {
    const SliceRef& s = plan.slices[u];
    unit_of[{s.layer, s.head, s.batch, s.n}] = u;
  }
  // A setting's case row (trial −1, docs/metrics.md) exists when case metrics are selected and it
  // has at least two trials, as the runner writes it.
  const bool case_metrics =
      std::any_of(plan.metrics.begin(), plan.metrics.end(), [](Metric m) { return is_case_metric(m); });
  std::map<std::pair<std::string, std::string>, int> trials_of;  // (spec, reference) → trials
  int64_t cases_per_unit = 0;
  for (const EstimatorSetting& s : plan.settings) {
    trials_of[{s.canonical, s.reference}] = s.trials;
    if (case_metrics && s.trials >= 2) ++cases_per_unit;
  }
  std::vector<int64_t> done_in_unit(plan.slices.size(), 0), cases_done_in_unit(plan.slices.size(), 0);
  for (const TrialId& id : run->done()) {
    const CaseKey& k = id.key;
    const auto trials = trials_of.find({k.spec, k.reference});
    if (id.seed != plan.seed || k.dump != label || k.layer.is_all() || k.head.is_all() || k.batch.is_all() ||
        k.n.is_all() || trials == trials_of.end() || id.trial >= trials->second)
      continue;  // a row of another plan kept in the file: not this plan's work
    const bool case_row = id.trial == kCaseTrial;
    if (case_row && !(case_metrics && trials->second >= 2)) continue;
    if (!case_row && id.trial < 0) continue;
    const auto it = unit_of.find({static_cast<int>(k.layer.value()), static_cast<int>(k.head.value()),
                                  static_cast<int>(k.batch.value()), k.n.value()});
    if (it != unit_of.end()) ++(case_row ? cases_done_in_unit : done_in_unit)[it->second];
  }
  const int64_t per_unit = plan.tasks_per_slice();
  RunStats stats;
  std::deque<size_t> queue;
  int64_t tasks_done = 0;
  for (size_t u : largest_first(costs)) {
    stats.tasks_skipped += done_in_unit[u];
    if (done_in_unit[u] >= per_unit && cases_done_in_unit[u] >= cases_per_unit)
      tasks_done += per_unit;
    else
      queue.push_back(u);
  }
  const int64_t tasks_total = plan.total_tasks();
  if (options.progress) options.progress(tasks_done, tasks_total);

  auto accept = [&](size_t unit, const std::string& lines) {
    std::string kept = lines;
    int64_t rows = std::count(lines.begin(), lines.end(), '\n');
    if (done_in_unit[unit] + cases_done_in_unit[unit] > 0) {  // a remote rank recomputed finished rows: drop them
      kept.clear();
      rows = 0;
      size_t pos = 0;
      while (pos < lines.size()) {
        const size_t end = lines.find('\n', pos);
        const std::string line = lines.substr(pos, end - pos + 1);
        pos = end + 1;
        TrialRow row;
        parse_row(trial_columns(), parse_csv_line(line.substr(0, line.size() - 1)), "a worker's result", row);
        if (run->done().count(TrialId{row.key, row.trial, row.seed})) continue;
        kept += line;
        ++rows;
      }
    }
    run->append(kept, rows);
    stats.rows += rows;
    stats.tasks_run += per_unit - done_in_unit[unit];
    tasks_done += per_unit;
    if (options.progress) options.progress(tasks_done, tasks_total);
  };

  RunOptions local_options = options;
  local_options.done = run->done();
  LocalWorker local(dump, plan, local_options);
  std::vector<std::optional<size_t>> in_flight(ranks);
  int busy = 0;
  auto hand_out = [&](int rank) {
    if (queue.empty()) return false;
    const int64_t unit = static_cast<int64_t>(queue.front());
    queue.pop_front();
    MPI_Send(&unit, 1, MPI_INT64_T, rank, kTagWork, MPI_COMM_WORLD);
    in_flight[rank] = static_cast<size_t>(unit);
    ++busy;
    return true;
  };
  // A failure anywhere: let every busy worker finish (their results are dropped), stop them all.
  bool stopped = false;
  auto stop_after_drain = [&] {
    stopped = true;
    for (int r = 1; r < ranks; ++r)
      if (in_flight[r]) {
        MPI_Status status;
        MPI_Probe(r, kTagResult, MPI_COMM_WORLD, &status);
        int bytes = 0;
        MPI_Get_count(&status, MPI_CHAR, &bytes);
        std::string ignored(static_cast<size_t>(bytes), '\0');
        MPI_Recv(ignored.data(), bytes, MPI_CHAR, r, kTagResult, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      }
    stop_workers();
  };
  auto fail = [&](char kind, const std::string& text) {
    stop_after_drain();
    rethrow_as(kind, text);
  };

  try {
    for (int r = 1; r < ranks; ++r) hand_out(r);
    bool local_busy = false;
    for (;;) {
      if (!local_busy && !queue.empty()) {
        local.give(queue.front());
        queue.pop_front();
        local_busy = true;
      }
      if (!local_busy && busy == 0) break;
      int flag = 0;
      MPI_Status status;
      MPI_Iprobe(MPI_ANY_SOURCE, kTagResult, MPI_COMM_WORLD, &flag, &status);
      if (flag) {
        const int source = status.MPI_SOURCE;
        int bytes = 0;
        MPI_Get_count(&status, MPI_CHAR, &bytes);
        std::string message(static_cast<size_t>(bytes), '\0');
        MPI_Recv(message.data(), bytes, MPI_CHAR, source, kTagResult, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        const size_t unit = *in_flight[source];
        in_flight[source].reset();
        --busy;
        if (message.empty() || message[0] != 'R')
          fail(message.empty() ? 'X' : message[0],
               fmt::format("rank {}: {}", source, message.empty() ? "empty result" : message.substr(1)));
        accept(unit, message.substr(1));
        hand_out(source);
        continue;
      }
      if (local_busy) {
        if (auto finished = local.take(std::chrono::milliseconds(1))) {
          local_busy = false;
          const auto& [unit, text, kind] = *finished;
          if (kind != 'R') fail(kind, text);
          // Computed with the finished trials skipped: nothing to drop.
          const int64_t rows = std::count(text.begin(), text.end(), '\n');
          run->append(text, rows);
          stats.rows += rows;
          stats.tasks_run += per_unit - done_in_unit[unit];
          tasks_done += per_unit;
          if (options.progress) options.progress(tasks_done, tasks_total);
        }
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    stopped = true;
    stop_workers();
  } catch (...) {
    if (!stopped) stop_after_drain();  // e.g. a failed write: the workers must not wait forever
    throw;
  }
  run->finish_canonical();
  return stats;
}

}  // namespace

MpiSweepResult run_mpi_sweep(const Dump& dump, const SweepPlan& plan, const std::vector<int64_t>& costs,
                             const std::string& csv_path, OutputMode mode, RunOptions options, RunInfo info) {
  MpiSession mpi;
  MpiSweepResult result{mpi.rank(), mpi.size(), {}};
  // Every rank planned on its own: the plans must be one (same dump file, same command).
  const uint64_t fingerprint = std::stoull(plan_record(dump, plan, {}, ShardSpec{}).fingerprint, nullptr, 16);
  uint64_t low = 0, high = 0;
  MPI_Allreduce(&fingerprint, &low, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&fingerprint, &high, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  if (low != high)
    throw InputError(fmt::format(
        "the MPI ranks planned different grids (plan fingerprint {:016x} here, {:016x}..{:016x} across ranks): "
        "every rank must see the same dump file and the same command",
        fingerprint, low, high));
  if (options.threads <= 0) options.threads = std::max(1, hardware_threads() / ranks_on_node());
  info.threads = options.threads;
  if (mpi.rank() == 0) {
    result.stats = coordinate(dump, plan, costs, csv_path, mode, options, std::move(info), mpi.size());
  } else {
    options.progress = nullptr;
    worker_loop(dump, plan, options, result.stats);
  }
  return result;
}

}  // namespace attnprobe
