#pragma once
// A spec as people type and read it, against the canonical text the CSV holds (docs/specs.md): reporters match a
// typed spec to the CSV's and name settings briefly in tables. A spec the registry does not know (a `py:` custom
// estimator, written by the Python package as given) is kept as it is by both.
#include <string>

#include "attnprobe/estimators/registry.h"

namespace attnprobe {

/// The spec as the CSV writes it: a registered estimator's canonical spec (defaults filled in: "topk(k=64)" →
/// "topk(k=64,sink=0,...)"), any other text unchanged.
std::string written_spec(const std::string& spec);

/// For people: Spec::brief of a registered estimator's spec (its non-default keys), any other text unchanged.
std::string brief_spec(const std::string& spec, Spec::Knob knob = Spec::Knob::kIfNotDefault);

}  // namespace attnprobe
