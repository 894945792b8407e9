// attnprobe._core's estimates (docs/python.md): exact attention, one estimator's output, a reference and
// the metrics between two outputs, each computed by the library code the sweep runs, with the sweep's
// keys: estimate(spec, case=...) draws what `sweep` draws for that case, and metrics() computes the
// CSV's values.
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "arrays.h"
#include "attnprobe/common/error.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/rounded_estimate.h"
#include "attnprobe/exact/exact_at_precision.h"
#include "attnprobe/exact/exact_attention.h"
#include "attnprobe/metrics/metrics.h"
#include "attnprobe/sweep/plan.h"
#include "attnprobe/sweep/runner.h"
#include "attnprobe/view/rounded_view.h"
#include "bindings.h"
#include "custom_estimators.h"

namespace attnprobe::python {

namespace {

// The case a view's draws belong to, as the sweep names it: n is the keys (the cache length), the mask
// and the query rows are the view's (all for self-attention, last:W for the last W rows, dump otherwise).
// case_key leaves the query rows out, so the last rows draw what the whole slice draws.
SliceRef slice_ref(const HeadView& view, int layer, int head, int batch) {
  QueryRows rows;
  if (!view.self_attention())
    rows = view.positions.empty() && view.first_position == view.keys() - view.n()
               ? QueryRows{QueryRows::Kind::kLast, view.n()}
               : QueryRows{QueryRows::Kind::kDump, 0};
  return SliceRef{layer, head, batch, view.keys(), view.mask, view.window, rows};
}

// Exact attention in `precision_name`: f64 the reference, f32 the blocked kernel, bf16/f16 at FlashAttention-2's
// rounding points (exact_attention_at).
py::array exact(const HeadView* given, const py::array& q, const py::array& k, const py::array& v,
                std::optional<double> scale, const QueryPlacement& placement, const std::string& precision_name,
                int threads) {
  const Precision precision = parse_precision(precision_name);
  const std::optional<QKV> in = given ? std::nullopt : std::optional<QKV>(prepared(q, k, v));
  MatrixD out64;
  MatrixF out32;
  {
    py::gil_scoped_release release;
    PoolLease pool(threads);
    const HeadView& view = given ? *given : make_view(*in, scale, placement, SliceId{}, pool.get());
    if (precision == Precision::kF64)
      out64 = exact_attention_f64(view.q, view.k, view.v, view.scale, pool.get(), view.geometry(), &view.shaping);
    else
      out32 = exact_attention_at(view, precision, pool.get());
  }
  return precision == Precision::kF64 ? to_numpy(std::move(out64)) : to_numpy(std::move(out32));
}

// A trial number as the keys take it.
uint32_t checked_trial(int64_t trial) {
  require_usage(trial >= 0 && trial <= 0xffffffffLL, "trial must be in 0..2^32-1, got {}", trial);
  return static_cast<uint32_t>(trial);
}

py::array estimate_view(const std::string& spec_text, const HeadView* given, const py::array& q, const py::array& k,
                        const py::array& v, std::optional<double> scale, const QueryPlacement& placement, uint64_t seed,
                        int64_t trial, int layer, int head, int batch, int threads, const std::string& device_name,
                        const std::string& precision_name) {
  const std::optional<QKV> in = given ? std::nullopt : std::optional<QKV>(prepared(q, k, v));
  const Spec spec = parse_spec(spec_text);
  require_usage(spec.def().family != "python",
                "'{}' is a Python callable of a sweep; call it directly rather than through estimate()", spec_text);
  const Device device = parse_device(device_name);
  const uint32_t checked = checked_trial(trial);
  const Precision precision = parse_precision(precision_name);
  require_usage(precision != Precision::kF64,
                "estimate() computes in f32, bf16 or f16; the float64 evaluation of a deterministic estimator is "
                "reference()");
  require_usage(device == Device::kCpu || !below_float32(precision),
                "precision {} rounds at the points the CPU version declares: use device=\"cpu\"", precision_name);
  MatrixF out;
  {
    py::gil_scoped_release release;
    PoolLease pool(threads);
    const HeadView& view = given ? *given : make_view(*in, scale, placement, SliceId{}, pool.get());
    // The sweep's refusal (exit 2 there): the geometry is known once the view is.
    require_form_support(spec, view.mask, !view.self_attention(), device);
    if (view.shaping.any()) require_shaping_support(spec, view.shaping.description(), device);
    const std::unique_ptr<Estimator> estimator = make_estimator(spec, device);
    const SliceRef slice = slice_ref(view, layer, head, batch);
    const RandomKey key = case_key(seed, slice, spec.canonical(), checked);
    // The draws a kv group shares (magicpig's tables) are keyed by kv head; a Python slice knows no grouping, so
    // its kv head is its head: the sweep's key for a dump without grouped queries.
    const EstimateContext ctx{key, pool.get(), group_case_key(seed, slice, head, spec.canonical(), checked)};
    if (below_float32(precision))
      estimate_at_precision(*estimator, rounded_view(view, precision), ctx, precision, out);
    else
      estimator->estimate(view, ctx, out);
  }
  return to_numpy(std::move(out));
}

// What the sweep compares `spec` against when it is the reference (the runner's reference_output).
py::array reference(const std::string& spec_text, const HeadView* given, const py::array& q, const py::array& k,
                    const py::array& v, std::optional<double> scale, const QueryPlacement& placement, int threads) {
  const std::optional<QKV> in = given ? std::nullopt : std::optional<QKV>(prepared(q, k, v));
  const Spec spec = parse_spec(spec_text);
  require_usage(!spec.random(), "reference '{}' is random; a reference must be deterministic (e.g. softmax, yoso-e)",
                spec.canonical());
  MatrixD out;
  {
    py::gil_scoped_release release;
    PoolLease pool(threads);
    const HeadView& view = given ? *given : make_view(*in, scale, placement, SliceId{}, pool.get());
    require_form_support(spec, view.mask, !view.self_attention());
    if (view.shaping.any()) require_shaping_support(spec, view.shaping.description());
    const std::unique_ptr<Estimator> estimator = spec.make();
    out = reference_output(*estimator, view, pool.get());
  }
  return to_numpy(std::move(out));
}

std::vector<std::pair<std::string, double>> metrics(const py::array& reference, const py::array& estimate,
                                                    const std::string& names) {
  const Input ref_in = prepared(reference, "reference"), est_in = prepared(estimate, "estimate");
  require_usage(ref_in.rows == est_in.rows && ref_in.cols == est_in.cols,
                "reference is {}x{} but estimate is {}x{}: they must have the same shape", ref_in.rows, ref_in.cols,
                est_in.rows, est_in.cols);
  require_usage(ref_in.rows >= 1 && ref_in.cols >= 1,
                "reference and estimate are {}x{}: they need at least one row and one column", ref_in.rows,
                ref_in.cols);
  const std::vector<Metric> which = parse_metrics(names);
  for (Metric m : which)
    require_usage(!is_case_metric(m) && !is_weight_metric(m) && !is_selection_metric(m) && !is_gradient_metric(m),
                  "metrics() compares one estimate with a reference; {} is {}: sweep() computes it", metric_name(m),
                  is_case_metric(m)        ? "a case metric, over the trials of a random estimator"
                  : is_weight_metric(m)    ? "a metric of the attention weights an estimator implies"
                  : is_selection_metric(m) ? "a metric of the keys a selection estimator reads"
                                           : "a metric of the backward pass");
  std::vector<double> values;
  {
    py::gil_scoped_release release;
    const MatrixD ref = ref_in.to_matrix_d();
    // The CSV's metrics compare the float64 reference with the estimator's float32 output.
    const MatrixF est = est_in.float64 ? MatrixF(est_in.map<double>().cast<float>()) : MatrixF(est_in.map<float>());
    values = compute_metrics(ref, reference_norms(ref), est, which);
  }
  std::vector<std::pair<std::string, double>> out;
  for (size_t i = 0; i < which.size(); ++i) out.emplace_back(metric_name(which[i]), values[i]);
  return out;
}

}  // namespace

void bind_estimate(py::module_& m) {
  m.def("case_id", [](int layer, int head, int batch, int64_t n, const std::string& spec, const std::string& mask,
                      const std::string& queries, const std::string& precision) {
    // A custom estimator's spec is its name, registered only once a sweep has run it.
    const std::string canonical = spec.rfind(kCustomPrefix, 0) == 0 ? spec : parse_spec(spec).canonical();
    const MaskSpec geometry = parse_placement(mask, std::nullopt, false).mask;
    const std::optional<QueryRows> rows = parse_query_rows(queries);
    require_usage(rows.has_value(), "queries='{}': use 'all', 'last:W' (W >= 1) or 'dump'", queries);
    return case_id(SliceRef{layer, head, batch, n, geometry.mask, geometry.window, *rows, parse_precision(precision)},
                   canonical);
  });
  m.def("random_key", [](uint64_t seed, const std::string& case_text, int64_t trial) {
    return make_random_key(seed, case_text, checked_trial(trial)).value;
  });
  // The geometry arguments (mask, q_positions, cross) and the score shaping (bias, softcap, alibi_slope,
  // bias_before_softcap) as parse_placement takes them.
  using Positions = std::optional<std::vector<int64_t>>;
  using Bias = std::optional<py::array>;
  m.def("exact", [](py::array q, py::array k, py::array v, std::optional<double> scale, const std::string& mask,
                    Positions positions, bool cross, Bias bias, double softcap, double alibi_slope, bool bias_first,
                    const std::string& precision, int threads) {
    return exact(nullptr, q, k, v, scale,
                 parse_placement(mask, std::move(positions), cross, bias, softcap, alibi_slope, bias_first), precision,
                 threads);
  });
  m.def("exact_slice", [](const Slice& s, const std::string& precision, int threads) {
    return exact(&s.view, no_array(), no_array(), no_array(), std::nullopt, {}, precision, threads);
  });
  // Each element (as float32) rounded to a precision: what --precision does to the inputs.
  m.def("round_to", [](py::array_t<float, py::array::c_style | py::array::forcecast> x, const std::string& precision) {
    const Precision chosen = parse_precision(precision);
    py::array_t<float> out(x.request().shape);
    std::copy(x.data(), x.data() + x.size(), out.mutable_data());
    round_in_place(out.mutable_data(), static_cast<int64_t>(out.size()), chosen);
    return out;
  });
  m.def("estimate", [](const std::string& spec, py::array q, py::array k, py::array v, std::optional<double> scale,
                       const std::string& mask, Positions positions, bool cross, Bias bias, double softcap,
                       double alibi_slope, bool bias_first, uint64_t seed, int64_t trial, int layer, int head,
                       int batch, int threads, const std::string& device, const std::string& precision) {
    return estimate_view(spec, nullptr, q, k, v, scale,
                         parse_placement(mask, std::move(positions), cross, bias, softcap, alibi_slope, bias_first),
                         seed, trial, layer, head, batch, threads, device, precision);
  });
  m.def("estimate_slice", [](const std::string& spec, const Slice& s, uint64_t seed, int64_t trial, int layer, int head,
                             int batch, int threads, const std::string& device, const std::string& precision) {
    return estimate_view(spec, &s.view, no_array(), no_array(), no_array(), std::nullopt, {}, seed, trial, layer, head,
                         batch, threads, device, precision);
  });
  m.def("reference", [](const std::string& spec, py::array q, py::array k, py::array v, std::optional<double> scale,
                        const std::string& mask, Positions positions, bool cross, Bias bias, double softcap,
                        double alibi_slope, bool bias_first, int threads) {
    return reference(spec, nullptr, q, k, v, scale,
                     parse_placement(mask, std::move(positions), cross, bias, softcap, alibi_slope, bias_first),
                     threads);
  });
  m.def("reference_slice", [](const std::string& spec, const Slice& s, int threads) {
    return reference(spec, &s.view, no_array(), no_array(), no_array(), std::nullopt, {}, threads);
  });
  m.def("metrics", &metrics);
  m.def("metric_names", [] {
    std::vector<std::string> names;
    for (Metric metric : all_metrics()) names.push_back(metric_name(metric));
    return names;
  });
}

}  // namespace attnprobe::python
