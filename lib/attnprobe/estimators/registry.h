#pragma once
// Estimator spec strings (docs/specs.md) and the registry they resolve against.
// A spec is `name` or `name(key=value,...)`. Parsing is strict: unknown names or keys, wrong
// types and out-of-range values are UsageErrors (exit 2) that list what is valid. Every parsed
// spec holds all keys of its estimator (defaults filled in) and prints back canonically, keys in
// registration order, so `parse(spec.canonical()) == spec`.
//
// The registry is the one place that knows an estimator: its parameters, samples knob, target,
// capabilities (randomness, forms per mask, weights, backward) and its device versions with their
// parity tolerances. `list`, Python's estimators(), the help texts, the generated tables of
// docs/, the plan's refusals and the conformance harness read it; nothing else keeps a list of
// estimators. Each estimator folder registers itself at static-initialisation time, once, from its
// CPU file (the library is built so that the linker keeps those objects):
//   [[maybe_unused]] const bool kRegistered = register_estimator(Declaration<VMeanParams>{...});
// and a device version, from its host adapter (`<name>_cuda.cpp`), only where the backend is built:
//   [[maybe_unused]] const bool kOnCuda = register_implementation<VMeanParams>("vmean", Device::kCuda, make);
// The registry refuses (at its first read) a device version that is compiled but not declared, or
// declared but missing from a build that has the backend. Both versions decode the spec with the same
// ParamSet (params_of<P>), so a key means the same thing on every device.
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "attnprobe/estimators/capabilities.h"
#include "attnprobe/estimators/estimator.h"
#include "attnprobe/estimators/param_set.h"

namespace attnprobe {

class Spec;
using EstimatorFactory = std::function<std::unique_ptr<Estimator>(const Spec&)>;

/// An estimator as the registry holds it, without its parameter type. Built from a Declaration<P>
/// (below); built directly only by registrations without a C++ parameter struct (Python's custom
/// estimators).
struct EstimatorDef {
  std::string name;
  std::string family;   ///< exact | yoso | sketching | random-features | nystrom | ...
  std::string summary;  ///< one line for `attnprobe list`
  std::string page;     ///< its documentation page, relative to docs/ (e.g. "estimators/yoso.md")
  std::vector<ParamDef> params;
  std::string samples_knob;  ///< the parameter `--samples` sets; "" for none
  Capabilities capabilities;
  /// When set, the capabilities of one setting (a subset of `capabilities`, e.g. yoso's input=lift has
  /// no causal form, lara(mode=mean) draws nothing); else `capabilities`.
  std::function<Capabilities(const Spec&)> capabilities_for;
  /// Canonical spec of what this estimator estimates (`--reference auto`); default "softmax".
  std::function<std::string(const Spec&)> target;
  /// Versions for devices other than the CPU (whether or not this build compiles them).
  std::vector<DeviceDeclaration> devices;
  /// Settings worth gating besides those variants() derives (e.g. a numeric ablation such as
  /// `linformer(std=0.02)` or a combination of keys), as spec strings.
  std::vector<std::string> ablations;
  EstimatorFactory make;  ///< the CPU version
  /// Rules across keys, run when a spec is parsed (throws UsageError).
  std::function<void(const Spec&)> validate;
  /// The ParamSet<P> the params came from, and P (params_of<P> checks it).
  std::shared_ptr<const void> param_set;
  const std::type_info* param_type = nullptr;
};

/// A validated spec: the estimator's definition and one value per parameter.
class Spec {
 public:
  const EstimatorDef& def() const { return *def_; }
  const std::string& name() const { return def_->name; }
  std::string canonical() const;
  /// Whether a brief spec shows the samples knob: as any key (when not the default), always (a table whose rows
  /// differ in it), or never (a column says it).
  enum class Knob { kIfNotDefault, kAlways, kNever };
  /// For people: the name with only the keys whose value is not the default, in registration order
  /// ("topk(k=64)" for topk(k=64,sink=0,window=0,...)), the samples knob as `knob` says. Not a spec to parse
  /// back: parse_spec fills the defaults in again.
  std::string brief(Knob knob = Knob::kIfNotDefault) const;

