// attnprobe._core: the pybind11 bindings of libattnprobe (docs/python.md). Deliberately thin: it
// converts numpy arrays to the library's row-major Eigen matrices and back, releases the GIL while
// the library works, and maps the library's errors to Python exceptions (UsageError → ValueError,
// InputError → attnprobe.InputError, a subclass of OSError). Argument coercion (torch tensors,
// dtypes), DataFrames and the documentation live in the pure-Python layer, python/attnprobe/.
//
// Numbers: every function calls the same library code as the CLI with the same keys, so
// estimate(spec, case=...) draws what `sweep` draws for that case and metrics() computes the CSV's
// values. Matrices: q, k are n × p, v n × pv, outputs n × pv, all row-major (C order) float64 or
// float32 numpy arrays; the library's outputs are handed to numpy without a copy.
//
// Custom estimators (sweep(custom=...)): each name is registered once as estimator `py:NAME`
// (family "python") whose instances call a Python callable, so the one trial runner runs them beside
// the built-ins with the same cases, keys, references and metrics. Which callable a `py:NAME`
// instance calls is decided per sweep through a thread-local table set by the sweeping thread
// (run_sweep builds its estimators on that thread), so concurrent sweeps do not see each other's.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cxxabi.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "attnprobe/common/error.h"
#include "attnprobe/common/parallel.h"
#include "attnprobe/common/text.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/exact/exact_attention.h"
#include "attnprobe/io/dump.h"
#include "attnprobe/metrics/metrics.h"
#include "attnprobe/records/csv.h"
#include "attnprobe/report/check.h"
#include "attnprobe/report/run_info.h"
#include "attnprobe/report/summary.h"
#include "attnprobe/rng/random_stream.h"
#include "attnprobe/sweep/plan.h"
#include "attnprobe/sweep/runner.h"
#include "attnprobe/sweep/shard.h"
#include "attnprobe/sweep/sweep_run.h"
#include "attnprobe/sweep/sweep_setup.h"
#include "attnprobe/version.h"

namespace py = pybind11;

namespace attnprobe::python {

namespace {

// ---- numpy ↔ Eigen -------------------------------------------------------------------------------

template <class Scalar>
using StridedMap = Eigen::Map<const Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, 0,
                              Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>>;

// Whether `a` can be read in place as a strided matrix of Scalar (positive, element-aligned strides).
// Needs the GIL: the dtype test makes and drops a reference to a numpy dtype object.
template <class Scalar>
bool mappable(const py::array& a) {
  if (!py::isinstance<py::array_t<Scalar>>(a)) return false;
  for (int d = 0; d < 2; ++d)
    if (a.strides(d) < 0 || a.strides(d) % static_cast<py::ssize_t>(sizeof(Scalar)) != 0) return false;
  return true;
}

// A 2-D float array as the code that runs without the GIL reads it: data, shape, strides and element
// type, all asked of numpy by prepared() with the GIL held. The GIL-free code must not ask numpy
// itself: a dtype test (py::isinstance<py::array_t<T>>) changes a dtype object's reference count, and
// the copy into the library's matrices runs on pool threads. It did once, and float64's reference
// count drifted by tens per 3000 calls, with an occasional segfault when it reached zero.
struct Input {
  py::object owner;  // keeps the data alive; copied and dropped with the GIL held
  const void* data = nullptr;
  int64_t rows = 0, cols = 0;
  int64_t row_stride = 0, col_stride = 0;  // in elements
  bool float64 = true;
  const char* name = "";  // the argument's name, for messages

