#include "custom_estimators.h"

#include <fmt/format.h>
#include <pybind11/numpy.h>

#include <memory>

#include "arrays.h"
#include "attnprobe/common/error.h"
#include "attnprobe/estimators/registry.h"

namespace attnprobe::python {

namespace {

// The table of the sweep running on this thread; run_sweep builds its estimators on the calling thread.
thread_local CustomTable* current_custom = nullptr;

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

}  // namespace

void register_custom(const std::string& name) {
  require_usage(!name.empty() && name.find_first_of("(),= \t\n") == std::string::npos,
                "custom estimator name '{}' must be non-empty without spaces, parentheses, commas or '='", name);
  const std::string full = kCustomPrefix + name;
  if (find_estimator(full)) return;
  register_estimator(EstimatorDef{
      .name = full,
      .family = "python",
      .summary = "a Python callable fn(q, k, v, scale, causal, seed) given to attnprobe.sweep(custom=...)",
      // Causal cases pass causal=True; the Python layer checks the first such call for a leak.
      .capabilities = {.random = true, .forms = kFullAndCausal},
      .make = [name, full](const Spec&) -> std::unique_ptr<Estimator> {
        if (!current_custom || !current_custom->wrappers.count(name))
          throw UsageError(fmt::format(
              "estimator '{}' is a Python callable: pass it to attnprobe.sweep(custom={{'{}': fn}})", full, name));
        return std::make_unique<PythonEstimator>(name, current_custom);
      }});
}

CustomScope::CustomScope(CustomTable& table) { current_custom = &table; }

CustomScope::~CustomScope() { current_custom = nullptr; }

}  // namespace attnprobe::python
