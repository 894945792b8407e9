#include "attnprobe/estimators/registry.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <typeinfo>

#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"
#include "attnprobe/estimators/redefine.h"

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

// A version for a device other than the CPU, with the parameter struct it decodes.
struct Implementation {
  EstimatorFactory make;
  const std::type_info* param_type = nullptr;
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

[[noreturn]] void registration_bug(const std::string& what) {
  std::fprintf(stderr, "attnprobe: %s\n", what.c_str());
  std::abort();
}

// Device versions and their declarations must agree: a version compiled for a name no CPU file defines
// or declares for that device, or a declared version that a build with the device's backend lacks, is a
// programming error. Static initialisation order hides it at registration time, so it is caught on the
// first read.
void check_implementations() {
  static const bool kChecked = [] {
    const std::shared_lock lock(registry_mutex());
    for (const auto& [key, implementation] : implementations()) {
      const auto& [name, device] = key;
      const auto it = registry().find(name);
      if (it == registry().end())
        registration_bug(fmt::format("a {} version of '{}' is registered, but no estimator has that name",
                                     device_name(device), name));
      const EstimatorDef& def = *it->second;
      if (std::none_of(def.devices.begin(), def.devices.end(), [&](const auto& d) { return d.device == device; }))
        registration_bug(
            fmt::format("a {} version of '{}' is compiled, but its registration does not declare it "
                        "(add it to the declaration's devices, with its forms and parity tolerance)",
                        device_name(device), name));
      if (def.param_type && *def.param_type != *implementation.param_type)
        registration_bug(fmt::format("the {} version of '{}' decodes another parameter struct than its CPU version",
                                     device_name(device), name));
    }
    for (const auto& [name, def] : registry())
      for (const DeviceDeclaration& declared : def->devices)
        if (device_probes().count(declared.device) && !implementations().count({name, declared.device}))
          registration_bug(
              fmt::format("'{}' declares a {} version, but this build, which has the {} backend, "
                          "does not compile one",
                          name, device_name(declared.device), device_name(declared.device)));
    return true;
  }();
  (void)kChecked;
}

std::vector<std::string> estimator_names() {
  std::vector<std::string> names;
  for (const EstimatorDef* def : registered_estimators()) names.push_back(def->name);
  return names;
}

std::string describe_param(const ParamDef& p) {
  return fmt::format("{} ({}, default {})", p.name, param_domain(p), p.default_value);
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
    case ParamKind::kText:
      // The spec list splits on ',' and ';', the spec on '(' ')'; a CSV or shell would mangle spaces and quotes.
      for (const char c : text)
        if (c == ',' || c == ';' || c == '(' || c == ')' || c == '"' || c == '\'' ||
            std::isspace(static_cast<unsigned char>(c)) || static_cast<unsigned char>(c) < 0x20)
          throw bad("holds a character a spec cannot carry (spaces or ,;()\"')");
      return text;
  }
  return text;
}

// Adds `def` to the registry; the caller holds registry_mutex() exclusively.
void add_locked(EstimatorDef def) {
  auto& estimators = registry();
  if (estimators.count(def.name)) registration_bug(fmt::format("estimator '{}' registered twice", def.name));
  if (!def.samples_knob.empty() &&
      std::none_of(def.params.begin(), def.params.end(), [&](const ParamDef& p) { return p.name == def.samples_knob; }))
    registration_bug(
        fmt::format("estimator '{}': its samples knob '{}' is not one of its keys", def.name, def.samples_knob));
  if (!def.target) def.target = [](const Spec&) { return std::string("softmax"); };
  std::string name = def.name;
  estimators.emplace(name, std::make_unique<EstimatorDef>(std::move(def)));
}

}  // namespace

bool register_estimator(EstimatorDef def) {
  const std::unique_lock lock(registry_mutex());
  add_locked(std::move(def));
  return true;
}

bool redefine_estimator(EstimatorDef def) {
  // One lock for both steps, so that no parse sees the name missing in between.
  const std::unique_lock lock(registry_mutex());
  auto& estimators = registry();
  const auto it = estimators.find(def.name);
  if (it != estimators.end()) {
    if (it->second->family != def.family)
      registration_bug(fmt::format("estimator '{}' ({}) cannot be redefined as family {}", def.name, it->second->family,
                                   def.family));
    // Never freed: a Spec holds a pointer to its definition, and a spec parsed before may outlive this call.
    static auto* retired = new std::vector<std::unique_ptr<EstimatorDef>>;
    retired->push_back(std::move(it->second));
    estimators.erase(it);
  }
  add_locked(std::move(def));
  return true;
}

bool register_implementation(const std::string& name, Device device, EstimatorFactory make,
                             const std::type_info& param_type) {
  if (device == Device::kCpu ||
      !implementations().emplace(std::pair(name, device), Implementation{std::move(make), &param_type}).second)
    registration_bug(fmt::format("the {} version of '{}' is registered twice", device_name(device), name));
  return true;
}

