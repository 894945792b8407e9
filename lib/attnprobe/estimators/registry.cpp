#include "attnprobe/estimators/registry.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <shared_mutex>

#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"

namespace attnprobe {

namespace {

std::map<std::string, std::unique_ptr<EstimatorDef>>& registry() {
  static std::map<std::string, std::unique_ptr<EstimatorDef>> estimators;
  return estimators;
}

// Guards registry(): the Python package registers a sweep's custom estimators (py:NAME) while other
// Python threads, without the GIL, parse specs. Definitions live behind unique_ptr, so the pointers
// handed out stay valid across later registrations.
std::shared_mutex& registry_mutex() {
  static std::shared_mutex mutex;
  return mutex;
}

// A version for a device other than the CPU.
struct Implementation {
  EstimatorFactory make;
  CausalForm causal = CausalForm::kNo;
};

// Versions for devices other than the CPU, by (estimator name, device).
std::map<std::pair<std::string, Device>, Implementation>& implementations() {
  static std::map<std::pair<std::string, Device>, Implementation> versions;
  return versions;
}

std::map<Device, std::function<std::string()>>& device_probes() {
  static std::map<Device, std::function<std::string()>> probes;
  return probes;
}

// A .cu file that registers a name no CPU file defines is a programming error; static
// initialisation order hides it at registration time, so it is caught on the first read.
void check_implementations() {
  static const bool kChecked = [] {
    const std::shared_lock lock(registry_mutex());
    for (const auto& [key, implementation] : implementations())
      if (!registry().count(key.first)) {
        std::fprintf(stderr, "attnprobe: a %s version of '%s' is registered, but no estimator has that name\n",
                     device_name(key.second), key.first.c_str());
        std::abort();
      }
    return true;
  }();
  (void)kChecked;
}

std::string names_list() {
  std::vector<std::string> names;
  for (const EstimatorDef* def : registered_estimators()) names.push_back(def->name);
  return join(names, ", ");
}

std::string describe_param(const ParamDef& p) {
  switch (p.kind) {
    case ParamKind::kInt:
      return fmt::format("{} (integer {}..{}, default {})", p.name, p.min, p.max, p.default_value);
    case ParamKind::kReal:
      if (!p.choices.empty())
        return fmt::format("{} ({} or a real {}..{}, default {})", p.name, join(p.choices, "|"), p.min, p.max,
                           p.default_value);
      return fmt::format("{} (real {}..{}, default {})", p.name, p.min, p.max, p.default_value);
    case ParamKind::kChoice:
      return fmt::format("{} ({}, default {})", p.name, join(p.choices, "|"), p.default_value);
  }
  return p.name;
}

std::string keys_list(const EstimatorDef& def) {
  if (def.params.empty()) return fmt::format("'{}' takes no parameters", def.name);
  std::vector<std::string> parts;
  for (const ParamDef& p : def.params) parts.push_back(describe_param(p));
  return fmt::format("valid keys of '{}': {}", def.name, join(parts, "; "));
}

// Validates `text` for parameter `p` and returns its canonical spelling.
std::string canonical_value(const EstimatorDef& def, const ParamDef& p, const std::string& text) {
  auto bad = [&](const std::string& why) {
    return UsageError(fmt::format("estimator '{}': {}={} {}. {}.", def.name, p.name, text, why, describe_param(p)));
  };
  switch (p.kind) {
    case ParamKind::kInt: {
      int64_t v;
      if (!parse_int(text, v)) throw bad("is not an integer");
      if (v < p.min || v > p.max) throw bad("is out of range");
      return std::to_string(v);
    }
    case ParamKind::kReal: {
      if (std::find(p.choices.begin(), p.choices.end(), text) != p.choices.end()) return text;  // a named value
      double v;
      if (!parse_real(text, v) || !std::isfinite(v)) throw bad("is not a finite number");
      if (v < p.min || v > p.max) throw bad("is out of range");
      return format_real(v);
    }
    case ParamKind::kChoice:
      if (std::find(p.choices.begin(), p.choices.end(), text) == p.choices.end()) throw bad("is not a valid choice");
      return text;
  }
  return text;
}

}  // namespace

bool register_estimator(EstimatorDef def) {
  const std::unique_lock lock(registry_mutex());
  auto& estimators = registry();
  if (estimators.count(def.name)) {
    std::fprintf(stderr, "attnprobe: estimator '%s' registered twice\n", def.name.c_str());
    std::abort();
  }
  if (!def.target) def.target = [](const Spec&) { return std::string("softmax"); };
  std::string name = def.name;
  estimators.emplace(name, std::make_unique<EstimatorDef>(std::move(def)));
  return true;
}

bool register_implementation(const std::string& name, Device device, EstimatorFactory make, CausalForm causal) {
  if (device == Device::kCpu ||
      !implementations().emplace(std::pair(name, device), Implementation{std::move(make), causal}).second) {
    std::fprintf(stderr, "attnprobe: the %s version of '%s' is registered twice\n", device_name(device), name.c_str());
    std::abort();
  }
  return true;
}

bool register_device_probe(Device device, std::function<std::string()> probe) {
  device_probes()[device] = std::move(probe);
  return true;
}

Device parse_device(const std::string& name) {
  for (Device device : kAllDevices)
    if (name == device_name(device)) return device;
  throw UsageError(fmt::format("--device {}: use cpu or cuda", name));
}

const char* device_name(Device device) { return device == Device::kCpu ? "cpu" : "cuda"; }

std::vector<Device> devices_of(const EstimatorDef& def) {
  check_implementations();
  std::vector<Device> devices;
  for (Device device : kAllDevices)
    if (device == Device::kCpu || implementations().count({def.name, device})) devices.push_back(device);
  return devices;
}

namespace {
// Whether `def` has a causal form on `device` (for the settings that have one).
bool causal_form_on(const EstimatorDef& def, Device device) {
  if (!def.causal) return false;
  if (device == Device::kCpu) return true;
  check_implementations();
  const auto it = implementations().find({def.name, device});
  return it != implementations().end() && it->second.causal == CausalForm::kYes;
}
}  // namespace

std::vector<std::string> causal_estimators(Device device) {
  std::vector<std::string> names;
  for (const EstimatorDef* def : registered_estimators())
    if (causal_form_on(*def, device)) names.push_back(def->name);
  return names;
}

std::vector<Device> causal_devices_of(const EstimatorDef& def) {
  std::vector<Device> devices;
  for (Device device : devices_of(def))
    if (causal_form_on(def, device)) devices.push_back(device);
  return devices;
}

bool causal_on(const Spec& spec, Device device) { return spec.causal() && causal_form_on(spec.def(), device); }

void require_mask_support(const Spec& spec, Mask mask, Device device) {
  if (mask != Mask::kCausal) return;
  if (!spec.def().causal)
    throw UsageError(fmt::format(
        "'{}' has no causal form (each of its output rows depends on later tokens), so it cannot measure causal "
        "attention; estimators with a causal form: {}. Drop it, or measure bidirectional attention with --mask full.",
        spec.name(), join(causal_estimators(), ", ")));
  if (!spec.causal())
    throw UsageError(fmt::format(
        "'{}' has no causal form in this configuration (`attnprobe list --variants --causal` lists the settings "
        "that have one: e.g. yoso's input=lift scales by the largest norm of the whole sequence, scatterbrain's "
        "sortlsh and smyrf supports sort later tokens with earlier ones); use the default settings or --mask full.",
        spec.canonical()));
  // A build without the device's backend: make_estimator says so (the more useful message).
  if (device_compiled(device) && !causal_on(spec, device))
    throw UsageError(fmt::format(
        "'{}' has no causal form on {} yet (estimators with one there: {}); run its causal cases on the CPU "
        "(--device cpu), or use --mask full.",
        spec.name(), device_name(device), join(causal_estimators(device), ", ")));
}

std::vector<std::string> estimators_on(Device device) {
  std::vector<std::string> names;
  for (const EstimatorDef* def : registered_estimators()) {
    const std::vector<Device> devices = devices_of(*def);
    if (std::find(devices.begin(), devices.end(), device) != devices.end()) names.push_back(def->name);
  }
  return names;
}

bool device_compiled(Device device) { return device == Device::kCpu || device_probes().count(device) > 0; }

std::string device_problem(Device device) { return device == Device::kCpu ? "" : device_probes().at(device)(); }

std::unique_ptr<Estimator> make_estimator(const Spec& spec, Device device) {
  if (device == Device::kCpu) return spec.make();
  check_implementations();
  if (!device_compiled(device))
    throw UsageError(fmt::format(
        "--device {}: this build has no {} backend; configure with -DATTNPROBE_CUDA=ON (or AUTO) where nvcc is "
        "installed, or use --device cpu",
        device_name(device), device_name(device)));
  auto it = implementations().find({spec.name(), device});
  if (it == implementations().end())
    throw UsageError(fmt::format("estimator '{}' has no {} version (estimators on {}: {}); run it with --device cpu",
                                 spec.name(), device_name(device), device_name(device),
                                 join(estimators_on(device), ", ")));
  if (const std::string why = device_problem(device); !why.empty())
    throw InputError(
        fmt::format("--device {}: {}. Use --device cpu, or run where a GPU is visible.", device_name(device), why));
  return it->second.make(spec);
}

std::vector<std::string> variants(const EstimatorDef& def) {
  std::vector<std::string> specs = {parse_spec(def.name).canonical()};
  auto add = [&](const std::string& text) {
    const std::string canonical = parse_spec(text).canonical();
    if (std::find(specs.begin(), specs.end(), canonical) == specs.end()) specs.push_back(canonical);
  };
  for (const ParamDef& param : def.params)
    if (param.kind == ParamKind::kChoice)
      for (const std::string& choice : param.choices) add(fmt::format("{}({}={})", def.name, param.name, choice));
  for (const std::string& ablation : def.ablations) add(ablation);
  return specs;
}

std::vector<const EstimatorDef*> registered_estimators() {
  static const std::vector<std::string> kFamilyOrder = {"exact", "yoso", "sketching", "random-features", "nystrom"};
  std::vector<const EstimatorDef*> defs;
  {
    const std::shared_lock lock(registry_mutex());
    for (auto& [name, def] : registry()) defs.push_back(def.get());
  }
  auto rank = [&](const EstimatorDef* d) {
    auto it = std::find(kFamilyOrder.begin(), kFamilyOrder.end(), d->family);
    return it - kFamilyOrder.begin();
  };
  std::stable_sort(defs.begin(), defs.end(),
                   [&](auto* a, auto* b) { return rank(a) != rank(b) ? rank(a) < rank(b) : a->name < b->name; });
  return defs;
}

const EstimatorDef* find_estimator(const std::string& name) {
  const std::shared_lock lock(registry_mutex());
  auto it = registry().find(name);
  return it == registry().end() ? nullptr : it->second.get();
}

Spec parse_spec(const std::string& input) {
  // Every message below quotes the spec: a 120 KB one made a 240 KB message. No real spec comes close.
  constexpr size_t kMaxSpecLength = 1000;
  if (input.size() > kMaxSpecLength)
    throw UsageError(
        fmt::format("a spec of {} characters, beginning '{}...': a spec is name(key=value,...), at most "
                    "{} characters (see `attnprobe list`).",
                    input.size(), input.substr(0, 40), kMaxSpecLength));
  const std::string text = trim(input);
  const size_t open = text.find('(');
  const std::string name = trim(text.substr(0, open));
  const EstimatorDef* def = find_estimator(name);
  if (!def)
    throw UsageError(
        fmt::format("unknown estimator '{}' in spec '{}'. Registered estimators: {} (see `attnprobe list`).", name,
                    input, names_list()));
  std::map<std::string, std::string> given;
  if (open != std::string::npos) {
    if (text.back() != ')' || text.find('(', open + 1) != std::string::npos || text.find(')') != text.size() - 1)
      throw UsageError(fmt::format("malformed spec '{}': write name(key=value,key=value), e.g. yoso(m=32,tau=8). {}.",
                                   input, keys_list(*def)));
    const std::string body = text.substr(open + 1, text.size() - open - 2);
    if (!trim(body).empty()) {
      for (const std::string& item : split(body, ',')) {
        const size_t eq = item.find('=');
        if (eq == std::string::npos)
          throw UsageError(
              fmt::format("malformed spec '{}': '{}' is not key=value. {}.", input, trim(item), keys_list(*def)));
        std::string key = trim(item.substr(0, eq)), value = trim(item.substr(eq + 1));
        auto known =
            std::find_if(def->params.begin(), def->params.end(), [&](const ParamDef& p) { return p.name == key; });
        if (known == def->params.end())
          throw UsageError(
              fmt::format("estimator '{}' has no parameter '{}' (in '{}'). {}.", name, key, input, keys_list(*def)));
        if (given.count(key)) throw UsageError(fmt::format("parameter '{}' is given twice in '{}'.", key, input));
        given[key] = value;
      }
    }
  }
  Spec spec;
  spec.def_ = def;
  for (const ParamDef& p : def->params) {
    auto it = given.find(p.name);
    spec.values_.emplace_back(p.name, canonical_value(*def, p, it == given.end() ? p.default_value : it->second));
  }
  return spec;
}

std::string Spec::canonical() const {
  if (values_.empty()) return def_->name;
  std::vector<std::string> parts;
  for (const auto& [key, value] : values_) parts.push_back(key + "=" + value);
  return def_->name + "(" + join(parts, ",") + ")";
}

const std::string& Spec::raw(const std::string& key) const {
  for (const auto& [k, v] : values_)
    if (k == key) return v;
  throw std::logic_error(fmt::format("estimator '{}' has no parameter '{}'", def_->name, key));
}

int64_t Spec::get_int(const std::string& key) const { return std::stoll(raw(key)); }
double Spec::get_real(const std::string& key) const {
  double value = 0;  // validated when parsed; parse_real, unlike std::stod, accepts subnormals (beta=1e-320)
  parse_real(raw(key), value);
  return value;
}
const std::string& Spec::get_choice(const std::string& key) const { return raw(key); }

Spec Spec::with_samples(int64_t samples) const {
  if (!has_samples_knob()) return *this;
  Spec out = *this;
  for (auto& [key, value] : out.values_) {
    if (key != def_->samples_knob) continue;
    const ParamDef& p =
        *std::find_if(def_->params.begin(), def_->params.end(), [&](const ParamDef& d) { return d.name == key; });
    value = canonical_value(*def_, p, std::to_string(samples));
  }
  return out;
}

std::string Spec::target() const { return def_->target(*this); }

}  // namespace attnprobe
