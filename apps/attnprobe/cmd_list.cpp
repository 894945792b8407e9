#include <fmt/format.h>

#include "attnprobe/common/text.h"
#include "attnprobe/estimators/registry.h"
#include "commands.h"

namespace attnprobe::cli {

Action add_list(CLI::App& app) {
  auto only_variants = std::make_shared<bool>(false), only_causal = std::make_shared<bool>(false);
  app.add_flag("--variants", *only_variants,
               "print only the settings the baseline gate runs, one canonical spec per line: each estimator's "
               "default, each other choice of its choice keys, and its declared ablations");
  app.add_flag("--causal", *only_causal,
               "print only the names of the estimators with a causal form (what --mask causal can run), one per "
               "line; with --variants, the variants that have one (the causal gate's settings)");
  app.footer(
      "Example:\n  attnprobe list\n  attnprobe list --variants\n  attnprobe list --causal\n  attnprobe list "
      "--variants --causal\n\nA spec is name or "
      "name(key=value,...), e.g. "
      "yoso(m=32,tau=8); omitted keys take their defaults.");
  return [only_variants, only_causal] {
    if (*only_variants) {
      for (const EstimatorDef* def : registered_estimators())
        for (const std::string& spec : variants(*def))
          if (!*only_causal || parse_spec(spec).causal()) fmt::print("{}\n", spec);
      return 0;
    }
    if (*only_causal) {
      for (const std::string& name : causal_estimators()) fmt::print("{}\n", name);
      return 0;
    }
    std::string family;
    for (const EstimatorDef* def : registered_estimators()) {
      if (def->family != family) {
        family = def->family;
        fmt::print("== {} ==\n", family);
      }
      const Spec spec = parse_spec(def->name);
      std::vector<std::string> devices, causal_devices;
      for (Device device : devices_of(*def)) devices.push_back(device_name(device));
      for (Device device : causal_devices_of(*def)) causal_devices.push_back(device_name(device));
      const std::string causal_form =
          !def->causal ? "no"
                       : fmt::format("{} on {}", def->causal_for ? "yes (not every setting: see its keys)" : "yes",
                                     join(causal_devices, ", "));
      fmt::print("{}\n    {}\n    canonical: {}\n    target: {}   samples knob: {}   {}\n", def->name, def->summary,
                 spec.canonical(), spec.target(), def->samples_knob.empty() ? "none" : def->samples_knob,
                 spec.random() ? "random (runs --trials trials)" : "deterministic (one trial)");
      fmt::print("    devices: {}   causal form: {}   attention weights: {}   backward: {}\n", join(devices, ", "),
                 causal_form, def->weights ? (def->causal_weights ? "yes (causal form too)" : "yes") : "no",
                 def->backward.empty() ? "no" : def->backward + (def->causal_backward ? " (causal form too)" : ""));
      for (const ParamDef& p : def->params) {
        std::string domain;
        switch (p.kind) {
          case ParamKind::kInt:
            domain = fmt::format("integer {}..{}", p.min, p.max);
            break;
          case ParamKind::kReal:
            domain = p.choices.empty() ? fmt::format("real {}..{}", p.min, p.max)
                                       : fmt::format("{} or real {}..{}", join(p.choices, "|"), p.min, p.max);
            break;
          case ParamKind::kChoice:
            domain = join(p.choices, "|");
            break;
        }
        fmt::print("    {:<12} = {:<10} {}; {}\n", p.name, p.default_value, domain, p.help);
      }
      fmt::print("\n");
    }
    return 0;
  };
}

}  // namespace attnprobe::cli