  template <class Scalar>
  StridedMap<Scalar> map() const {
    return StridedMap<Scalar>(static_cast<const Scalar*>(data), rows, cols,
                              Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>(row_stride, col_stride));
  }
  // Whether the rows are one dense block, which Eigen copies with vector loads (the strided map
  // copies element by element).
  bool c_contiguous() const { return col_stride == 1 && row_stride == cols; }
  template <class Scalar>
  Eigen::Map<const Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> dense_rows(
      int64_t r0, int64_t count) const {
    return {static_cast<const Scalar*>(data) + r0 * cols, count, cols};
  }
  // As a float64 matrix, read in place (one pass, no numpy temporary).
  MatrixD to_matrix_d() const { return float64 ? MatrixD(map<double>()) : MatrixD(map<float>().cast<double>()); }
};

// Checks that `a` is a 2-D float array and describes it for the GIL-free code: itself when it is
// float64 or float32 with element-aligned positive strides, else a float64 C-order copy made by numpy
// (float16, long double, negative strides). Needs the GIL.
Input prepared(const py::array& given, const char* name) {
  if (given.ndim() != 2)
    throw UsageError(fmt::format("{} must be a 2-D array (tokens × dim), got {} dimension{}", name, given.ndim(),
                                 given.ndim() == 1 ? "" : "s"));
  const char kind = given.dtype().kind();
  if (kind != 'f')
    throw UsageError(fmt::format("{} must hold floating-point numbers (float16/32/64), got dtype {}", name,
                                 std::string(py::str(given.dtype()))));
  const bool float32 = mappable<float>(given);
  const py::array a = float32 || mappable<double>(given)
                          ? given
                          : py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(given);
  const auto item = static_cast<py::ssize_t>(float32 ? sizeof(float) : sizeof(double));
  Input in;
  in.owner = a;
  in.data = a.data();
  in.rows = a.shape(0);
  in.cols = a.shape(1);
  in.row_stride = a.strides(0) / item;
  in.col_stride = a.strides(1) / item;
  in.float64 = !float32;
  in.name = name;
  return in;
}

// A slice's three prepared() arrays.
struct QKV {
  Input q, k, v;
};

QKV prepared(const py::array& q, const py::array& k, const py::array& v) {
  return {prepared(q, "q"), prepared(k, "k"), prepared(v, "v")};
}

// numpy arrays that own a library matrix (moved, not copied): the capsule frees it with the array.
template <class Matrix>
py::array to_numpy(Matrix&& m) {
  using Scalar = typename std::decay_t<Matrix>::Scalar;
  auto* owned = new std::decay_t<Matrix>(std::move(m));
  py::capsule base(owned, [](void* p) { delete static_cast<std::decay_t<Matrix>*>(p); });
  const auto rows = static_cast<py::ssize_t>(owned->rows()), cols = static_cast<py::ssize_t>(owned->cols());
  const auto item = static_cast<py::ssize_t>(sizeof(Scalar));
  return py::array_t<Scalar>({rows, cols}, {cols * item, item}, owned->data(), base);
}

// ---- thread pools --------------------------------------------------------------------------------

// A pool per thread count, reused across calls (starting threads costs ~0.1 ms a call). A pool runs one
// parallel_for at a time, so a caller that finds it busy (another Python thread) gets a fresh one.
class PoolLease {
 public:
  explicit PoolLease(int threads) {
    static std::mutex table_mutex;
    static std::map<int, std::pair<std::unique_ptr<std::mutex>, std::unique_ptr<ThreadPool>>> pools;
    const int count = resolve_threads(threads);
    std::lock_guard<std::mutex> lock(table_mutex);
    auto& entry = pools[count];
    if (!entry.first) entry = {std::make_unique<std::mutex>(), std::make_unique<ThreadPool>(count)};
    if (entry.first->try_lock()) {
      held_ = entry.first.get();
      pool_ = entry.second.get();
    } else {
      own_ = std::make_unique<ThreadPool>(count);
      pool_ = own_.get();
    }
  }
  ~PoolLease() {
    if (held_) held_->unlock();
  }
  ThreadPool* get() const { return pool_; }

