#include "attnprobe/sweep/runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>

#include "attnprobe/common/error.h"
#include "attnprobe/common/parallel.h"
#include "attnprobe/estimators/rounded_estimate.h"
#include "attnprobe/exact/exact_at_precision.h"
#include "attnprobe/exact/exact_attention.h"
#include "attnprobe/metrics/metrics.h"
#include "attnprobe/metrics/selection_metrics.h"
#include "attnprobe/metrics/weight_metrics.h"
#include "attnprobe/rng/random_matrix.h"
#include "attnprobe/view/rounded_view.h"

namespace attnprobe {

namespace {
// The length of the well-formed UTF-8 sequence (RFC 3629: no overlongs, surrogates or code points above
// U+10FFFF) that starts at text[i], or 0 when none does.
size_t utf8_sequence(const std::string& text, size_t i) {
  const auto byte = [&](size_t j) { return j < text.size() ? static_cast<unsigned char>(text[j]) : 0u; };
  const unsigned b0 = byte(i);
  const auto tail = [&](size_t j, unsigned lo = 0x80, unsigned hi = 0xBF) { return byte(j) >= lo && byte(j) <= hi; };
  if (b0 >= 0xC2 && b0 <= 0xDF) return tail(i + 1) ? 2 : 0;
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    const unsigned lo = b0 == 0xE0 ? 0xA0 : 0x80, hi = b0 == 0xED ? 0x9F : 0xBF;
    return tail(i + 1, lo, hi) && tail(i + 2) ? 3 : 0;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    const unsigned lo = b0 == 0xF0 ? 0x90 : 0x80, hi = b0 == 0xF4 ? 0x8F : 0xBF;
    return tail(i + 1, lo, hi) && tail(i + 2) && tail(i + 3) ? 4 : 0;
  }
  return 0;
}
}  // namespace

std::string dump_label(const std::string& path) {
  const std::string name = std::filesystem::path(path).filename().string();
  std::string label;
  for (size_t i = 0; i < name.size();) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    if (c >= 0x80) {
      if (const size_t length = utf8_sequence(name, i); length > 0) {
        label.append(name, i, length);
        i += length;
        continue;
      }
    }
    if (c < 0x20 || c == 0x7F || c >= 0x80)
      label += fmt::format("\\x{:02x}", c);
    else if (c == '\\')
      label += "\\\\";
    else
      label += static_cast<char>(c);
    ++i;
  }
  return label;
}

std::set<TrialId> complete_trials(const std::vector<TrialRow>& rows, const std::vector<Metric>& metrics,
                                  int64_t recall_k) {
  std::map<TrialId, std::set<std::string>> seen;
  for (const TrialRow& r : rows) seen[TrialId{r.key, r.trial, r.seed}].insert(r.metric);
  std::set<TrialId> done;
  for (const auto& [id, names] : seen) {
    bool all = true;  // a trial needs every per-trial metric asked for; a case row (trial −1) every case metric
    for (Metric m : metrics)
      if (is_case_metric(m) == (id.trial == kCaseTrial)) all = all && names.count(metric_name(m, recall_k));
    if (all) done.insert(id);
  }
  return done;
}

MatrixD reference_output(const Estimator& reference, const HeadView& view, ThreadPool* pool) {
  if (std::optional<MatrixD> output = reference.reference(view, pool)) return std::move(*output);
  MatrixF out;
  reference.estimate(view, EstimateContext{RandomKey{0}, pool}, out);
  return out.cast<double>();
}

MatrixD upstream_gradient(uint64_t seed, const SliceRef& slice, int64_t pv) {
  const RandomStream stream(
      make_random_key(
          seed, fmt::format("upstream gradient;layer={};head={};batch={}", slice.layer, slice.head, slice.batch), 0),
      Purpose::kUpstreamGradient);
  return normal_rows(stream, slice.n, pv);
}

namespace {

struct Reference {
  MatrixD output;
  ReferenceNorms norms;
  std::optional<Gradients> gradients;  ///< when gradient metrics are asked for and it has a backward form
  /// A selection estimator's kept sets (stated row by row on demand), when the selection metrics are asked for:
  /// kept_overlap is then measured against them instead of the size-matched oracle.
  Estimator::KeptRows kept;
};

struct Task {
  size_t setting = 0;
  int trial = 0;
  bool write = true;  ///< false: already in the output; run only to feed the case accumulator
};

// The case-level metrics of one setting on one slice. Trials finish in any order on the pool; each
// estimate is folded into the accumulator in trial order (a finished trial waits in `pending` for
// its predecessors), so the float64 sums do not depend on the thread count and at most about one
// estimate per thread is held at a time.
struct CaseState {
  std::mutex mutex;
  int next_trial = 0;
  std::map<int, MatrixF> pending;
  CaseAccumulator accumulator;

