#pragma once
// Estimator spec strings (DESIGN.md §3) and the registry they resolve against.
// A spec is `name` or `name(key=value,...)`. Parsing is strict: unknown names or keys, wrong
// types and out-of-range values are InputErrors that list what is valid. Every parsed spec
// holds all keys of its estimator (defaults filled in) and prints back canonically, keys in
// registration order, so `parse(spec.canonical()) == spec`.
//
// Each estimator file registers itself at static-initialisation time:
//   [[maybe_unused]] const bool kRegistered = register_estimator({...});
// (the library is an OBJECT library so the linker keeps those files).
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "attnprobe/estimators/estimator.h"

namespace attnprobe {

enum class ParamKind { kInt, kReal, kChoice };

struct ParamDef {
  std::string name;
  ParamKind kind = ParamKind::kInt;
  std::string default_value;         ///< as it would be written in a spec
  double min = 0, max = 0;           ///< inclusive range for kInt/kReal
  std::vector<std::string> choices;  ///< for kChoice; for kReal, words accepted besides a number (e.g. "opt")
  std::string help;                  ///< one line
};

class Spec;

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
  std::function<std::unique_ptr<Estimator>(const Spec&)> make;
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

/// Adds an estimator; duplicate names abort (a programming error). Returns true.
bool register_estimator(EstimatorDef def);
/// All registered estimators, by family then name.
std::vector<const EstimatorDef*> registered_estimators();
const EstimatorDef* find_estimator(const std::string& name);

/// Parses and validates a spec string; throws InputError on any problem.
Spec parse_spec(const std::string& text);

}  // namespace attnprobe
