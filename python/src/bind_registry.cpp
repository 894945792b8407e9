// attnprobe._core's view of the estimator registry (docs/python.md): estimators() lists what `attnprobe
// list --json` prints, as dicts; device_status and canonical answer for one device or spec.
#include <string>

#include "attnprobe/estimators/describe.h"
#include "attnprobe/estimators/registry.h"
#include "bindings.h"

namespace attnprobe::python {

namespace {

// The library's description of every estimator (describe.h), as `attnprobe list --json` prints it.
py::object estimators_list() { return py::module_::import("json").attr("loads")(estimators_json()); }

}  // namespace

void bind_registry(py::module_& m) {
  m.def("estimators", &estimators_list);
  // (built, why not usable): the Python package words its own refusal (device='cuda', not --device cuda).
  m.def("device_status", [](const std::string& name) {
    const Device device = parse_device(name);
    const bool built = device_compiled(device);
    return py::make_tuple(built, built ? device_problem(device) : std::string());
  });
  m.def("canonical", [](const std::string& spec) { return parse_spec(spec).canonical(); });
  // What a sweep compares `spec` with under --reference auto (yoso → yoso-e of the same tau).
  m.def("target", [](const std::string& spec) { return parse_spec(spec).target(); });
}

}  // namespace attnprobe::python