 private:
  std::mutex* held_ = nullptr;
  ThreadPool* pool_ = nullptr;
  std::unique_ptr<ThreadPool> own_;
};

// ---- inputs --------------------------------------------------------------------------------------

double default_scale(std::optional<double> scale, int64_t p) {
  if (!scale) return 1.0 / std::sqrt(static_cast<double>(p));  // as a dump without a scale attribute
  require_usage(std::isfinite(*scale) && *scale > 0, "scale must be a positive finite number, got {}", *scale);
  return *scale;
}

// Rows [r0, r0 + rows) of a prepared() array into `dst` (float64) and `dstf` (float32), already
// sized. One read of the input: a float64 array is copied into dst and dst's block (still in cache)
// cast into dstf; a float32 array is copied into dstf and dstf's block cast into dst.
void assign_rows(const Input& a, MatrixD& dst, MatrixF& dstf, int64_t r0, int64_t rows) {
  if (a.float64) {
    if (a.c_contiguous())
      dst.middleRows(r0, rows) = a.dense_rows<double>(r0, rows);
    else
      dst.middleRows(r0, rows) = a.map<double>().middleRows(r0, rows);
    dstf.middleRows(r0, rows) = dst.middleRows(r0, rows).cast<float>();
  } else {
    if (a.c_contiguous())
      dstf.middleRows(r0, rows) = a.dense_rows<float>(r0, rows);
    else
      dstf.middleRows(r0, rows) = a.map<float>().middleRows(r0, rows);
    dst.middleRows(r0, rows) = dstf.middleRows(r0, rows).cast<double>();
  }
}

// Refuses a NaN, an infinity, or a float64 value beyond float32's range (the estimators compute in
// float32) in rows [r0, r0 + rows), as the dump readers do for files: an estimator given one returns
// NaN, or worse a finite number (YOSO's hashes see only signs). Checked on the float32 copy, which
// holds both.
void require_finite_rows(const Input& a, const MatrixD& dst, const MatrixF& dstf, int64_t r0, int64_t rows) {
  const auto [r, j] = first_non_finite(dstf.middleRows(r0, rows));
  if (r < 0) return;
  const int64_t i = r0 + r;
  throw UsageError(std::isfinite(dst(i, j))
                       ? fmt::format("{} holds {} at row {}, column {}: beyond float32's range, in which the "
                                     "estimators compute. Rescale the inputs.",
                                     a.name, dst(i, j), i, j)
                       : fmt::format("{} holds {} at row {}, column {}: attention of non-finite inputs has no "
                                     "reference. Find where the model produced it, or drop those tokens.",
                                     a.name, dst(i, j), i, j));
}

// A prepared() array into `dst` and `dstf`, in their memory when the shape is unchanged, in blocks
// of 64 rows (the second pass reads what the first just wrote from cache rather than from memory),
// the blocks spread over `pool`'s threads (the copy is memory-bound: a second core adds bandwidth).
void assign_matrix(const Input& a, MatrixD& dst, MatrixF& dstf, ThreadPool* pool) {
  constexpr int64_t kBlockRows = 64;
  dst.resize(a.rows, a.cols);
  dstf.resize(a.rows, a.cols);
  const int64_t blocks = (a.rows + kBlockRows - 1) / kBlockRows;
  auto block = [&](int64_t b) {
    const int64_t r0 = b * kBlockRows;
    const int64_t rows = std::min(kBlockRows, a.rows - r0);
    assign_rows(a, dst, dstf, r0, rows);
    require_finite_rows(a, dst, dstf, r0, rows);
  };
  for_each_index(pool, blocks, block);
}

// Slices up to this many float64 elements (q, k, v together) are built in memory kept per thread.
constexpr int64_t kReusedElements = int64_t{4} << 20;  // 32 MiB of float64 (+16 of float32): n = 32768 at p = 64

// Checks shapes and builds the slice the library works on (float64 as given, float32 copies), in a
// per-thread view reused from call to call: on the VMs this was measured on, first-touching fresh
// pages costs ~1 ms per 2 MiB, as much as a whole performer(M=64) call at n = 4096 spends on its own
// arithmetic, while `bench` builds its slice once. Runs without the GIL: the Inputs' owners keep the
// arrays alive. The returned view is valid until this thread's next call.
void fill_view(HeadView& view, const QKV& in, std::optional<double> scale, Mask mask, SliceId id, ThreadPool* pool) {
  const Input &q = in.q, &k = in.k, &v = in.v;
  const int64_t n = q.rows, p = q.cols;
  require_usage(n >= 1 && p >= 1, "q is {}x{}: it needs at least one token and one dimension", n, p);
  require_usage(k.rows == n && k.cols == p, "k is {}x{} but q is {}x{}: keys must match queries", k.rows, k.cols, n, p);
  require_usage(v.rows == n && v.cols >= 1, "v is {}x{} but q has {} tokens: v needs one row per key", v.rows, v.cols,
                n);
  id.n = n;
  view.id = id;
  view.scale = default_scale(scale, p);
  view.mask = mask;
  assign_matrix(q, view.q, view.qf, pool);
  assign_matrix(k, view.k, view.kf, pool);
  assign_matrix(v, view.v, view.vf, pool);
  const std::string problem = magnitude_problem(view.q, view.k, view.v, view.scale);
  require_usage(problem.empty(), "{}: rescale the inputs or pass a smaller scale", problem);
}

const HeadView& make_view(const QKV& in, std::optional<double> scale, Mask mask, SliceId id, ThreadPool* pool) {
  thread_local HeadView view;
  if (in.q.rows * (2 * in.q.cols + in.v.cols) > kReusedElements) view = HeadView();  // keep no huge slice alive
  fill_view(view, in, scale, mask, id, pool);
  return view;
}

/// attnprobe.Slice: q, k, v and the scale converted once (float64 and float32 copies), for many
/// estimate() calls on one slice without rebuilding it: what `bench` times.
struct Slice {
  HeadView view;
};

// A placeholder for the q, k, v arguments when a Slice carries them.
py::array no_array() { return py::array_t<double>(std::vector<py::ssize_t>{0, 0}); }

// ---- custom (Python) estimators -------------------------------------------------------------------

// The custom estimators of one sweep: name → the Python wrapper (borrowed: the sweep's dict owns it
// for the sweep's whole duration), and a lock that lets one of them run at a time, so a function that
// seeds a global generator (torch.manual_seed) cannot be interleaved with another trial's call.
// Lock order: `calls` first, then the GIL (a thread never waits for `calls` while holding the GIL).
struct CustomTable {
  std::map<std::string, PyObject*> wrappers;
  std::mutex calls;
};
// The table of the sweep running on this thread; run_sweep builds its estimators on the calling thread.
thread_local CustomTable* current_custom = nullptr;

constexpr const char* kCustomPrefix = "py:";

bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// Calls wrapper(q, k, v, scale, causal, seed, layer, head, batch, n) with the GIL held; the wrapper (Python
// layer) calls the user's function, checks and converts its result to a C-contiguous float32 n × pv
// array and raises an exception naming the case otherwise.
class PythonEstimator : public Estimator {
 public:
  PythonEstimator(std::string name, CustomTable* table)
      : name_(std::move(name)), wrapper_(table->wrappers.at(name_)), table_(table) {}

  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    std::lock_guard<std::mutex> one_at_a_time(table_->calls);
    // Python 3.11 ends a thread that asks for the GIL once the interpreter is finalizing (a forced
    // unwind, which the thread pool could not survive): stop this trial instead. atexit stops running
    // sweeps before finalization (stop_sweeps_at_exit), so this only catches a late call.
    if (interpreter_finalizing()) throw Interrupted("the Python interpreter is exiting");
    py::gil_scoped_acquire gil;
    py::object wrapper = py::reinterpret_borrow<py::object>(wrapper_);
    py::object result =
        wrapper(to_numpy(MatrixD(view.q)), to_numpy(MatrixD(view.k)), to_numpy(MatrixD(view.v)), view.scale,
                view.mask == Mask::kCausal, ctx.key.value, view.id.layer, view.id.head, view.id.batch, view.id.n);
    const auto array = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(result);
    if (!array || array.ndim() != 2 || array.shape(0) != view.n() || array.shape(1) != view.pv())
      throw std::logic_error(
          fmt::format("custom estimator {}{}: its wrapper returned no n × pv float32 array", kCustomPrefix, name_));
    out = Eigen::Map<const MatrixF>(array.data(), view.n(), view.pv());
  }

