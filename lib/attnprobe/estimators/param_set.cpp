#include "attnprobe/estimators/param_set.h"

#include <fmt/format.h>

namespace attnprobe {

std::string param_domain(const ParamDef& p) {
  switch (p.kind) {
    case ParamKind::kInt:
      return fmt::format("integer {}..{}", p.min, p.max);
    case ParamKind::kReal:
      return p.choices.empty() ? fmt::format("real {}..{}", p.min, p.max)
                               : fmt::format("{} or real {}..{}", join(p.choices, "|"), p.min, p.max);
    case ParamKind::kChoice:
      return join(p.choices, "|");
    case ParamKind::kText:
      return "text (a path; no spaces or ,;())";
  }
  return "";
}

}  // namespace attnprobe
