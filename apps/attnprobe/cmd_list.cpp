#include <fmt/format.h>

#include "attnprobe/common/text.h"
#include "attnprobe/estimators/registry.h"
#include "commands.h"

namespace attnprobe::cli {

Action add_list(CLI::App& app) {
  app.footer(
      "Example:\n  attnprobe list\n\nA spec is name or name(key=value,...), e.g. yoso(m=32,tau=8); omitted keys "
      "take their defaults.");
  return [] {
    std::string family;
    for (const EstimatorDef* def : registered_estimators()) {
      if (def->family != family) {
        family = def->family;
        fmt::print("== {} ==\n", family);
      }
      const Spec spec = parse_spec(def->name);
      fmt::print("{}\n    {}\n    canonical: {}\n    target: {}   samples knob: {}   {}\n", def->name, def->summary,
                 spec.canonical(), spec.target(), def->samples_knob.empty() ? "none" : def->samples_knob,
                 spec.random() ? "random (runs --trials trials)" : "deterministic (one trial)");
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
