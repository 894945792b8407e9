#pragma once
// Estimator spec strings (docs/specs.md) and the registry they resolve against.
// A spec is `name` or `name(key=value,...)`. Parsing is strict: unknown names or keys, wrong
// types and out-of-range values are UsageErrors (exit 2) that list what is valid. Every parsed
// spec holds all keys of its estimator (defaults filled in) and prints back canonically, keys in
// registration order, so `parse(spec.canonical()) == spec`.
//
// The registry is the one place that knows an estimator: its parameters, samples knob, target,
// randomness, causal form, whether it states attention weights, and which devices implement it.
// `list`, the help texts, the README check and the test harnesses read it; nothing else keeps a
// list of estimators. Each estimator file registers itself at static-initialisation time:
//   [[maybe_unused]] const bool kRegistered = register_estimator({...});           // the CPU version
//   [[maybe_unused]] const bool kOnCuda = register_implementation("name", Device::kCuda, factory);  // a .cu
//   (or register_implementation("name", Device::kCuda, factory, CausalForm::kYes) where the device
//   version computes the causal form too, from HeadView::mask)
// (the libraries are OBJECT libraries so the linker keeps those files). Both versions decode the
// spec through the same `XParams::from_spec`, so a key means the same thing on every device.
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "attnprobe/estimators/estimator.h"

namespace attnprobe {

enum class ParamKind { kInt, kReal, kChoice };

/// Where an estimator runs. Every estimator has a CPU version; others register themselves.
enum class Device { kCpu, kCuda };
inline constexpr Device kAllDevices[] = {Device::kCpu, Device::kCuda};
/// "cpu" or "cuda"; throws UsageError otherwise.
Device parse_device(const std::string& name);
const char* device_name(Device device);

struct ParamDef {
  std::string name;
  ParamKind kind = ParamKind::kInt;
  std::string default_value;         ///< as it would be written in a spec
  double min = 0, max = 0;           ///< inclusive range for kInt/kReal
  std::vector<std::string> choices;  ///< for kChoice; for kReal, words accepted besides a number (e.g. "opt")
  std::string help;                  ///< one line
};

class Spec;
using EstimatorFactory = std::function<std::unique_ptr<Estimator>(const Spec&)>;

struct EstimatorDef {
  std::string name;
  std::string family;   ///< exact | yoso | sketching | random-features | nystrom
  std::string summary;  ///< one line for `attnprobe list`
  std::vector<ParamDef> params;
  std::string samples_knob;  ///< the parameter `--samples` sets; "" for none
  bool random = true;        ///< deterministic estimators run one trial
  /// When set, decides randomness per spec (e.g. lara(mode=mean) is deterministic); else `random`.
  std::function<bool(const Spec&)> random_for;
  /// Canonical spec of what this estimator estimates (`--reference auto`); default "softmax".
  std::function<std::string(const Spec&)> target;
  bool causal = false;  ///< has a causal form (docs/estimators/*.md, "Causal form")
  /// When set, decides per spec whether the causal form exists (e.g. yoso's input=lift scales by
  /// the largest norm of the whole sequence, so it has none); else `causal`.
  std::function<bool(const Spec&)> causal_for;
  bool weights = false;  ///< can state the attention weights it implies (docs/metrics.md)
  /// States them under the causal mask too: the matrix its causal form implies (weight metrics of causal cases).
  bool causal_weights = false;
  /// Its backward form (Estimator::backward, the gradient metrics of docs/metrics.md): "" for none,
  /// "out" for ∂⟨G, out⟩/∂(Q, V), "yoso" for ∂⟨G, W·V⟩/∂(Q̂, V). Gradients are compared only
  /// between an estimator and a reference of the same form.
  std::string backward;
  /// Its backward form covers the causal form too: the gradient of its causal output (the gradient
  /// metrics of causal cases; an estimator with a backward form but without this is refused there).
  bool causal_backward = false;
  /// Settings worth gating besides those variants() derives (e.g. a numeric ablation such as
  /// `linformer(std=0.02)` or a combination of keys), as spec strings.
  std::vector<std::string> ablations;
  EstimatorFactory make;  ///< the CPU version
};

/// A validated spec: the estimator's definition and one value per parameter.
class Spec {
 public:
  const EstimatorDef& def() const { return *def_; }
  const std::string& name() const { return def_->name; }
  std::string canonical() const;

  int64_t get_int(const std::string& key) const;
  double get_real(const std::string& key) const;
  const std::string& get_choice(const std::string& key) const;

  bool has_samples_knob() const { return !def_->samples_knob.empty(); }
  /// Whether this configuration draws random numbers (deterministic ones run one trial).
  bool random() const { return def_->random_for ? def_->random_for(*this) : def_->random; }
  /// Whether this configuration has a causal form (docs/specs.md, "Masks").
  bool causal() const { return def_->causal_for ? def_->causal_for(*this) : def_->causal; }
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

/// Adds an estimator with its CPU version; duplicate names abort (a programming error). Returns true.
bool register_estimator(EstimatorDef def);
/// Whether a device version computes the estimator's causal form (for every spec whose Spec::causal() holds).
enum class CausalForm { kNo, kYes };
/// Adds the version of estimator `name` for a device other than the CPU (a `.cu` file calls this
/// beside its kernels). Registration order across files is unspecified, so a name that no
/// register_estimator() ever adds is reported when the registry is first read.
bool register_implementation(const std::string& name, Device device, EstimatorFactory make,
                             CausalForm causal = CausalForm::kNo);
/// Tells the registry how to ask whether `device` is usable: the probe returns "" when it is, else why not.
bool register_device_probe(Device device, std::function<std::string()> probe);
/// The devices that implement `def`, CPU first.
std::vector<Device> devices_of(const EstimatorDef& def);
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
/// than the CPU, a version there registered with CausalForm::kYes.
bool causal_on(const Spec& spec, Device device);
/// UsageError (exit 2) unless `spec` can run under `mask` on `device`: under a causal mask only
/// configurations with a causal form on that device (causal_on). The message names the estimators that can.
/// A device whose backend this build lacks is left to make_estimator's message.
void require_mask_support(const Spec& spec, Mask mask, Device device = Device::kCpu);

/// All registered estimators, by family then name.
std::vector<const EstimatorDef*> registered_estimators();
const EstimatorDef* find_estimator(const std::string& name);

/// The settings that the baseline gate, the parity harness and the registry test run for `def`, as
/// canonical specs: the default, each non-default choice of each choice parameter on its own, then
/// the declared ablations. So a new estimator is gated by registering it, with no list to edit.
std::vector<std::string> variants(const EstimatorDef& def);

/// Parses and validates a spec string; throws UsageError on any problem (a spec is part of the command line).
Spec parse_spec(const std::string& text);

}  // namespace attnprobe
