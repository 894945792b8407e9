#include "attnprobe/sweep/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>

#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"

namespace attnprobe {

int64_t SweepPlan::tasks_per_slice() const {
  int64_t total = 0;
  for (const EstimatorSetting& s : settings) total += s.trials;
  return total;
}

namespace {
// The registered estimators that have a capability, for the message that refuses one without it.
std::string names_where(const std::function<bool(const Capabilities&)>& has) {
  return join(estimators_where(has), ", ");
}
bool states_weights(const Capabilities& can) { return !can.weights.empty(); }
bool states_kept_keys(const Capabilities& can) { return can.selection; }
}  // namespace

double SweepPlan::total_rows() const {
  const auto case_count = std::count_if(metrics.begin(), metrics.end(), is_case_metric);
  const auto trial_count = static_cast<int64_t>(metrics.size()) - case_count;
  const auto repeated = std::count_if(settings.begin(), settings.end(), [](const auto& s) { return s.trials >= 2; });
  return static_cast<double>(slices.size()) *
         (static_cast<double>(tasks_per_slice()) * static_cast<double>(trial_count) +
          static_cast<double>(repeated) * static_cast<double>(case_count));
}

std::vector<int> resolve_indices(const std::string& text, int64_t count, const std::string& what,
                                 const std::vector<int>& valid_in) {
  std::vector<int> valid = valid_in;
  if (valid.empty())
    for (int i = 0; i < count; ++i) valid.push_back(i);
  if (trim(text) == "all" || trim(text).empty()) return valid;
  std::vector<int> out;
  const std::set<int64_t> valid_set(valid.begin(), valid.end());
  std::set<int64_t> chosen;  // sets: a list of 10^6 values costs n log n, not n²
  for (int64_t v : parse_int_list(text, what)) {
    if (!valid_set.count(v))
      throw InputError(fmt::format("{} {} does not exist in the dump (valid: {}).", what, v,
                                   valid.size() <= 16 ? fmt::format("{}", fmt::join(valid, ","))
                                                      : fmt::format("{}..{}", valid.front(), valid.back())));
    if (chosen.insert(v).second) out.push_back(static_cast<int>(v));
  }
  return out;
}

std::string geometry_suffix(Mask mask, int64_t window, QueryRows queries) {
  std::string suffix = mask == Mask::kFull ? "" : ";mask=" + mask_text(mask, window);
  if (!queries.all()) suffix += ";queries=" + query_rows_text(queries);
  return suffix;
}

std::string precision_suffix(Precision precision) {
  return precision == Precision::kF32 ? "" : fmt::format(";precision={}", precision_name(precision));
}

namespace {

// A case id with its head field given ("head=h", or "kv=g" for the draws a kv group shares).
std::string case_text(const SliceRef& slice, const std::string& head_field, const std::string& canonical_spec) {
  return fmt::format("layer={};{};batch={};n={};spec={}{}{}", slice.layer, head_field, slice.batch, slice.n,
                     canonical_spec, geometry_suffix(slice.mask, slice.window, slice.queries),
                     precision_suffix(slice.precision));
}

}  // namespace

std::string case_id(const SliceRef& slice, const std::string& canonical_spec) {
  return case_text(slice, fmt::format("head={}", slice.head), canonical_spec);
}

RandomKey case_key(uint64_t seed, const SliceRef& slice, const std::string& canonical_spec, uint32_t trial) {
  SliceRef every_row = slice;
  every_row.queries = QueryRows{};
  every_row.precision = Precision::kF32;
  return make_random_key(seed, case_id(every_row, canonical_spec), trial);
}

RandomKey group_case_key(uint64_t seed, const SliceRef& slice, int kv_head, const std::string& canonical_spec,
                         uint32_t trial) {
  SliceRef every_row = slice;
  every_row.queries = QueryRows{};
  every_row.precision = Precision::kF32;
  return make_random_key(seed, case_text(every_row, fmt::format("kv={}", kv_head), canonical_spec), trial);
}

std::vector<QueryRows> parse_query_rows_list(const std::string& text, const std::string& what) {
  std::vector<QueryRows> rows;
  for (const std::string& item : split(text, ',')) {
    const auto parsed = parse_query_rows(trim(item));
    if (!parsed || parsed->kind == QueryRows::Kind::kDump)
      throw UsageError(fmt::format(
          "{} '{}': '{}' is not all or last:W (W >= 1 query rows, the last ones of each length, e.g. last:16)", what,
          text, trim(item)));
    if (std::find(rows.begin(), rows.end(), *parsed) == rows.end()) rows.push_back(*parsed);
  }
  if (rows.empty()) throw UsageError(fmt::format("{} is empty: give all, last:W or a list of them", what));
  return rows;
}

MaskSpec resolve_mask(const std::string& mask, const LayerInfo& layer) {
  if (mask == "auto") {
    if (!layer.causal.value_or(0)) return {};
    if (layer.window) return {Mask::kWindow, *layer.window};
    return {Mask::kCausal, 0};
  }
  if (const auto parsed = parse_mask(mask)) return *parsed;
  throw UsageError(fmt::format(
      "--mask is '{}'; it must be auto (the dump's causal and window attributes), full, causal or window:W (W keys "
      "up to and including the query's own, e.g. window:4096)",
      mask));
}

SweepPlan plan_sweep(const Dump& dump, const SweepRequest& request) {
  if (request.estimators.empty())
    throw UsageError("no estimator given: add -e SPEC (e.g. -e softmax -e vmean; `attnprobe list` shows all)");
  if (request.trials < 1) throw UsageError("--trials must be at least 1");
  if (request.metrics.empty()) throw UsageError("--metrics selects no metric");
  // The lengths asked for, each once (a repeated length would write its cases twice, which check then
  // refuses as two runs in one file).
  // A set, not a scan of the list so far: --lengths 1..1000000 took a minute to dedupe before the first
  // length was checked against the dump.
  std::vector<int64_t> asked_lengths;
  std::set<int64_t> distinct_lengths;
  for (int64_t n : request.lengths) {
    if (n < 1) throw UsageError(fmt::format("length {} is not a number of tokens: lengths must be at least 1", n));
    if (distinct_lengths.insert(n).second) asked_lengths.push_back(n);
  }
  SweepPlan plan;
  plan.seed = request.seed;
  plan.metrics = request.metrics;
  require_usage(std::isfinite(request.eps) && request.eps > 0,
                "--eps {} is not a relative error: eps_cover counts the rows within eps*|o| of o, so give a "
                "positive number such as 0.05",
                request.eps);
  plan.eps = request.eps;
  require_usage(request.recall_k >= 0, "--recall-k {} is not a number of keys: give K >= 1 (topk_recall@K)",
                request.recall_k);
  plan.recall_k = request.recall_k ? request.recall_k : kDefaultRecallK;
  const bool wants_weights = std::any_of(plan.metrics.begin(), plan.metrics.end(), is_weight_metric);
  const bool wants_kept = std::any_of(plan.metrics.begin(), plan.metrics.end(), is_selection_metric);

  std::set<std::string> seen;
  for (const std::string& text : request.estimators) {
    const Spec base = parse_spec(text);
    if (wants_weights && !states_weights(base.capabilities())) {
      throw UsageError(fmt::format(
          "'{}' cannot state the attention weights it implies, so row_tv/row_kl/topk_recall do not apply to it; "
          "estimators that can: {}. Drop those metrics or that estimator.",
          base.name(), names_where(states_weights)));
    }
    if (wants_kept && !states_kept_keys(base.capabilities()))
      throw UsageError(fmt::format(
          "'{}' reads every key it sees (it states no kept set), so the selection metrics (keys_attended, density, "
          "mass_recall, tail_mass, ...) do not apply to it; estimators that state one: {}. Drop those metrics or "
          "that estimator.",
          base.name(), names_where(states_kept_keys)));
    std::vector<Spec> variants;
    if (request.samples.empty() || !base.has_samples_knob()) {
      variants.push_back(base);
    } else {
      for (int64_t s : request.samples) variants.push_back(base.with_samples(s));
    }
    for (const Spec& spec : variants) {
      EstimatorSetting setting{spec, spec.canonical(), std::nullopt, "", spec.random() ? request.trials : 1};
      if (spec.has_samples_knob()) setting.samples = spec.samples();
      const std::string ref_text = request.reference == "auto" ? spec.target() : request.reference;
      const Spec ref = parse_spec(ref_text);
      if (ref.random())
        throw UsageError(
            fmt::format("reference '{}' is random; a reference must be deterministic (e.g. softmax, "
                        "yoso-e).",
                        ref.canonical()));
      setting.reference = ref.canonical();
      if (seen.insert(setting.canonical + "|" + setting.reference).second) plan.settings.push_back(setting);
    }
  }

  // Case metrics compare the mean over a case's trials with the reference: a plan of nothing else and no
  // setting with two trials would run every estimator and write no row.
  const bool only_case_metrics = std::all_of(plan.metrics.begin(), plan.metrics.end(), is_case_metric);
  const bool any_repeated = std::any_of(plan.settings.begin(), plan.settings.end(),
                                        [](const EstimatorSetting& setting) { return setting.trials >= 2; });
  if (only_case_metrics && !any_repeated) {
    std::vector<std::string> names;
    for (Metric m : plan.metrics) names.push_back(metric_name(m, plan.recall_k));
    throw UsageError(fmt::format(
        "--metrics {} are case metrics, over the trials of a random estimator, but no estimator here runs two "
        "trials (--trials {}): the sweep would write no row. Use --trials 2 or more, or add a per-trial metric.",
        join(names, ","), request.trials));
  }

  const bool decode =
      std::any_of(request.queries.begin(), request.queries.end(), [](QueryRows rows) { return !rows.all(); });
  // Only last:W rows: the self-attention forms are not used (an estimator may have a decode form only).
  const bool decode_only =
      std::none_of(request.queries.begin(), request.queries.end(), [](QueryRows rows) { return rows.all(); });
  if (request.queries.empty()) throw UsageError("--queries selects no query rows (use all, or last:W)");
  const auto gradient = std::find_if(plan.metrics.begin(), plan.metrics.end(), is_gradient_metric);
  if (decode && gradient != plan.metrics.end())
    throw UsageError(fmt::format(
        "{} compares backward passes, which attnprobe computes for self-attention only (--queries all); drop the "
        "gradient metrics or the last:W queries",
        metric_name(*gradient)));

  if (request.precisions.empty()) throw UsageError("--precision selects no precision (use f32, bf16, f16 or a list)");
  if (std::find(request.precisions.begin(), request.precisions.end(), Precision::kF64) != request.precisions.end())
    throw UsageError(
        "--precision f64: estimators compute in float32 (f32) or rounded below it (bf16, f16); float64 is the "
        "reference's precision, which every case is compared against already. Use f32, bf16 or f16.");
  // Below float32 a selection's kept set is the one its rounded scores choose (kept_overlap_f32, score_ties); the
  // gradients and the implied weights are the estimator's mathematics, measured in float32.
  if (std::any_of(request.precisions.begin(), request.precisions.end(), below_float32))
    for (Metric m : plan.metrics)
      if (is_gradient_metric(m) || is_weight_metric(m))
        throw UsageError(fmt::format(
            "{} is measured in float32 only: the gradient and attention-weight metrics describe the estimator's "
            "mathematics, not its rounding. Measure them in a run without bf16/f16 in --precision, and the "
            "rounding with --metrics all,precision (a selection's kept sets with --metrics selection).",
            metric_name(m, plan.recall_k)));

  std::vector<int> layer_numbers;
  for (const LayerInfo& info : dump.layers()) layer_numbers.push_back(info.number);
  for (int layer : resolve_indices(request.layers, 0, "layer", layer_numbers)) {
    const LayerInfo& info = dump.layer(layer);
    const MaskSpec mask = resolve_mask(request.mask, info);
    const std::string why =
        request.mask == "auto" ? fmt::format(" (layer {}'s mask, from the dump's attributes)", layer) : "";
    // A layer that stores its own query rows (a decode or cross-attention dump) is measured as stored.
    const bool own = info.own_queries();
    if (info.shaped() && gradient != plan.metrics.end())
      throw UsageError(fmt::format(
          "layer {} of '{}' applies {} to its scores; {} compares backward passes, which attnprobe computes without "
          "score shaping only. Drop the gradient metrics for this layer (--layers).",
          layer, dump.path(), info.shaping(), metric_name(*gradient)));
    if (own) {
      const std::string what =
          fmt::format("layer {} of '{}' stores its own {} query rows against {} keys{}", layer, dump.path(),
                      info.tokens, info.key_tokens, info.cross ? " (cross-attention)" : "");
      if (info.cross && mask.mask != Mask::kFull)
        throw UsageError(
            fmt::format("{}: cross-attention queries have no position among the keys, so only --mask "
                        "full applies (not {})",
                        what, mask_text(mask.mask, mask.window)));
      if (decode)
        throw UsageError(
            fmt::format("{}: --queries applies to self-attention dumps (it picks rows of a slice); "
                        "leave it out to measure the stored rows",
                        what));
      if (gradient != plan.metrics.end())
        throw UsageError(
            fmt::format("{}: {} compares backward passes, which attnprobe computes for self-attention "
                        "only; drop the gradient metrics",
                        what, metric_name(*gradient)));
      for (int b = 0; b < info.batch; ++b)
        for (int64_t n : asked_lengths)
          if (n != info.lengths[b])
            throw UsageError(fmt::format(
                "{}: --lengths {} would cut the cache of batch item {} ({} keys) and leave queries without their "
                "keys; leave --lengths out (each item's whole cache is used). Cache-length sweeps use a "
                "self-attention dump with --queries last:W.",
                what, n, b, info.lengths[b]));
    }
    for (const EstimatorSetting& setting : plan.settings)
      for (const Spec& spec : {setting.spec, parse_spec(setting.reference)}) {
        // A class-B estimator reads the prompt's query rows, which a dump of decode rows does not hold.
        if (own && spec.capabilities().prompt)
          throw InputError(fmt::format(
              "layer {} of '{}' stores only its own {} query rows: '{}' compresses the cache from the prompt's "
              "query rows (positions before the stored rows), which this dump does not hold. Dump the whole "
              "sequence's queries and measure its last rows with --queries last:W.",
              layer, dump.path(), info.tokens, spec.canonical()));
        // A dump of decode rows is measured by decode forms alone, as last:W rows are.
        if (info.shaped())
          require_shaping_support(spec, fmt::format("{} (layer {} of '{}')", info.shaping(), layer, dump.path()));
        if (!decode_only && !own) require_form_support(spec, mask.mask, false);
        if (decode || own) require_form_support(spec, mask.mask, true);
      }
    if (mask.mask != Mask::kFull) {
      if (gradient != plan.metrics.end())
        for (const EstimatorSetting& setting : plan.settings)
          for (const Spec& spec : {setting.spec, parse_spec(setting.reference)})
            if (spec.capabilities().backward != Backward::kNone && !spec.capabilities().backward_forms.has(mask.mask))
              throw UsageError(fmt::format(
                  "'{}' has no backward pass for its {} form yet, so {} is not computed for it under that mask{}; "
                  "estimators that have one: {}. Drop the gradient metrics or that estimator, or measure "
                  "bidirectional attention with --mask full.",
                  spec.name(), mask_name(mask.mask), metric_name(*gradient), why,
                  names_where([&](const Capabilities& can) { return can.backward_forms.has(mask.mask); })));
      if (wants_weights)
        for (const EstimatorSetting& setting : plan.settings)
          if (!setting.spec.capabilities().weights.has(mask.mask)) {
            throw UsageError(fmt::format(
                "'{}' does not state the attention weights of its {} form yet, so row_tv/row_kl/topk_recall are "
                "not computed for it under that mask{}; estimators that do: {}. Drop those metrics or that "
                "estimator, or measure bidirectional attention with --mask full.",
                setting.spec.name(), mask_name(mask.mask), why,
                names_where([&](const Capabilities& can) { return can.weights.has(mask.mask); })));
          }
    }
    const std::vector<int> heads = resolve_indices(request.heads, info.heads, "head");
    const std::vector<int> batch = resolve_indices(request.batch, info.batch, "batch item");
    std::vector<std::vector<int64_t>> lengths_of(info.batch);
    for (int b : batch) {
      std::vector<int64_t>& lengths = lengths_of[b];
      lengths = asked_lengths;
      if (lengths.empty()) lengths.push_back(info.lengths[b]);
      for (int64_t n : lengths) {
        if (n < 1 || n > info.lengths[b])
          throw InputError(fmt::format(
              "length {} is longer than layer {} batch item {} of '{}' ({} valid tokens{}). Use lengths up to {}, "
              "or leave --lengths out to use each item's full length.",
              n, layer, b, dump.path(), info.lengths[b], info.has_lengths ? ", from its lengths dataset" : "",
              info.lengths[b]));
        for (QueryRows rows : request.queries) {
          if (rows.kind == QueryRows::Kind::kLast && rows.last > n)
            throw UsageError(fmt::format(
                "--queries {} asks for more query rows than the {} keys of layer {} batch item {} at length {}; "
                "use last:W with W up to {} (or a longer --lengths)",
                query_rows_text(rows), n, layer, b, n, n));
          if (rows.prefill > n - rows.last)
            throw UsageError(fmt::format(
                "--prefill {} ends the prompt after the first evaluated row of last:{} at length {} (position "
                "{}): give P up to {} (or a longer --lengths)",
                rows.prefill, rows.last, n, n - rows.last, n - rows.last));
        }
      }
    }
    // Order: layer, head, batch item, length, query rows, precision — the runner reads one (layer, head, item) once at
    // its longest length and serves the shorter prefixes and their last rows from it.
    for (int h : heads)
      for (int b : batch)
        for (int64_t n : lengths_of[b])
          for (QueryRows rows : request.queries) {
            if (rows.prefill == n - rows.last) rows.prefill = -1;  // not lowered: the case of plain last:W
            for (Precision precision : request.precisions)
              plan.slices.push_back(SliceRef{layer, h, b, n, mask.mask, mask.window,
                                             own ? QueryRows{QueryRows::Kind::kDump, 0} : rows, precision});
          }
  }
  return plan;
}

}  // namespace attnprobe
