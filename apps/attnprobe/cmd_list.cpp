#include <fmt/format.h>

#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"
#include "attnprobe/estimators/describe.h"
#include "commands.h"

namespace attnprobe::cli {

namespace {

// One estimator as `list` prints it.
void print_estimator(const EstimatorDescription& d) {
  const EstimatorDef& def = *d.def;
  const Capabilities& can = d.capabilities;
  std::vector<std::string> devices;
  for (const DeviceDescription& device : d.devices)
    devices.push_back(device.compiled ? device.device : device.device + " (not in this build)");
  auto forms = [](const std::vector<std::string>& names) {
    return names.empty() ? std::string("—") : join(names, ", ");
  };
  std::string per_device;
  for (const DeviceDescription& device : d.devices)
    per_device += fmt::format(" {}: {} (decode: {});", device.device, forms(device.forms), forms(device.decode));
  fmt::print("{}\n    {}\n    docs/{}\n    canonical: {}\n    target: {}   samples knob: {}   {}\n", def.name,
             def.summary, def.page, d.spec, d.target, def.samples_knob.empty() ? "none" : def.samples_knob,
             d.random ? "random (runs --trials trials)" : "deterministic (one trial)");
  fmt::print("    devices: {}   masks{}:{}\n", join(devices, ", "),
             d.forms_vary ? " (not every setting: see its keys)" : "", per_device.substr(0, per_device.size() - 1));
  fmt::print("    attention weights: {}   backward: {}{}\n", forms(can.weights.names()),
             can.backward == Backward::kNone
                 ? std::string("no")
                 : fmt::format("{} ({})", backward_name(can.backward), forms(can.backward_forms.names())),
             can.selection ? "   kept keys: yes (--metrics selection)" : "");
  fmt::print("    below float32 (--precision bf16|f16): {}\n", can.rounding ? can.rounding : kInputsAndOutputRounded);
  for (const ParamDef& p : def.params)
    fmt::print("    {:<12} = {:<10} {}; {}\n", p.name, p.default_value, param_domain(p), p.help);
  fmt::print("\n");
}

}  // namespace

Action add_list(CLI::App& app) {
  auto only_variants = std::make_shared<bool>(false), only_causal = std::make_shared<bool>(false),
       only_full = std::make_shared<bool>(false), only_prompt = std::make_shared<bool>(false),
       only_rotary = std::make_shared<bool>(false), json = std::make_shared<bool>(false);
  auto markdown = std::make_shared<std::string>(), name = std::make_shared<std::string>();
  app.add_option("name", *name, "print only this estimator (e.g. `attnprobe list performer`)");
  app.add_flag("--variants", *only_variants,
               "print only the settings the baseline gate runs, one canonical spec per line: each estimator's "
               "default, each other choice of its choice keys, and its declared ablations");
  app.add_flag("--causal", *only_causal,
               "print only the names of the estimators with a causal form (what --mask causal can run), one per "
               "line; with --variants, the variants that have one (the causal gate's settings)");
  app.add_flag("--full", *only_full,
               "with --variants, print only the variants with a full (bidirectional) form (the full gate's settings: "
               "positional methods such as streaming have none)");
  app.add_flag("--prompt", *only_prompt,
               "with --variants, print only the variants measured on decode rows only: they compress the cache "
               "from a prompt or replay it (the decode gate's settings, e.g. snapkv, h2o, streaming(roll=0))");
  app.add_flag("--rotary", *only_rotary,
               "with --variants, print only the variants that read a dump's rotary frequencies (rope_inv_freq, "
               "e.g. expected(stats=rope)); without it --variants leaves them out, as dumps without the "
               "frequencies cannot run them");
  app.add_flag("--json", *json,
               "print every estimator as JSON: parameters, defaults, target, capabilities, devices with their "
               "forms and parity tolerances, variants (what Python's attnprobe.estimators() returns)");
  app.add_option("--markdown", *markdown,
                 "print a generated Markdown table: estimators (capabilities per estimator), devices (device "
                 "versions, masks and parity tolerances) or rounding (each estimator's rounding points below "
                 "float32); docs/specs.md and docs/precision.md hold them between markers")
      ->check(CLI::IsMember(markdown_table_names()));
  app.footer(
      "Example:\n  attnprobe list\n  attnprobe list performer\n  attnprobe list --variants\n  attnprobe list --causal\n"
      "  attnprobe list --variants --causal\n  attnprobe list --variants --full\n  attnprobe list --variants "
      "--prompt\n  attnprobe list --variants --prompt --rotary\n  attnprobe list --json\n  attnprobe "
      "list --markdown estimators\n\n"
      "A spec is name or name(key=value,...), e.g. yoso(m=32,tau=8); omitted keys take their defaults.");
  return [only_variants, only_causal, only_full, only_prompt, only_rotary, json, markdown, name] {
    if (!markdown->empty()) {
      fmt::print("{}", markdown_table(*markdown));
      return 0;
    }
    if (*json) {
      fmt::print("{}\n", estimators_json());
      return 0;
    }
    if (*only_variants) {
      for (const EstimatorDef* def : registered_estimators())
        for (const std::string& spec : variants(*def))
          if ((!*only_causal || parse_spec(spec).causal()) &&
              (!*only_full || parse_spec(spec).capabilities().forms.has(Mask::kFull)) &&
              (!*only_prompt || parse_spec(spec).capabilities().decode_only()) &&
              parse_spec(spec).capabilities().rotary == *only_rotary)
            fmt::print("{}\n", spec);
      return 0;
    }
    if (*only_causal) {
      for (const std::string& causal : causal_estimators()) fmt::print("{}\n", causal);
      return 0;
    }
    if (!name->empty() && !find_estimator(*name)) parse_spec(*name);  // the unknown-name error, with the names
    std::string family;
    for (const EstimatorDescription& d : describe_estimators()) {
      if (!name->empty() && d.def->name != *name) continue;
      if (name->empty() && d.def->family != family) {
        family = d.def->family;
        fmt::print("== {} ==\n", family);
      }
      print_estimator(d);
    }
    return 0;
  };
}

}  // namespace attnprobe::cli