 private:
  std::string name_;
  PyObject* wrapper_;
  CustomTable* table_;
};

void register_custom(const std::string& name) {
  require_usage(!name.empty() && name.find_first_of("(),= \t\n") == std::string::npos,
                "custom estimator name '{}' must be non-empty without spaces, parentheses, commas or '='", name);
  const std::string full = kCustomPrefix + name;
  if (find_estimator(full)) return;
  register_estimator(EstimatorDef{
      .name = full,
      .family = "python",
      .summary = "a Python callable fn(q, k, v, scale, causal, seed) given to attnprobe.sweep(custom=...)",
      .random = true,
      // Causal cases pass causal=True; the Python layer checks the first such call for a leak.
      .causal = true,
      .make = [name, full](const Spec&) -> std::unique_ptr<Estimator> {
        if (!current_custom || !current_custom->wrappers.count(name))
          throw UsageError(fmt::format(
              "estimator '{}' is a Python callable: pass it to attnprobe.sweep(custom={{'{}': fn}})", full, name));
        return std::make_unique<PythonEstimator>(name, current_custom);
      }});
}

// ---- the functions ---------------------------------------------------------------------------------

py::list estimators_list() {
  py::list out;
  for (const EstimatorDef* def : registered_estimators()) {
    if (def->family == "python") continue;  // sweep(custom=...)'s, not the library's
    const Spec spec = parse_spec(def->name);
    py::list params;
    py::dict defaults;
    for (const ParamDef& p : def->params) {
      py::dict param;
      param["name"] = p.name;
      param["kind"] = p.kind == ParamKind::kInt ? "int" : p.kind == ParamKind::kReal ? "real" : "choice";
      param["default"] = p.default_value;
      if (p.kind == ParamKind::kChoice) {
        param["choices"] = p.choices;
      } else {
        param["min"] = p.min;
        param["max"] = p.max;
      }
      param["help"] = p.help;
      params.append(param);
      defaults[py::str(p.name)] = p.default_value;
    }
    std::vector<std::string> devices, causal_devices;
    for (Device d : devices_of(*def)) devices.push_back(device_name(d));
    for (Device d : causal_devices_of(*def)) causal_devices.push_back(device_name(d));
    py::dict e;
    e["name"] = def->name;
    e["family"] = def->family;
    e["summary"] = def->summary;
    e["params"] = params;
    e["defaults"] = defaults;
    e["spec"] = spec.canonical();
    e["target"] = spec.target();
    e["samples_knob"] = def->samples_knob.empty() ? py::object(py::none()) : py::object(py::str(def->samples_knob));
    e["random"] = spec.random();
    e["causal"] = def->causal;
    e["weights"] = def->weights;
    e["causal_weights"] = def->causal_weights;
    e["backward"] = def->backward;
    e["causal_backward"] = def->causal_backward;
    e["devices"] = devices;
    e["causal_devices"] = causal_devices;
    e["variants"] = variants(*def);
    out.append(e);
  }
  return out;
}

DumpOptions dump_options(const std::string& q_path, const std::string& k_path, const std::string& v_path,
                         const std::string& layout, int num_heads) {
  return DumpOptions{q_path, k_path, v_path, layout, num_heads};
}

py::tuple load(const std::string& path, int layer, int head, int batch, std::optional<int64_t> length,
               const DumpOptions& options) {
  HeadView view;
  std::optional<int> causal;
  {
    py::gil_scoped_release release;
    const Dump dump = Dump::open(path, options);
    const LayerInfo& info = dump.layer(layer);
    require_input(head >= 0 && head < info.heads, "head {} does not exist in layer {} of '{}' (valid: 0..{})", head,
                  layer, path, info.heads - 1);
    require_input(batch >= 0 && batch < info.batch, "batch item {} does not exist in layer {} of '{}' (valid: 0..{})",
                  batch, layer, path, info.batch - 1);
    const int64_t valid = info.lengths[batch];
    const int64_t n = length.value_or(valid);
    require_input(n >= 1 && n <= valid,
                  "length {} is not in 1..{} (the valid tokens of layer {} batch item {} of '{}')", n, valid, layer,
                  batch, path);
    view = dump.read_slice(layer, head, batch, n);
    causal = info.causal;
  }
  return py::make_tuple(to_numpy(std::move(view.q)), to_numpy(std::move(view.k)), to_numpy(std::move(view.v)),
                        view.scale, causal.value_or(0) != 0);
}

py::array exact(const HeadView* given, const py::array& q, const py::array& k, const py::array& v,
                std::optional<double> scale, Mask mask, bool float64, int threads) {
  const std::optional<QKV> in = given ? std::nullopt : std::optional<QKV>(prepared(q, k, v));
  MatrixD out64;
  MatrixF out32;
  {
    py::gil_scoped_release release;
    PoolLease pool(threads);
    const HeadView& view = given ? *given : make_view(*in, scale, mask, SliceId{}, pool.get());
    if (float64)
      out64 = exact_attention_f64(view.q, view.k, view.v, view.scale, pool.get(), view.mask);
    else
      exact_attention_f32(view.qf, view.kf, view.vf, static_cast<float>(view.scale), out32, pool.get(), view.mask);
  }
  return float64 ? to_numpy(std::move(out64)) : to_numpy(std::move(out32));
}

// A trial number as the keys take it.
uint32_t checked_trial(int64_t trial) {
  require_usage(trial >= 0 && trial <= 0xffffffffLL, "trial must be in 0..2^32-1, got {}", trial);
  return static_cast<uint32_t>(trial);
}

py::array estimate_view(const std::string& spec_text, const HeadView* given, const py::array& q, const py::array& k,
                        const py::array& v, std::optional<double> scale, Mask mask, uint64_t seed, int64_t trial,
                        int layer, int head, int batch, int threads, const std::string& device) {
  const std::optional<QKV> in = given ? std::nullopt : std::optional<QKV>(prepared(q, k, v));
  const Spec spec = parse_spec(spec_text);
  require_usage(spec.def().family != "python",
                "'{}' is a Python callable of a sweep; call it directly rather than through estimate()", spec_text);
  if (given) mask = given->mask;
  require_mask_support(spec, mask, parse_device(device));  // the sweep's refusal (exit 2 there)
  MatrixF out;
  {
    py::gil_scoped_release release;
    const std::unique_ptr<Estimator> estimator = make_estimator(spec, parse_device(device));
    PoolLease pool(threads);
    const HeadView& view = given ? *given : make_view(*in, scale, mask, SliceId{}, pool.get());
    const RandomKey key =
        case_key(seed, SliceRef{layer, head, batch, view.n(), view.mask}, spec.canonical(), checked_trial(trial));
    estimator->estimate(view, EstimateContext{key, pool.get()}, out);
  }
  return to_numpy(std::move(out));
}

// What the sweep compares `spec` against when it is the reference (the runner's reference_output).
py::array reference(const std::string& spec_text, const HeadView* given, const py::array& q, const py::array& k,
                    const py::array& v, std::optional<double> scale, Mask mask, int threads) {
  const std::optional<QKV> in = given ? std::nullopt : std::optional<QKV>(prepared(q, k, v));
  const Spec spec = parse_spec(spec_text);
  require_usage(!spec.random(), "reference '{}' is random; a reference must be deterministic (e.g. softmax, yoso-e)",
                spec.canonical());
  if (given) mask = given->mask;
  require_mask_support(spec, mask);
  MatrixD out;
  {
    py::gil_scoped_release release;
    const std::unique_ptr<Estimator> estimator = spec.make();
    PoolLease pool(threads);
    const HeadView& view = given ? *given : make_view(*in, scale, mask, SliceId{}, pool.get());
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
    require_usage(!is_case_metric(m) && !is_weight_metric(m) && !is_gradient_metric(m),
                  "metrics() compares one estimate with a reference; {} is {}: sweep() computes it", metric_name(m),
                  is_case_metric(m)     ? "a case metric, over the trials of a random estimator"
                  : is_weight_metric(m) ? "a metric of the attention weights an estimator implies"
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

struct SweepArgs {
  std::string dump;
  DumpOptions options;
  std::vector<std::string> estimators;
  std::vector<int64_t> samples;
  std::string layers, heads, batch;
  std::vector<int64_t> lengths;
  int trials = 8;
  uint64_t seed = 0;
  int threads = 0;
  std::string device, reference, metrics;
  std::string output, mode;   ///< mode: create | resume | overwrite
  std::string shard;          ///< "I/N" as the CLI's --shard; "" for the whole plan
  std::string mask = "auto";  ///< auto | full | causal, as the CLI's --mask
  std::vector<std::string> command_line;
};

// Runs `work` on a thread of its own while this (the calling Python) thread waits, looking at
// Python's signals every 100 ms: a KeyboardInterrupt (Ctrl-C) or any exception a signal handler
// raises sets `stop`, the work stops after its running trials (RunOptions::stop_requested) and the
// Python exception is raised here. Without this a sweep could not be interrupted from Python: signal
// handlers run only on the main thread, between bytecodes, never while it sits in C++.
// The stop flags of the sweeps running in this process: interpreter exit stops them and waits for them
// (stop_sweeps_at_exit, registered with atexit), so no sweep thread is inside the library when Python
// finalizes. Never destroyed: it is used at exit.
struct RunningSweeps {
  std::mutex mutex;
  std::condition_variable changed;
  std::set<std::atomic<bool>*> stops;
};
RunningSweeps& running_sweeps() {
  static auto* sweeps = new RunningSweeps;
  return *sweeps;
}

void stop_sweeps_at_exit() {
  py::gil_scoped_release release;  // the sweeps' custom estimators and their waiting threads need it
  RunningSweeps& sweeps = running_sweeps();
  std::unique_lock<std::mutex> lock(sweeps.mutex);
  for (std::atomic<bool>* stop : sweeps.stops) stop->store(true);
  sweeps.changed.wait_for(lock, std::chrono::seconds(60), [&] { return sweeps.stops.empty(); });
}

void run_interruptibly(const std::function<void()>& work, std::atomic<bool>& stop) {
  std::exception_ptr error;
  std::mutex mutex;
  std::condition_variable done_signal;
  bool done = false;
  RunningSweeps& sweeps = running_sweeps();
  {
    std::lock_guard<std::mutex> lock(sweeps.mutex);
    sweeps.stops.insert(&stop);
  }
  std::thread worker([&] {
    struct Unregister {
      RunningSweeps& sweeps;
      std::atomic<bool>* stop;
      ~Unregister() {
        std::lock_guard<std::mutex> lock(sweeps.mutex);
        sweeps.stops.erase(stop);
        sweeps.changed.notify_all();
      }
    } unregister{sweeps, &stop};
    try {
      work();
    } catch (abi::__forced_unwind&) {  // the thread is being ended (pthread_exit): let it end
      throw;
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mutex);
    done = true;
    done_signal.notify_one();
  });
  // If this thread is unwound (Python 3.11 ends a daemon thread that reacquires the GIL during
  // finalization), the worker is stopped and joined first: a joinable std::thread would terminate().
  struct StopAndJoin {
    std::thread& worker;
    std::atomic<bool>& stop;
    ~StopAndJoin() {
      if (!worker.joinable()) return;
      stop.store(true);
      worker.join();
    }
  } stop_and_join{worker, stop};
  bool signalled = false;
  for (bool finished = false; !finished;) {
    // The GIL is given up and taken back by plain calls, not by gil_scoped_release: Python 3.11 ends a
    // daemon thread that takes it back during finalization with a forced unwind, which leaving a
    // destructor turns into terminate(); from a plain call it unwinds through StopAndJoin.
    PyThreadState* state = PyEval_SaveThread();
    {
      std::unique_lock<std::mutex> lock(mutex);
      finished = done_signal.wait_for(lock, std::chrono::milliseconds(100), [&] { return done; });
    }
    if (finished) worker.join();  // without the GIL: a custom estimator may hold it until the worker ends
    PyEval_RestoreThread(state);
    if (!finished && !signalled && PyErr_CheckSignals() != 0) {  // the handler raised: stop, then raise it
      signalled = true;
      stop.store(true);
    }
  }
  if (signalled) {
    if (error) {
      try {
        std::rethrow_exception(error);
      } catch (const Interrupted&) {  // the expected end; the Python exception below says why
      }
    }
    throw py::error_already_set();
  }
  if (error) std::rethrow_exception(error);
}

// The library's sweep options from the Python layer's (checked and coerced there).
SweepOptions sweep_options(const SweepArgs& a) {
  SweepOptions o;
  o.request.estimators = a.estimators;
  o.request.samples = a.samples;
  o.request.layers = a.layers;
  o.request.heads = a.heads;
  o.request.batch = a.batch;
  o.request.lengths = a.lengths;
  o.request.trials = a.trials;
  o.request.seed = a.seed;
  o.request.reference = a.reference;
  o.request.metrics = parse_metrics(a.metrics);
  o.request.mask = a.mask;
  if (!a.shard.empty()) o.shard = ShardSpec::parse(a.shard);
  o.threads = a.threads;
  o.device = a.device;
  o.command_line = a.command_line;
  return o;
}

// Runs a sweep; returns the trial CSV text when there is no output file (else None: the caller
// reads the file, which holds the rows kept by a resume too).
py::object sweep(const SweepArgs& a, const py::dict& custom) {
  CustomTable table;
  for (auto [name, wrapper] : custom) {
    register_custom(py::cast<std::string>(name));
    table.wrappers[py::cast<std::string>(name)] = wrapper.ptr();
  }
  std::string text;
  std::atomic<bool> stop{false};
  run_interruptibly(
      [&] {
        current_custom = &table;
        struct Reset {
          ~Reset() { current_custom = nullptr; }
        } reset;
        Dump dump = Dump::open(a.dump, a.options);
        SweepSetup setup = set_up_sweep(std::move(dump), sweep_options(a));
        setup.run.stop_requested = [&stop] { return stop.load(std::memory_order_relaxed); };
        if (a.output.empty()) {
          std::vector<TrialRow> rows;
          run_sweep(setup.dump, setup.part.plan, setup.run,
                    [&](const std::vector<TrialRow>& slice) { rows.insert(rows.end(), slice.begin(), slice.end()); });
          text = trial_csv_text(rows);
        } else {
          const OutputMode mode = a.mode == "resume"      ? OutputMode::kResume
                                  : a.mode == "overwrite" ? OutputMode::kOverwrite
                                                          : OutputMode::kCreate;
          SweepRun run(setup.dump, std::move(setup.part.plan), a.output, mode, setup.run, setup.info);
          run.run();
        }
      },
      stop);
  if (a.output.empty()) return py::str(text);
  return py::none();
}

// Rows handed over from pandas as text fields in the schema's column order (the Python layer formats
// them), parsed by the schema's own column table.
// A negative value of one of attnprobe's metrics is refused as the CSV readers refuse it.
template <class Row>
std::vector<Row> parse_rows(const std::vector<Column<Row>>& columns, const std::vector<std::vector<std::string>>& rows,
                            const std::string& what) {
  std::vector<Row> out(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string where = fmt::format("{} row {}", what, i);
    parse_row(columns, rows[i], where, out[i]);
    require_possible_values(where, out[i]);
  }
  return out;
}

// Rows for the gate, validated as `attnprobe check` validates its files (report/check.h, gate_input).
std::vector<SummaryRow> gate_rows(bool summary, const std::vector<std::vector<std::string>>& rows,
                                  const std::string& what, bool baseline) {
  CsvContents contents;
  contents.summary = summary;
  if (summary)
    contents.summaries = parse_rows(summary_columns(), rows, what);
  else
    contents.trials = parse_rows(trial_columns(), rows, what);
  return gate_input(contents, what, baseline);
}

// Rows handed over from pandas, validated like the CSV readers' (read_csv's check of a DataFrame).
void validate_rows(bool summary, const std::vector<std::vector<std::string>>& rows) {
  if (summary)
    parse_rows(summary_columns(), rows, "summary");
  else
    parse_rows(trial_columns(), rows, "trial");
}

std::string summarize(bool summary, const std::vector<std::vector<std::string>>& rows,
                      const std::vector<std::string>& over) {
  std::vector<SummaryRow> result;
  {
    py::gil_scoped_release release;
    result = summary ? parse_rows(summary_columns(), rows, "summary")
                     : summarize_trials(parse_rows(trial_columns(), rows, "trial"));
    if (!over.empty()) {
      result = summarize_over(result, over);
    } else {
      require_usage(!summary, "the input is already a summary; give over=[...] to aggregate it further");
    }
  }
  return summary_csv_text(result);
}

std::string check(bool new_summary, const std::vector<std::vector<std::string>>& new_rows, bool base_summary,
                  const std::vector<std::vector<std::string>>& base_rows, double z, double atol, double rtol,
                  const std::vector<std::string>& metric_names) {
  require_usage(z >= 0 && atol >= 0 && rtol >= 0, "z, atol and rtol must be >= 0");
  CheckOptions options{z, atol, rtol, metric_names};
  py::gil_scoped_release release;
  validate_check_options(options);
  const CheckReport report = check_regressions(gate_rows(base_summary, base_rows, "baseline", true),
                                               gate_rows(new_summary, new_rows, "new", false), options);
  return check_report_json(report, options);
}

std::vector<std::string> column_names(bool summary) {
  std::vector<std::string> names;
  if (summary)
    for (const auto& c : summary_columns()) names.push_back(c.name);
  else
    for (const auto& c : trial_columns()) names.push_back(c.name);
  return names;
}

}  // namespace

}  // namespace attnprobe::python

PYBIND11_MODULE(_core, m) {
  using namespace attnprobe;
  using namespace attnprobe::python;
  m.doc() = "attnprobe's C++ core (use the attnprobe package, not this module)";
  static py::exception<InputError> input_error(m, "InputError", PyExc_OSError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const UsageError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const InputError& e) {
      input_error(e.what());
    }
  });
  m.attr("__version__") = kVersion;
  m.def("version", &attnprobe_version);
  m.def("stop_sweeps_at_exit", &stop_sweeps_at_exit);

