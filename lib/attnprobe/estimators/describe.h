#pragma once
// Every estimator described from its registration, in the forms people and tools read: the one-line
// domain of a key (spec errors, `list`), one record per estimator (`list`), JSON (`list --json`,
// Python's estimators()) and the Markdown tables that docs/ holds between generated
// markers (`list --markdown`, checked by a CTest). Nothing here knows an estimator by name.
#include <string>
#include <vector>

#include "attnprobe/estimators/registry.h"

namespace attnprobe {

struct DeviceDescription {
  std::string device;               ///< "cpu", "cuda"
  std::vector<std::string> forms;   ///< the masks its version computes
  std::vector<std::string> decode;  ///< the masks of its version's decode form
  double tolerance = 0;             ///< parity with the CPU version (capabilities.h); 0 for the CPU
  bool compiled = false;            ///< whether this build has the device's backend
};

struct EstimatorDescription {
  const EstimatorDef* def = nullptr;
  std::string spec;    ///< the default setting, canonical
  std::string target;  ///< the default setting's target
  bool random = false;
  bool forms_vary = false;  ///< some settings lack a form of the declaration (see the keys)
  Capabilities capabilities;
  std::vector<DeviceDescription> devices;  ///< CPU first
  std::vector<std::string> variants;       ///< what the baseline gate runs
};

/// The registered estimators (not those registered at run time by Python), in `list` order.
std::vector<EstimatorDescription> describe_estimators();
/// The same as a JSON array of objects (`list --json`; Python's estimators() returns it parsed).
std::string estimators_json();

/// The generated Markdown tables: "estimators" (one row per estimator: knob, randomness, forms, weights,
/// backward, devices) and "devices" (one row per device version: forms and parity tolerance).
std::vector<std::string> markdown_table_names();
/// The table `name` (std::invalid_argument for an unknown one).
std::string markdown_table(const std::string& name);

}  // namespace attnprobe
