#include "attnprobe/estimators/describe.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <stdexcept>

#include "attnprobe/common/text.h"

namespace attnprobe {

std::vector<EstimatorDescription> describe_estimators() {
  std::vector<EstimatorDescription> out;
  for (const EstimatorDef* def : registered_estimators()) {
    if (def->family == "python") continue;  // Python's sweep(custom=...) estimators, not the library's
    const Spec spec = parse_spec(def->name);
    EstimatorDescription d;
    d.def = def;
    d.spec = spec.canonical();
    d.target = spec.target();
    d.random = spec.random();
    d.capabilities = def->capabilities;
    d.variants = variants(*def);
    for (const std::string& text : d.variants)
      if (!(parse_spec(text).capabilities().forms == def->capabilities.forms)) d.forms_vary = true;
    for (Device device : devices_of(*def)) {
      const DeviceDeclaration& declared = *device_declaration(*def, device);
      d.devices.push_back({device_name(device), (declared.forms & def->capabilities.forms).names(),
                           (declared.decode & def->capabilities.decode).names(),
                           device == Device::kCpu ? 0.0 : declared.tolerance, device_compiled(device)});
    }
    out.push_back(std::move(d));
  }
  return out;
}

std::string estimators_json() {
  nlohmann::ordered_json all = nlohmann::ordered_json::array();
  for (const EstimatorDescription& d : describe_estimators()) {
    const EstimatorDef& def = *d.def;
    const Capabilities& can = d.capabilities;
    nlohmann::ordered_json params = nlohmann::ordered_json::array(), defaults = nlohmann::ordered_json::object();
    for (const ParamDef& p : def.params) {
      nlohmann::ordered_json param = {{"name", p.name},
                                      {"kind", p.kind == ParamKind::kInt      ? "int"
                                               : p.kind == ParamKind::kReal   ? "real"
                                               : p.kind == ParamKind::kChoice ? "choice"
                                                                              : "text"},
                                      {"default", p.default_value}};
      if (p.kind == ParamKind::kChoice) {
        param["choices"] = p.choices;
      } else if (p.kind != ParamKind::kText) {
        param["min"] = p.min;
        param["max"] = p.max;
        if (!p.choices.empty()) param["words"] = p.choices;
      }
      param["help"] = p.help;
      params.push_back(param);
      defaults[p.name] = p.default_value;
    }
    nlohmann::ordered_json devices = nlohmann::ordered_json::array();
    std::vector<std::string> device_names, causal_devices;
    for (const DeviceDescription& device : d.devices) {
      devices.push_back(nlohmann::ordered_json{{"device", device.device},
                                               {"forms", device.forms},
                                               {"decode", device.decode},
                                               {"tolerance", device.tolerance},
                                               {"compiled", device.compiled}});
      device_names.push_back(device.device);
      if (std::find(device.forms.begin(), device.forms.end(), "causal") != device.forms.end())
        causal_devices.push_back(device.device);
    }
    all.push_back(
        nlohmann::ordered_json{{"name", def.name},
                               {"family", def.family},
                               {"summary", def.summary},
                               {"page", def.page},
                               {"params", params},
                               {"defaults", defaults},
                               {"spec", d.spec},
                               {"target", d.target},
                               {"samples_knob", def.samples_knob.empty() ? nlohmann::ordered_json()
                                                                         : nlohmann::ordered_json(def.samples_knob)},
                               {"random", d.random},
                               {"forms", can.forms.names()},
                               {"forms_vary", d.forms_vary},
                               {"decode", can.decode.names()},
                               {"causal", can.forms.has(Mask::kCausal)},
                               {"weights", !can.weights.empty()},
                               {"causal_weights", can.weights.has(Mask::kCausal)},
                               {"kept_keys", can.selection},
                               {"prompt", can.prompt},
                               {"anchored", can.anchored},
                               {"shaping", can.shaping},
                               {"rounding", can.rounding ? can.rounding : kInputsAndOutputRounded},
                               {"backward", backward_name(can.backward)},
                               {"causal_backward", can.backward_forms.has(Mask::kCausal)},
                               {"devices", device_names},
                               {"causal_devices", causal_devices},
                               {"device_versions", devices},
                               {"variants", d.variants}});
  }
  return all.dump(2);
}

namespace {

std::string forms_cell(const std::vector<std::string>& forms, bool vary) {
  if (forms.empty()) return "—";
  return join(forms, ", ") + (vary ? " (not every setting)" : "");
}

std::string estimators_table() {
  std::string out =
      "| estimator | family | samples knob | draws | masks | decode | weights | backward | shaping | devices | what it "
      "is | page |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const EstimatorDescription& d : describe_estimators()) {
    const Capabilities& can = d.capabilities;
    std::vector<std::string> devices;
    for (const DeviceDescription& device : d.devices) devices.push_back(device.device);
    const std::string backward = can.backward == Backward::kNone ? "—"
                                                                 : fmt::format("{} ({})", backward_name(can.backward),
                                                                               join(can.backward_forms.names(), ", "));
    // Links relative to docs/ (the tables in docs/ itself resolve them; README's point into docs/).
    // Score shaping (a dump's bias, ALiBi, soft-cap): honoured on the CPU, by the declaration's default settings.
    out += fmt::format("| `{}` | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", d.def->name, d.def->family,
                       d.def->samples_knob.empty() ? "—" : "`" + d.def->samples_knob + "`",
                       d.random ? "random" : "deterministic", forms_cell(can.forms.names(), d.forms_vary),
                       forms_cell(can.decode.names(), false), forms_cell(can.weights.names(), false), backward,
                       can.shaping ? "cpu" : "—", join(devices, ", "), d.def->summary,
                       d.def->page.empty() ? "—" : "docs/" + d.def->page);
  }
  return out;
}

// The rounding points below float32 (--precision bf16|f16) each estimator declares.
std::string rounding_table() {
  std::string out = "| estimator | rounding points below float32 |\n|---|---|\n";
  for (const EstimatorDescription& d : describe_estimators())
    out += fmt::format("| `{}` | {} |\n", d.def->name,
                       d.capabilities.rounding ? d.capabilities.rounding : kInputsAndOutputRounded);
  return out;
}

std::string devices_table() {
  std::string out = "| estimator | device | masks | decode | parity with the CPU |\n|---|---|---|---|---|\n";
  for (const EstimatorDescription& d : describe_estimators())
    for (const DeviceDescription& device : d.devices) {
      if (device.device == "cpu") continue;
      const std::string parity = d.random ? fmt::format("same draws, ‖Δ‖_F ≤ {:g}·‖out‖_F", device.tolerance)
                                          : fmt::format("error ≤ 2× the CPU's + {:g}", device.tolerance);
      out += fmt::format("| `{}` | {} | {} | {} | {} |\n", d.def->name, device.device, forms_cell(device.forms, false),
                         forms_cell(device.decode, false), parity);
    }
  return out;
}

}  // namespace

std::vector<std::string> markdown_table_names() { return {"estimators", "devices", "rounding"}; }

std::string markdown_table(const std::string& name) {
  if (name == "estimators") return estimators_table();
  if (name == "devices") return devices_table();
  if (name == "rounding") return rounding_table();
  throw std::invalid_argument("no generated table named '" + name + "'");
}

}  // namespace attnprobe
