#include "attnprobe/report/spec_text.h"

#include "attnprobe/common/error.h"

namespace attnprobe {

std::string written_spec(const std::string& spec) {
  try {
    return parse_spec(spec).canonical();
  } catch (const UsageError&) {
    return spec;
  }
}

std::string brief_spec(const std::string& spec, Spec::Knob knob) {
  try {
    return parse_spec(spec).brief(knob);
  } catch (const UsageError&) {
    return spec;
  }
}

}  // namespace attnprobe