bool register_device_probe(Device device, std::function<std::string()> probe) {
  device_probes()[device] = std::move(probe);
  return true;
}

std::vector<Device> devices_of(const EstimatorDef& def) {
  std::vector<Device> devices = {Device::kCpu};
  for (const DeviceDeclaration& declared : def.devices) devices.push_back(declared.device);
  return devices;
}

const DeviceDeclaration* device_declaration(const EstimatorDef& def, Device device) {
  static const DeviceDeclaration kCpu{.device = Device::kCpu, .forms = kAllMasks, .decode = kAllMasks, .tolerance = 0};
  if (device == Device::kCpu) return &kCpu;
  for (const DeviceDeclaration& declared : def.devices)
    if (declared.device == device) return &declared;
  return nullptr;
}

namespace {
// Whether `def` has a causal form on `device` (for the settings that have one).
bool causal_form_on(const EstimatorDef& def, Device device) {
  const DeviceDeclaration* declared = device_declaration(def, device);
  return def.capabilities.forms.has(Mask::kCausal) && declared && declared->forms.has(Mask::kCausal);
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

bool causal_on(const Spec& spec, Device device) { return form_on(spec, Mask::kCausal, false, device); }

bool form_on(const Spec& spec, Mask mask, bool decode, Device device) {
  const DeviceDeclaration* declared = device_declaration(spec.def(), device);
  const Capabilities can = spec.capabilities();
  return declared && (decode ? can.decode.has(mask) && declared->decode.has(mask)
                             : can.forms.has(mask) && declared->forms.has(mask));
}

void require_form_support(const Spec& spec, Mask mask, bool decode, Device device) {
  const char* name = mask_name(mask);
  const Forms all = spec.def().capabilities.forms;
  const Capabilities can = spec.capabilities();
  // An estimator that compresses or replays the cache from a prompt has a decode form only: a whole slice has no
  // prompt before its rows.
  if (can.decode_only() && !decode)
    throw UsageError(fmt::format(
        "'{}' builds the cache from a prompt (compressed once or replayed), so it measures decode rows after one: "
        "use --queries last:W (W below the length; the rows before them are the prompt), not all rows.",
        spec.canonical()));
  if (!can.decode_only() && mask != Mask::kFull && !all.has(mask))
    throw UsageError(fmt::format(
        "'{}' has no {} form (each of its output rows depends on later tokens), so it cannot measure {} attention; "
        "estimators with a {} form: {}. Drop it, or measure bidirectional attention with --mask full.",
        spec.name(), name, name, name,
        join(estimators_where([&](const Capabilities& can) { return can.forms.has(mask); }), ", ")));
  if (!can.decode_only() && !can.forms.has(mask))
    throw UsageError(fmt::format(
        "'{}' has no {} form in this configuration (`attnprobe list --variants --causal` lists the settings "
        "that have a causal one: e.g. yoso's input=lift scales by the largest norm of the whole sequence, "
        "scatterbrain's sortlsh and smyrf supports sort later tokens with earlier ones); use the default settings or "
        "--mask full.",
        spec.canonical(), name));
  if (decode && !can.decode.has(mask))
    throw UsageError(fmt::format(
        "'{}' has no decode form under the {} mask: its output rows depend on the other query rows (landmarks, "
        "pilots or samples of the queries), so it cannot measure a few query rows against a longer cache; estimators "
        "with one: {}. Drop it, or measure whole slices with --queries all.",
        spec.canonical(), name,
        join(estimators_where([&](const Capabilities& can) { return can.decode.has(mask); }), ", ")));
  // A device the estimator has no version for at all: make_estimator says so (the more useful message).
  const DeviceDeclaration* declared = device_declaration(spec.def(), device);
  if (declared && !(decode ? declared->decode : declared->forms).has(mask))
    throw UsageError(fmt::format(
        "'{}' has no {}{} form on {} yet (estimators with one there: {}); run these cases on the CPU (--device cpu){}.",
        spec.name(), decode ? "decode " : "", name, device_name(device),
        join(estimators_where_on(device, mask, decode), ", "), mask == Mask::kFull ? "" : ", or use --mask full"));
}

void require_shaping_support(const Spec& spec, const std::string& what, Device device) {
  if (!spec.capabilities().shaping)
    throw UsageError(fmt::format(
        "'{}' cannot measure this model's attention: the model applies {} to its scores, and '{}' estimates "
        "softmax(s*Q*K^T) from q and k alone. Estimators that honour it: {}. Drop it for these layers (--layers), or "
        "measure the scores without the shaping by removing it from the dump (the reference then is not the "
        "model's).",
        spec.canonical(), what, spec.name(),
        join(estimators_where([](const Capabilities& can) { return can.shaping; }), ", ")));
  if (device != Device::kCpu)
    throw UsageError(fmt::format("'{}' honours score shaping ({}) on the CPU only; run these cases with --device cpu.",
                                 spec.canonical(), what));
}

std::vector<std::string> estimators_on(Device device) {
  std::vector<std::string> names;
  for (const EstimatorDef* def : registered_estimators())
    if (device_declaration(*def, device)) names.push_back(def->name);
  return names;
}

std::vector<std::string> estimators_where_on(Device device, Mask mask, bool decode) {
  std::vector<std::string> names;
  for (const EstimatorDef* def : registered_estimators()) {
    const DeviceDeclaration* declared = device_declaration(*def, device);
    const Capabilities& can = def->capabilities;
    if (declared && (decode ? can.decode & declared->decode : can.forms & declared->forms).has(mask))
      names.push_back(def->name);
  }
  return names;
}

std::vector<std::string> estimators_where(const std::function<bool(const Capabilities&)>& has) {
  std::vector<std::string> names;
  for (const EstimatorDef* def : registered_estimators())
    if (has(def->capabilities)) names.push_back(def->name);
  return names;
}

bool device_compiled(Device device) { return device == Device::kCpu || device_probes().count(device) > 0; }

std::string device_problem(Device device) { return device == Device::kCpu ? "" : device_probes().at(device)(); }

std::unique_ptr<Estimator> make_estimator(const Spec& spec, Device device) {
  if (device == Device::kCpu) return spec.make();
  check_implementations();
  if (!device_declaration(spec.def(), device))
    throw UsageError(fmt::format("estimator '{}' has no {} version (estimators on {}: {}); run it with --device cpu",
                                 spec.name(), device_name(device), device_name(device),
                                 join(estimators_on(device), ", ")));
  if (!device_compiled(device))
    throw UsageError(fmt::format(
        "--device {}: this build has no {} backend; configure with -DATTNPROBE_CUDA=ON (or AUTO) where nvcc is "
        "installed, or use --device cpu",
        device_name(device), device_name(device)));
  if (const std::string why = device_problem(device); !why.empty())
    throw InputError(
        fmt::format("--device {}: {}. Use --device cpu, or run where a GPU is visible.", device_name(device), why));
  return implementations().at({spec.name(), device}).make(spec);
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
  check_implementations();
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
  check_implementations();
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
  if (!def) {
    const std::vector<std::string> names = estimator_names();
    throw UsageError(
        fmt::format("unknown estimator '{}' in spec '{}'.{} Registered estimators: {} (see `attnprobe "
                    "list`).",
                    name, input, did_you_mean(name, names), join(names, ", ")));
  }
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
        if (known == def->params.end()) {
          std::vector<std::string> keys;
          for (const ParamDef& p : def->params) keys.push_back(p.name);
          throw UsageError(fmt::format("estimator '{}' has no parameter '{}' (in '{}').{} {}.", name, key, input,
                                       did_you_mean(key, keys), keys_list(*def)));
        }
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
  if (def->validate) def->validate(spec);
  return spec;
}

std::string Spec::canonical() const {
  if (values_.empty()) return def_->name;
  std::vector<std::string> parts;
  for (const auto& [key, value] : values_) parts.push_back(key + "=" + value);
  return def_->name + "(" + join(parts, ",") + ")";
}

std::string Spec::brief(Knob knob) const {
  std::vector<std::pair<std::string, std::string>> defaults;
  try {
    defaults = parse_spec(def_->name).values_;
  } catch (const UsageError&) {  // no default setting passes the rules across keys: every key is shown
  }
  std::vector<std::string> parts;
  for (size_t i = 0; i < values_.size(); ++i) {
    const auto& [key, value] = values_[i];
    const bool is_knob = key == def_->samples_knob;
    if (is_knob && knob == Knob::kNever) continue;
    if (!(is_knob && knob == Knob::kAlways) && i < defaults.size() && defaults[i].second == value) continue;
    parts.push_back(key + "=" + value);
  }
  return parts.empty() ? def_->name : def_->name + "(" + join(parts, ",") + ")";
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

std::vector<std::string> Spec::values() const {
  std::vector<std::string> texts;
  texts.reserve(values_.size());
  for (const auto& [key, value] : values_) texts.push_back(value);
  return texts;
}

Capabilities Spec::capabilities() const {
  Capabilities capabilities = def_->capabilities_for ? def_->capabilities_for(*this) : def_->capabilities;
  // Decode forms, weights and gradients exist only under the masks the setting computes (one that compresses the
  // prompt computes decode rows only).
  const Forms computed = capabilities.decode_only() ? capabilities.decode : capabilities.forms;
  capabilities.decode = capabilities.decode & computed;
  capabilities.weights = capabilities.weights & computed;
  capabilities.backward_forms = capabilities.backward_forms & capabilities.forms;
  return capabilities;
}

}  // namespace attnprobe