  void add(int trial, MatrixF estimate) {
    std::lock_guard<std::mutex> lock(mutex);
    pending.emplace(trial, std::move(estimate));
    for (auto it = pending.find(next_trial); it != pending.end(); it = pending.find(next_trial)) {
      accumulator.add(it->second);
      pending.erase(it);
      ++next_trial;
    }
  }
};

}  // namespace

const HeadView& view_of_case(HeadView& read, const SliceRef& slice, HeadView& storage, const GroupRead* group) {
  read.mask = slice.mask;
  read.window = slice.window;
  const bool prefix = slice.n != read.keys(), last = slice.queries.kind == QueryRows::Kind::kLast;
  if (group && !prefix) read.group = prefix_group(group->rows, group->member, read.keys(), group->keys);
  if (!prefix && !last) return read;
  if (prefix) {
    storage = make_head_view(SliceId{slice.layer, slice.head, slice.batch, slice.n, read.id.kv_head}, read.scale,
                             read.q.topRows(slice.n), read.k.topRows(slice.n), read.v.topRows(slice.n), slice.mask);
    storage.window = slice.window;
    storage.shaping = read.shaping.cut(0, slice.n, slice.n);
    storage.rope_inv_freq = read.rope_inv_freq;
    if (group) storage.group = prefix_group(group->rows, group->member, slice.n, group->keys);
  }
  if (last) {
    storage = last_rows(prefix ? storage : read, slice.queries.last);
    storage.prefill = slice.queries.prefill;
  }
  return storage;
}