  int64_t get_int(const std::string& key) const;
  double get_real(const std::string& key) const;
  const std::string& get_choice(const std::string& key) const;
  /// The canonical text of every key, in registration order.
  std::vector<std::string> values() const;

  bool has_samples_knob() const { return !def_->samples_knob.empty(); }
  /// What this setting can do (the estimator's capabilities, narrowed for it).
  Capabilities capabilities() const;
  /// Whether this configuration draws random numbers (deterministic ones run one trial).
  bool random() const { return capabilities().random; }
  /// Whether this configuration has a causal form (docs/specs.md, "Masks").
  bool causal() const { return capabilities().forms.has(Mask::kCausal); }
  int64_t samples() const { return get_int(def_->samples_knob); }  ///< only if has_samples_knob()
  /// The same spec with the samples knob set (validated against its range).
  Spec with_samples(int64_t samples) const;
  /// The canonical spec of the target (`--reference auto`).
  std::string target() const;
  std::unique_ptr<Estimator> make() const { return def_->make(*this); }

  bool operator==(const Spec& other) const { return def_ == other.def_ && values_ == other.values_; }

 private:
  friend Spec parse_spec(const std::string& text);
  const std::string& raw(const std::string& key) const;

  const EstimatorDef* def_ = nullptr;
  std::vector<std::pair<std::string, std::string>> values_;  ///< canonical text per key, registered order
};

/// An estimator's one declaration, with its parameter struct P (param_set.h). Everything typed P is
/// given the decoded parameters of a spec.
template <class P>
struct Declaration {
  std::string name;
  std::string family;
  std::string summary;
  std::string page;  ///< its documentation page, relative to docs/
  ParamSet<P> params;
  std::string samples_knob;  ///< a key of `params`, or "" for none
  Capabilities capabilities;
  /// Narrows `capabilities` for one setting (optional): e.g. drops the causal form where the setting has none.
  std::function<void(const P&, Capabilities&)> narrow;
  /// The canonical spec of its target (optional; default "softmax").
  std::function<std::string(const P&)> target;
  std::vector<DeviceDeclaration> devices;
  std::vector<std::string> ablations;
  std::function<std::unique_ptr<Estimator>(const P&)> make;
};

/// The parameters of `spec` decoded into its estimator's struct P (std::logic_error for another P).
template <class P>
P params_of(const Spec& spec) {
  const EstimatorDef& def = spec.def();
  if (def.param_type == nullptr || *def.param_type != typeid(P))
    throw std::logic_error("params_of: '" + def.name + "' is not declared with this parameter struct");
  return static_cast<const ParamSet<P>*>(def.param_set.get())->decode(spec.values());
}

/// Adds an estimator without a parameter struct; duplicate names abort (a programming error). Returns true.
bool register_estimator(EstimatorDef def);
/// Adds an estimator from its declaration. Returns true.
template <class P>
bool register_estimator(Declaration<P> decl);

/// Adds the version of estimator `name` for a device other than the CPU (its host adapter calls this,
/// compiled only with the device's backend). The estimator must declare the device (Declaration::devices);
/// registration order across files is unspecified, so a mismatch is reported when the registry is first read.
bool register_implementation(const std::string& name, Device device, EstimatorFactory make,
                             const std::type_info& param_type);
template <class P>
bool register_implementation(const std::string& name, Device device,
                             std::function<std::unique_ptr<Estimator>(const P&)> make) {
  return register_implementation(
      name, device, [make = std::move(make)](const Spec& spec) { return make(params_of<P>(spec)); }, typeid(P));
}
/// Tells the registry how to ask whether `device` is usable: the probe returns "" when it is, else why not.
bool register_device_probe(Device device, std::function<std::string()> probe);
/// The devices `def` declares, CPU first (whether or not this build compiles their backends).
std::vector<Device> devices_of(const EstimatorDef& def);
/// Its declaration for `device` (the CPU's: every form, no tolerance); nullptr when it has no version there.
const DeviceDeclaration* device_declaration(const EstimatorDef& def, Device device);
/// The names of the estimators that have a version for `device`, in `list` order.
std::vector<std::string> estimators_on(Device device);
/// Whether this build can run anything on `device` at all (its backend is linked in).
bool device_compiled(Device device);
/// Why `device` cannot run here ("" when it can): its backend is built but no such device is visible
/// (the backend's own words, e.g. the CUDA runtime's). Only for a device_compiled() one.
std::string device_problem(Device device);

/// The estimator for `spec` on `device`. UsageError (exit 2) when the build lacks the backend or the
/// estimator has no version for the device (naming those that do); InputError when no such device
/// is visible on this machine.
std::unique_ptr<Estimator> make_estimator(const Spec& spec, Device device);
/// The devices whose version of `def` has its causal form, CPU first (none if it has no causal form).
std::vector<Device> causal_devices_of(const EstimatorDef& def);
/// The names of the estimators with a causal form on `device`, in `list` order.
std::vector<std::string> causal_estimators(Device device = Device::kCpu);
/// Whether this configuration has a causal form on `device`: Spec::causal(), and on a device other
/// than the CPU, a version there declared with the causal form.
bool causal_on(const Spec& spec, Device device);
/// Whether this configuration has a form for `mask` (its decode form when `decode`) on `device`.
bool form_on(const Spec& spec, Mask mask, bool decode, Device device);
/// UsageError (exit 2) unless `spec` can run under `mask` on `device`, with its decode form when `decode`
/// (query rows at positions against a longer cache). The message names the estimators that can. A device the
/// estimator has no version for is left to make_estimator's message.
void require_form_support(const Spec& spec, Mask mask, bool decode, Device device = Device::kCpu);
/// require_form_support for self-attention.
inline void require_mask_support(const Spec& spec, Mask mask, Device device = Device::kCpu) {
  require_form_support(spec, mask, false, device);
}

/// UsageError (exit 2) unless `spec` honours score shaping on `device` (Capabilities::shaping; CPU versions only),
/// for a slice whose model does `what` to its scores (ScoreShaping::description()). The message names the
/// estimators that can.
void require_shaping_support(const Spec& spec, const std::string& what, Device device = Device::kCpu);

/// The names of the estimators whose capabilities (declared, not per setting) satisfy `has`, in `list` order.
std::vector<std::string> estimators_where(const std::function<bool(const Capabilities&)>& has);
/// The names of the estimators with a form for `mask` (their decode form when `decode`) on `device`.
std::vector<std::string> estimators_where_on(Device device, Mask mask, bool decode);

/// All registered estimators, by family then name.
std::vector<const EstimatorDef*> registered_estimators();
const EstimatorDef* find_estimator(const std::string& name);

/// The settings that the baseline gate, the parity harness and the registry test run for `def`, as
/// canonical specs: the default, each non-default choice of each choice parameter on its own, then
/// the declared ablations. So a new estimator is gated by registering it, with no list to edit.
std::vector<std::string> variants(const EstimatorDef& def);

/// Parses and validates a spec string; throws UsageError on any problem (a spec is part of the command line).
Spec parse_spec(const std::string& text);

// ---- the declaration's conversion, in the header because it is a template --------------------

template <class P>
bool register_estimator(Declaration<P> decl) {
  auto set = std::make_shared<const ParamSet<P>>(std::move(decl.params));
  EstimatorDef def;
  def.name = std::move(decl.name);
  def.family = std::move(decl.family);
  def.summary = std::move(decl.summary);
  def.page = std::move(decl.page);
  def.params = set->defs();
  def.samples_knob = std::move(decl.samples_knob);
  def.capabilities = decl.capabilities;
  if (decl.narrow)
    def.capabilities_for = [declared = decl.capabilities, narrow = std::move(decl.narrow)](const Spec& spec) {
      Capabilities narrowed = declared;
      narrow(params_of<P>(spec), narrowed);
      return narrowed;
    };
  if (decl.target)
    def.target = [target = std::move(decl.target)](const Spec& spec) { return target(params_of<P>(spec)); };
  def.devices = std::move(decl.devices);
  def.ablations = std::move(decl.ablations);
  def.make = [make = std::move(decl.make)](const Spec& spec) { return make(params_of<P>(spec)); };
  def.validate = [](const Spec& spec) { params_of<P>(spec); };  // runs the ParamSet's rules
  def.param_set = set;
  def.param_type = &typeid(P);
  return register_estimator(std::move(def));
}

}  // namespace attnprobe