  m.def("estimators", &estimators_list);
  // (built, why not usable): the Python package words its own refusal (device='cuda', not --device cuda).
  m.def("device_status", [](const std::string& name) {
    const Device device = parse_device(name);
    const bool built = device_compiled(device);
    return py::make_tuple(built, built ? device_problem(device) : std::string());
  });
  m.def("canonical", [](const std::string& spec) { return parse_spec(spec).canonical(); });
  m.def("case_id", [](int layer, int head, int batch, int64_t n, const std::string& spec, bool causal) {
    // A custom estimator's spec is its name, registered only once a sweep has run it.
    const std::string canonical = spec.rfind(kCustomPrefix, 0) == 0 ? spec : parse_spec(spec).canonical();
    return case_id(SliceRef{layer, head, batch, n, causal ? Mask::kCausal : Mask::kFull}, canonical);
  });
  m.def("random_key", [](uint64_t seed, const std::string& case_text, int64_t trial) {
    return make_random_key(seed, case_text, checked_trial(trial)).value;
  });
  m.def("dump_options", &dump_options);
  py::class_<DumpOptions>(m, "DumpOptions");
  m.def("load", &load);
  py::class_<Slice>(m, "Slice")
      .def(py::init([](py::array q, py::array k, py::array v, std::optional<double> scale, bool causal) {
             const QKV in = prepared(q, k, v);
             auto slice = std::make_unique<Slice>();
             py::gil_scoped_release release;
             fill_view(slice->view, in, scale, causal ? Mask::kCausal : Mask::kFull, SliceId{}, nullptr);
             return slice;
           }),
           py::arg("q"), py::arg("k"), py::arg("v"), py::arg("scale") = py::none(), py::arg("causal") = false)
      .def_property_readonly("scale", [](const Slice& s) { return s.view.scale; })
      .def_property_readonly("causal", [](const Slice& s) { return s.view.mask == Mask::kCausal; })
      .def_property_readonly("n", [](const Slice& s) { return s.view.n(); })
      .def_property_readonly("p", [](const Slice& s) { return s.view.p(); })
      .def_property_readonly("pv", [](const Slice& s) { return s.view.pv(); })
      .def_property_readonly("q", [](const Slice& s) { return to_numpy(MatrixD(s.view.q)); })
      .def_property_readonly("k", [](const Slice& s) { return to_numpy(MatrixD(s.view.k)); })
      .def_property_readonly("v", [](const Slice& s) { return to_numpy(MatrixD(s.view.v)); });
  m.def("exact",
        [](py::array q, py::array k, py::array v, std::optional<double> scale, bool causal, bool float64, int threads) {
          return exact(nullptr, q, k, v, scale, causal ? Mask::kCausal : Mask::kFull, float64, threads);
        });
  m.def("exact_slice", [](const Slice& s, bool float64, int threads) {
    return exact(&s.view, no_array(), no_array(), no_array(), std::nullopt, s.view.mask, float64, threads);
  });
  m.def("estimate",
        [](const std::string& spec, py::array q, py::array k, py::array v, std::optional<double> scale, bool causal,
           uint64_t seed, int64_t trial, int layer, int head, int batch, int threads, const std::string& device) {
          return estimate_view(spec, nullptr, q, k, v, scale, causal ? Mask::kCausal : Mask::kFull, seed, trial, layer,
                               head, batch, threads, device);
        });
  m.def("estimate_slice", [](const std::string& spec, const Slice& s, uint64_t seed, int64_t trial, int layer, int head,
                             int batch, int threads, const std::string& device) {
    return estimate_view(spec, &s.view, no_array(), no_array(), no_array(), std::nullopt, s.view.mask, seed, trial,
                         layer, head, batch, threads, device);
  });
  m.def("reference", [](const std::string& spec, py::array q, py::array k, py::array v, std::optional<double> scale,
                        bool causal, int threads) {
    return reference(spec, nullptr, q, k, v, scale, causal ? Mask::kCausal : Mask::kFull, threads);
  });
  m.def("reference_slice", [](const std::string& spec, const Slice& s, int threads) {
    return reference(spec, &s.view, no_array(), no_array(), no_array(), std::nullopt, s.view.mask, threads);
  });
  m.def("metrics", &metrics);
  m.def("metric_names", [] {
    std::vector<std::string> names;
    for (Metric metric : all_metrics()) names.push_back(metric_name(metric));
    return names;
  });
  m.def("column_names", &column_names);

