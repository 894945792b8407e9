#include "attnprobe/sweep/runner.h"

#include <fmt/format.h>

#include <filesystem>
#include <map>

#include "attnprobe/common/parallel.h"
#include "attnprobe/exact/exact_attention.h"
#include "attnprobe/metrics/metrics.h"

namespace attnprobe {

std::string dump_label(const std::string& path) { return std::filesystem::path(path).filename().string(); }

std::set<TrialId> complete_trials(const std::vector<TrialRow>& rows, const std::vector<Metric>& metrics) {
  std::map<TrialId, std::set<std::string>> seen;
  for (const TrialRow& r : rows) seen[TrialId{r.key, r.trial, r.seed}].insert(r.metric);
  std::set<TrialId> done;
  for (const auto& [id, names] : seen) {
    bool all = true;
    for (Metric m : metrics) all = all && names.count(metric_name(m));
    if (all) done.insert(id);
  }
  return done;
}

namespace {

struct Reference {
  MatrixD output;
  ReferenceNorms norms;
};

struct Task {
  size_t setting = 0;
  int trial = 0;
};

}  // namespace

RunStats run_sweep(const Dump& dump, const SweepPlan& plan, const RunOptions& options,
                   const std::function<void(const std::vector<TrialRow>&)>& sink) {
  ThreadPool pool(options.threads);
  RunStats stats;
  const std::string label = dump_label(dump.path());

  std::vector<std::unique_ptr<Estimator>> estimators;
  for (const EstimatorSetting& s : plan.settings) estimators.push_back(make_estimator(s.spec, options.device));
  std::map<std::string, std::unique_ptr<Estimator>> reference_estimators;
  for (const EstimatorSetting& s : plan.settings)
    if (!reference_estimators.count(s.reference)) reference_estimators[s.reference] = parse_spec(s.reference).make();

  // The longest prefix needed per (layer, head, batch item): read once, shorter lengths are views.
  std::map<std::tuple<int, int, int>, int64_t> longest;
  for (const SliceRef& s : plan.slices) {
    auto& n = longest[{s.layer, s.head, s.batch}];
    n = std::max(n, s.n);
  }
  std::tuple<int, int, int> cached_id{-1, -1, -1};
  HeadView cached;

  int64_t tasks_done = 0;
  const int64_t tasks_total = plan.total_tasks();
  for (const SliceRef& slice : plan.slices) {
    auto key_of = [&](const EstimatorSetting& s) {
      return CaseKey{.dump = label,
                     .layer = slice.layer,
                     .head = slice.head,
                     .batch = slice.batch,
                     .n = slice.n,
                     .p = dump.layer(slice.layer).dim,
                     .estimator = s.spec.name(),
                     .spec = s.canonical,
                     .samples = s.samples,
                     .reference = s.reference};
    };
    std::vector<Task> tasks;
    for (size_t i = 0; i < plan.settings.size(); ++i)
      for (int t = 0; t < plan.settings[i].trials; ++t) {
        if (options.done.count(TrialId{key_of(plan.settings[i]), t, plan.seed})) {
          ++stats.tasks_skipped;
          continue;
        }
        tasks.push_back(Task{i, t});
      }
    const int64_t slice_tasks = plan.tasks_per_slice();
    if (tasks.empty()) {
      tasks_done += slice_tasks;
      if (options.progress) options.progress(tasks_done, tasks_total);
      continue;
    }

    const std::tuple<int, int, int> id{slice.layer, slice.head, slice.batch};
    if (id != cached_id) {
      cached = dump.read_slice(slice.layer, slice.head, slice.batch, longest[id]);
      cached_id = id;
    }
    HeadView prefix;
    if (slice.n != cached.n())
      prefix = make_head_view(SliceId{slice.layer, slice.head, slice.batch, slice.n}, cached.scale,
                              cached.q.topRows(slice.n), cached.k.topRows(slice.n), cached.v.topRows(slice.n));
    const HeadView& view = slice.n == cached.n() ? cached : prefix;

    std::map<std::string, Reference> references;
    for (const Task& task : tasks) {
      const std::string& ref = plan.settings[task.setting].reference;
      if (references.count(ref)) continue;
      const Estimator& estimator = *reference_estimators.at(ref);
      std::optional<MatrixD> output = estimator.reference(view, &pool);
      if (!output) {  // a deterministic estimator without a float64 path: its float32 result
        MatrixF out;
        estimator.estimate(view, EstimateContext{RandomKey{0}, &pool}, out);
        output = out.cast<double>();
      }
      Reference r{std::move(*output), {}};
      r.norms = reference_norms(r.output);
      references.emplace(ref, std::move(r));
    }

    std::vector<std::vector<double>> values(tasks.size());
    pool.parallel_for(static_cast<int64_t>(tasks.size()), [&](int64_t i) {
      const Task& task = tasks[i];
      const EstimatorSetting& setting = plan.settings[task.setting];
      const EstimateContext ctx{make_random_key(plan.seed, case_id(slice, setting.canonical), task.trial), nullptr};
      MatrixF out;
      estimators[task.setting]->estimate(view, ctx, out);
      if (out.rows() != view.n() || out.cols() != view.pv())
        throw std::logic_error(fmt::format("estimator {} returned {}x{} for a {}x{} slice", setting.canonical,
                                           out.rows(), out.cols(), view.n(), view.pv()));
      const Reference& ref = references.at(setting.reference);
      values[i] = compute_metrics(ref.output, ref.norms, out, plan.metrics);
    });

    std::vector<TrialRow> rows;
    for (size_t i = 0; i < tasks.size(); ++i) {
      const EstimatorSetting& setting = plan.settings[tasks[i].setting];
      const CaseKey key = key_of(setting);
      for (size_t m = 0; m < plan.metrics.size(); ++m)
        rows.push_back(TrialRow{key, tasks[i].trial, plan.seed, metric_name(plan.metrics[m]), values[i][m]});
    }
    sink(rows);
    stats.tasks_run += static_cast<int64_t>(tasks.size());
    stats.rows += static_cast<int64_t>(rows.size());
    tasks_done += slice_tasks;
    if (options.progress) options.progress(tasks_done, tasks_total);
  }
  return stats;
}

}  // namespace attnprobe