RunStats run_sweep(const Dump& dump, const SweepPlan& plan, const RunOptions& options,
                   const std::function<void(const std::vector<TrialRow>&)>& sink) {
  ThreadPool pool(options.threads);
  RunStats stats;
  const std::string label = dump_label(dump.path());

  // The planner checked the CPU; a device may lack the causal form or score shaping. Checked before the estimators
  // are made, so this usage error (exit 2) comes before a missing GPU (exit 3).
  for (const SliceRef& slice : plan.slices) {
    const LayerInfo& info = dump.layer(slice.layer);
    // A device version computes in float32: the rounding points below it are declared for the CPU versions.
    require_usage(options.device == Device::kCpu || !below_float32(slice.precision),
                  "--precision {} rounds each estimator at the points its CPU version declares; run it with --device "
                  "cpu (device versions compute in float32)",
                  precision_name(slice.precision));
    for (const EstimatorSetting& s : plan.settings) {
      require_form_support(s.spec, slice.mask, !slice.queries.all(), options.device);
      if (info.shaped()) require_shaping_support(s.spec, info.shaping(), options.device);
    }
  }
  std::vector<std::unique_ptr<Estimator>> estimators;
  for (const EstimatorSetting& s : plan.settings) estimators.push_back(make_estimator(s.spec, options.device));
  // Gradient metrics (only when asked for): the backward passes are float64 host code, so they come
  // from the CPU versions whatever the device.
  const bool gradients = std::any_of(plan.metrics.begin(), plan.metrics.end(), is_gradient_metric);
  std::vector<std::unique_ptr<Estimator>> backward_estimators;
  if (gradients)
    for (const EstimatorSetting& s : plan.settings) backward_estimators.push_back(s.spec.make());
  // References: the CPU version always (its float64 path), and the device's version where one exists
  // and states a float64-accumulated reference itself (e.g. CUDA softmax's fp64 kernel), tried first.
  std::map<std::string, std::unique_ptr<Estimator>> reference_estimators, device_references;
  for (const EstimatorSetting& s : plan.settings) {
    if (reference_estimators.count(s.reference)) continue;
    const Spec ref = parse_spec(s.reference);
    reference_estimators[s.reference] = ref.make();
    if (options.device != Device::kCpu) {
      const std::vector<Device> on = devices_of(ref.def());
      if (std::find(on.begin(), on.end(), options.device) != on.end())
        device_references[s.reference] = make_estimator(ref, options.device);
    }
  }

  // The longest prefix needed per (layer, head, batch item): read once, shorter lengths are views.
  std::map<std::tuple<int, int, int>, int64_t> longest;
  for (const SliceRef& s : plan.slices) {
    auto& n = longest[{s.layer, s.head, s.batch}];
    n = std::max(n, s.n);
  }
  // Per-trial metrics: the plain ones, then the precision ones, then the attention-weight ones, then the selection ones
  // (the rows' order); then per case.
  std::vector<Metric> plain_list, precision_list, weight_list, selection_list, case_list;
  for (Metric m : plan.metrics)
    (is_case_metric(m)        ? case_list
     : is_weight_metric(m)    ? weight_list
     : is_selection_metric(m) ? selection_list
     : is_precision_metric(m) ? precision_list
                              : plain_list)
        .push_back(m);
  std::vector<Metric> trial_list = plain_list;
  trial_list.insert(trial_list.end(), precision_list.begin(), precision_list.end());
  trial_list.insert(trial_list.end(), weight_list.begin(), weight_list.end());
  trial_list.insert(trial_list.end(), selection_list.begin(), selection_list.end());
  // The float32 kept sets beside a rounded case's are stated only for the metric that compares them.
  const bool wants_overlap_f32 =
      std::find(selection_list.begin(), selection_list.end(), Metric::kKeptOverlapF32) != selection_list.end();

  std::tuple<int, int, int> cached_id{-1, -1, -1};
  HeadView cached;
  // Settings that choose keys for several heads read every query head of the slice's kv group, or of its layer with
  // the keys of its other kv heads: read once per (layer, head or kv head, batch item) while the sweep stays in that
  // group or layer. A layer's group serves the settings shared by a kv group too (scoring_heads picks theirs).
  SharedBy widest = SharedBy::kHead;
  for (const EstimatorSetting& s : plan.settings) widest = std::max(widest, s.spec.capabilities().shared_by);
  // (layer, head, batch item) → (length read, its query rows); (layer, kv head, batch item) → (length, its keys)
  std::map<std::tuple<int, int, int>, std::pair<int64_t, MatrixF>> group_queries, group_keys;
  GroupRead group;

  int64_t tasks_done = 0;
  const int64_t tasks_total = plan.total_tasks();
  auto stopped = [&] { return options.stop_requested && options.stop_requested(); };
  auto interrupted = [&] {
    return Interrupted(
        fmt::format("interrupted after {} of {} trials", stats.tasks_run + stats.tasks_skipped, tasks_total));
  };
  for (const SliceRef& slice : plan.slices) {
    if (stopped()) throw interrupted();
    auto key_of = [&](const EstimatorSetting& s) {
      return CaseKey{.dump = label,
                     .layer = slice.layer,
                     .head = slice.head,
                     .batch = slice.batch,
                     .n = slice.n,
                     .p = dump.layer(slice.layer).dim,
                     .mask = slice.mask,
                     .window = slice.window,
                     .queries = slice.queries,
                     .estimator = s.spec.name(),
                     .spec = s.canonical,
                     .samples = s.samples,
                     .reference = s.reference,
                     .precision = slice.precision};
    };
    // Case-level metrics (trial −1) for settings with at least two trials whose case row is not yet
    // in the output; their finished trials are run again, silently, to rebuild the accumulator.
    std::vector<std::unique_ptr<CaseState>> cases(plan.settings.size());
    if (!case_list.empty())
      for (size_t i = 0; i < plan.settings.size(); ++i)
        if (plan.settings[i].trials >= 2 &&
            !options.done.count(TrialId{key_of(plan.settings[i]), kCaseTrial, plan.seed}))
          cases[i] = std::make_unique<CaseState>();
    std::vector<Task> tasks;
    for (size_t i = 0; i < plan.settings.size(); ++i)
      for (int t = 0; t < plan.settings[i].trials; ++t) {
        const bool done = options.done.count(TrialId{key_of(plan.settings[i]), t, plan.seed}) > 0;
        if (done) ++stats.tasks_skipped;
        if (done && !cases[i]) continue;
        tasks.push_back(Task{i, t, !done});
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
    if (widest != SharedBy::kHead) {
      const LayerInfo& info = dump.layer(slice.layer);
      const bool layer = widest == SharedBy::kLayer;
      const int per_kv = info.heads / info.kv_heads;
      const int size = layer ? info.heads : per_kv, first = layer ? 0 : cached.id.kv_head * per_kv;
      const std::tuple<int, int, int>& held = group_queries.empty() ? id : group_queries.begin()->first;
      if (std::get<0>(held) != slice.layer || (!layer && std::get<1>(held) / per_kv != cached.id.kv_head)) {
        group_queries.clear();
        group_keys.clear();
      }
      group.member = slice.head - first;
      group.rows.assign(size, nullptr);
      group.keys.assign(layer ? size : 0, nullptr);
      for (int m = 0; m < size; ++m) {
        const int head = first + m, kv_head = head / per_kv;
        if (head == slice.head) continue;
        auto [it, fresh] = group_queries.try_emplace({slice.layer, head, slice.batch});
        if (fresh || it->second.first < longest[id])
          it->second = {longest[id], dump.read_queries(slice.layer, head, slice.batch, longest[id]).cast<float>()};
        group.rows[m] = &it->second.second;
        if (kv_head == cached.id.kv_head) continue;  // it reads this slice's keys
        auto [keys, new_keys] = group_keys.try_emplace({slice.layer, kv_head, slice.batch});
        if (new_keys || keys->second.first < longest[id])
          keys->second = {longest[id], dump.read_keys(slice.layer, head, slice.batch, longest[id]).cast<float>()};
        group.keys[m] = &keys->second.second;
      }
    }
    HeadView cut;
    const HeadView& view = view_of_case(cached, slice, cut, widest != SharedBy::kHead ? &group : nullptr);
    // Below float32 the estimators read inputs rounded to the case's precision; the reference stays the float64
    // attention of the inputs as stored (docs/precision.md).
    const bool rounding = below_float32(slice.precision);
    const HeadView rounded = rounding ? rounded_view(view, slice.precision) : HeadView{};
    const HeadView& case_view = rounding ? rounded : view;
    // R_ℓ of the precision metrics: exact attention in the case's precision, once per slice.
    const MatrixF exact_at_precision =
        precision_list.empty() ? MatrixF() : exact_attention_at(view, slice.precision, &pool);

    // G: the dump's layer_NN/dy when present, else the keyed generator's.
    MatrixD upstream;
    if (gradients) {
      std::optional<MatrixD> dy = dump.read_upstream(slice.layer, slice.head, slice.batch, slice.n);
      upstream = dy ? std::move(*dy) : upstream_gradient(plan.seed, slice, view.pv());
    }

    std::map<std::string, Reference> references;
    for (const Task& task : tasks) {
      const std::string& ref = plan.settings[task.setting].reference;
      if (references.count(ref)) continue;
      const Estimator& estimator = *reference_estimators.at(ref);
      std::optional<MatrixD> output;
      if (const auto device = device_references.find(ref);
          device != device_references.end() &&
          form_on(parse_spec(ref), view.mask, !view.self_attention(), options.device))
        output = device->second->reference(view, &pool);
      Reference r{output ? std::move(*output) : reference_output(estimator, view, &pool), {}, std::nullopt};
      r.norms = reference_norms(r.output);
      if (gradients && parse_spec(ref).capabilities().backward != Backward::kNone)
        r.gradients = estimator.backward(view, upstream, EstimateContext{RandomKey{0}, &pool});
      if (!selection_list.empty() && parse_spec(ref).capabilities().selection)
        r.kept = estimator.kept_keys(view, EstimateContext{RandomKey{0}, &pool});
      references.emplace(ref, std::move(r));
    }

    std::vector<std::vector<double>> values(tasks.size());
    std::vector<char> finished(tasks.size(), 0);  // char, not bool: one byte per task, written by its thread
    // inner_pool: the pool the estimator may use inside its call. Tasks run in parallel when there are
    // enough of them; with fewer tasks than threads (one estimator, one trial: `eval`, a deterministic
    // setting) they run one after another and each call gets the whole pool. Estimators give the same
    // bits with and without a pool (tested for every registered variant), so the rows do not depend on it.
    auto run_task = [&](int64_t i, ThreadPool* inner_pool) {
      if (stopped()) return;
      const Task& task = tasks[i];
      const EstimatorSetting& setting = plan.settings[task.setting];
      const EstimateContext ctx{case_key(plan.seed, slice, setting.canonical, task.trial), inner_pool,
                                group_case_key(plan.seed, slice, view.id.kv_head, setting.canonical, task.trial)};
      MatrixF out;
      estimate_at_precision(*estimators[task.setting], case_view, ctx, slice.precision, out);
      if (out.rows() != view.n() || out.cols() != view.pv())
        throw std::logic_error(fmt::format("estimator {} returned {}x{} for a {}x{} slice", setting.canonical,
                                           out.rows(), out.cols(), view.n(), view.pv()));
      const Reference& ref = references.at(setting.reference);
      if (task.write) {
        values[i] = compute_metrics(ref.output, ref.norms, out, plain_list);
        if (gradients) {
          // Compared only with a reference of the same backward form (else NaN, docs/metrics.md).
          std::optional<Gradients> grad;
          const Backward form = setting.spec.capabilities().backward;
          if (ref.gradients && form == parse_spec(setting.reference).capabilities().backward)
            grad = backward_estimators[task.setting]->backward(view, upstream, ctx);
          set_gradient_metrics(ref.gradients ? &*ref.gradients : nullptr, grad ? &*grad : nullptr, plain_list,
                               values[i]);
        }
        if (!precision_list.empty()) {  // R̂ in float32 from the same draws, beside R̂_ℓ (out)
          MatrixF float32_estimate;
          if (rounding) estimators[task.setting]->estimate(view, ctx, float32_estimate);
          const std::vector<double> split = precision_metrics(
              ref.output, ref.norms, RoundingParts{rounding ? float32_estimate : out, out, exact_at_precision},
              precision_list);
          values[i].insert(values[i].end(), split.begin(), split.end());
        }
        if (!weight_list.empty()) {  // O(n²): only when asked for
          const std::vector<double> w =
              attention_weight_metrics(view, estimators[task.setting]->weights(view, ctx), weight_list);
          values[i].insert(values[i].end(), w.begin(), w.end());
        }
        // A selection estimator's kept sets are stated again for each metric group, not cached: a cache would
        // hold n × |S| keys (1.7 GB for 5% of 65536 keys at n = 65536), and the restatement costs the order of
        // the metrics' own O(n²·p) exact rows.
        // Below float32 the kept sets are those the rounded inputs and scores choose, measured against the exact
        // weights of the inputs as stored, and beside the float32 kept sets of the same draws (kept_overlap_f32).
        if (!selection_list.empty()) {
          EstimateContext at_precision = ctx;
          at_precision.precision = slice.precision;
          const Estimator::KeptRows float32_kept =
              rounding && wants_overlap_f32 ? estimators[task.setting]->kept_keys(view, ctx) : nullptr;
          const std::vector<double> kept = selection_metrics(
              view, estimators[task.setting]->kept_keys(case_view, at_precision), selection_list, plan.eps,
              plan.recall_k, ref.kept ? &ref.kept : nullptr, float32_kept ? &float32_kept : nullptr);
          values[i].insert(values[i].end(), kept.begin(), kept.end());
        }
      }
      if (cases[task.setting]) cases[task.setting]->add(task.trial, std::move(out));
      finished[i] = 1;
    };
    if (static_cast<int64_t>(tasks.size()) < pool.size())
      for (int64_t i = 0; i < static_cast<int64_t>(tasks.size()); ++i) run_task(i, &pool);
    else
      pool.parallel_for(static_cast<int64_t>(tasks.size()), [&](int64_t i) { run_task(i, nullptr); });

    std::vector<TrialRow> rows;
    bool setting_whole = true;  // every task of the current setting finished (false only when stopped)
    int64_t finished_writes = 0;
    for (size_t i = 0; i < tasks.size(); ++i) {
      const EstimatorSetting& setting = plan.settings[tasks[i].setting];
      const CaseKey key = key_of(setting);
      if (i == 0 || tasks[i - 1].setting != tasks[i].setting) setting_whole = true;
      setting_whole = setting_whole && finished[i];
      if (tasks[i].write && finished[i]) {
        ++finished_writes;
        for (size_t m = 0; m < trial_list.size(); ++m)
          rows.push_back(
              TrialRow{key, tasks[i].trial, plan.seed, metric_name(trial_list[m], plan.recall_k), values[i][m]});
      }
      // After a setting's last trial: its case row.
      const bool last = i + 1 == tasks.size() || tasks[i + 1].setting != tasks[i].setting;
      if (last && setting_whole && cases[tasks[i].setting]) {
        const Reference& ref = references.at(setting.reference);
        const std::vector<double> case_values =
            cases[tasks[i].setting]->accumulator.metrics(ref.output, ref.norms, case_list);
        for (size_t m = 0; m < case_list.size(); ++m)
          rows.push_back(
              TrialRow{key, kCaseTrial, plan.seed, metric_name(case_list[m], plan.recall_k), case_values[m]});
      }
    }
    sink(rows);
    stats.tasks_run += finished_writes;
    stats.rows += static_cast<int64_t>(rows.size());
    if (std::find(finished.begin(), finished.end(), 0) != finished.end()) throw interrupted();
    tasks_done += slice_tasks;
    if (options.progress) options.progress(tasks_done, tasks_total);
  }
  return stats;
}

}  // namespace attnprobe