  py::class_<SweepArgs>(m, "SweepArgs")
      .def(py::init<>())
      .def_readwrite("dump", &SweepArgs::dump)
      .def_readwrite("options", &SweepArgs::options)
      .def_readwrite("estimators", &SweepArgs::estimators)
      .def_readwrite("samples", &SweepArgs::samples)
      .def_readwrite("layers", &SweepArgs::layers)
      .def_readwrite("heads", &SweepArgs::heads)
      .def_readwrite("batch", &SweepArgs::batch)
      .def_readwrite("lengths", &SweepArgs::lengths)
      .def_readwrite("trials", &SweepArgs::trials)
      .def_readwrite("seed", &SweepArgs::seed)
      .def_readwrite("threads", &SweepArgs::threads)
      .def_readwrite("device", &SweepArgs::device)
      .def_readwrite("reference", &SweepArgs::reference)
      .def_readwrite("metrics", &SweepArgs::metrics)
      .def_readwrite("output", &SweepArgs::output)
      .def_readwrite("mode", &SweepArgs::mode)
      .def_readwrite("shard", &SweepArgs::shard)
      .def_readwrite("mask", &SweepArgs::mask)
      .def_readwrite("command_line", &SweepArgs::command_line);
  m.def("sweep", &sweep);
  m.def("summarize", &summarize);
  m.def("check", &check);
  m.def("validate_rows", &validate_rows);
  m.def("hardware_threads", &hardware_threads);
  m.def("parse_int_list", [](const std::string& text, const std::string& what) { return parse_int_list(text, what); });
}
