#include "custom_estimators.h"

#include <fmt/format.h>
#include <pybind11/numpy.h>

#include <memory>
#include <utility>

#include "arrays.h"
#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"
#include "attnprobe/estimators/redefine.h"
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

// Calls wrapper(q, k, v, scale, causal, seed, layer, head, batch, n, spec) with the GIL held, `spec` the
// setting's canonical spec (the Python layer reads the parameters back from it); the wrapper calls the user's
// function, checks and converts its result to a C-contiguous float32 n × pv array and raises an exception
// naming the case otherwise.
class PythonEstimator : public Estimator {
 public:
  PythonEstimator(std::string name, std::string spec, CustomTable* table)
      : name_(std::move(name)), spec_(std::move(spec)), wrapper_(table->wrappers.at(name_)), table_(table) {}

  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    std::lock_guard<std::mutex> one_at_a_time(table_->calls);
    // Python 3.11 ends a thread that asks for the GIL once the interpreter is finalizing (a forced
    // unwind, which the thread pool could not survive): stop this trial instead. atexit stops running
    // sweeps before finalization (stop_sweeps_at_exit), so this only catches a late call.
    if (interpreter_finalizing()) throw Interrupted("the Python interpreter is exiting");
    py::gil_scoped_acquire gil;
    py::object wrapper = py::reinterpret_borrow<py::object>(wrapper_);
    py::object result = wrapper(to_numpy(MatrixD(view.q)), to_numpy(MatrixD(view.k)), to_numpy(MatrixD(view.v)),
                                view.scale, view.mask == Mask::kCausal, ctx.key.value, view.id.layer, view.id.head,
                                view.id.batch, view.id.n, spec_);
    const auto array = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(result);
    if (!array || array.ndim() != 2 || array.shape(0) != view.n() || array.shape(1) != view.pv())
      throw std::logic_error(fmt::format("custom estimator {}: its wrapper returned no n × pv float32 array", spec_));
    out = Eigen::Map<const MatrixF>(array.data(), view.n(), view.pv());
  }

 private:
  std::string name_;
  std::string spec_;
  PyObject* wrapper_;
  CustomTable* table_;
};

// The declarations registered by this process, and how many running sweeps use each: a name is redefined only
// while no sweep runs it (a running sweep's plan holds specs of the old definition).
struct Declared {
  std::string signature;  ///< what the definition was made from (declaration_signature)
  int running = 0;
};
std::mutex declared_mutex;
std::map<std::string, Declared>& declared_names() {
  static auto* names = new std::map<std::string, Declared>;  // never destroyed: sweeps may end at exit
  return *names;
}

std::string declaration_signature(const CustomDeclaration& d) {
  std::vector<std::string> keys;
  for (const auto& [key, values] : d.params) keys.push_back(key + "=" + join(values, "|"));
  return fmt::format("({}) samples={} deterministic={}", join(keys, ","), d.samples_knob, d.deterministic);
}

EstimatorDef custom_definition(const std::string& name, const CustomDeclaration& d) {
  const std::string full = kCustomPrefix + name;
  EstimatorDef def{
      .name = full,
      .family = "python",
      .summary = "a Python callable fn(q, k, v, scale, causal, seed, **params) given to attnprobe.sweep(custom=...)",
      .samples_knob = d.samples_knob,
      // Causal cases pass causal=True; the Python layer checks every such call for a leak.
      .capabilities = {.random = !d.deterministic, .forms = kFullAndCausal},
      .make = [name, full](const Spec& spec) -> std::unique_ptr<Estimator> {
        if (!current_custom || !current_custom->wrappers.count(name))
          throw UsageError(fmt::format(
              "estimator '{}' is a Python callable: pass it to attnprobe.sweep(custom={{'{}': fn}})", full, name));
        return std::make_unique<PythonEstimator>(name, spec.canonical(), current_custom);
      }};
  for (const auto& [key, values] : d.params) {
    ParamDef param{.name = key, .default_value = values.front(), .help = "a parameter of the sweep's grid"};
    if (key == d.samples_knob) {  // any count, as sweep(samples=...) may set it: 1..2^62
      param.kind = ParamKind::kInt;
      param.min = 1;
      param.max = 4611686018427387904.0;
      param.help = "the samples knob";
    } else {
      param.kind = ParamKind::kChoice;
      param.choices = values;
    }
    def.params.push_back(std::move(param));
  }
  return def;
}

}  // namespace

void register_custom(CustomTable& table, const std::string& name, const CustomDeclaration& declared) {
  // The name is read back from specs (parentheses, commas, '=') and case ids (';'), and printed in CSVs (quotes).
  require_usage(!name.empty() && name.find_first_of("(),=;'\" \t\n\r\v\f") == std::string::npos,
                "custom name '{}': a non-empty string without spaces, quotes, parentheses, commas, ';' or '=' (the "
                "spec is py:NAME)",
                name);
  for (const auto& [key, values] : declared.params)
    require_usage(!values.empty(), "custom estimator '{}': parameter '{}' has no values", name, key);
  const std::string signature = declaration_signature(declared);
  const std::lock_guard<std::mutex> lock(declared_mutex);
  auto [it, fresh] = declared_names().try_emplace(name);
  Declared& entry = it->second;
  if (fresh || entry.signature != signature) {
    require_usage(entry.running == 0,
                  "custom estimator '{}{}' is declared as {} by a sweep running now; this sweep declares it as {}: "
                  "give it another name, or wait for that sweep",
                  kCustomPrefix, name, entry.signature, signature);
    redefine_estimator(custom_definition(name, declared));
    entry.signature = signature;
  }
  ++entry.running;
  table.held.push_back(name);
}

CustomTable::~CustomTable() {
  const std::lock_guard<std::mutex> lock(declared_mutex);
  for (const std::string& name : held) --declared_names()[name].running;
}

CustomScope::CustomScope(CustomTable& table) { current_custom = &table; }

CustomScope::~CustomScope() { current_custom = nullptr; }

}  // namespace attnprobe::python
