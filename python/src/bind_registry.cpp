// attnprobe._core's view of the estimator registry (docs/python.md): estimators() lists what `attnprobe
// list` lists, as dicts; device_status and canonical answer for one device or spec.
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "attnprobe/estimators/registry.h"
#include "bindings.h"

namespace attnprobe::python {

namespace {

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
}

}  // namespace attnprobe::python
