// attnprobe._core: the pybind11 bindings of libattnprobe (docs/python.md). Deliberately thin: it
// converts numpy arrays to the library's row-major Eigen matrices and back, releases the GIL while
// the library works, and maps the library's errors to Python exceptions (UsageError → ValueError,
// InputError → attnprobe.InputError, a subclass of OSError). Argument coercion (torch tensors,
// dtypes), DataFrames and the documentation live in the pure-Python layer, python/attnprobe/.
//
// Numbers: every function calls the same library code as the CLI with the same keys, so
// estimate(spec, case=...) draws what `sweep` draws for that case and metrics() computes the CSV's
// values.
//
// One file per part of the module (bindings.h lists them); the numpy conversions they share are in
// arrays.h, the sweep's custom Python estimators in custom_estimators.h. This file makes the module.
#include <pybind11/pybind11.h>

#include "attnprobe/common/error.h"
#include "attnprobe/report/run_info.h"
#include "attnprobe/version.h"
#include "bindings.h"

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
  bind_registry(m);
  bind_slices(m);
  bind_estimate(m);
  bind_sweep(m);
  bind_records(m);
}
