// The conformance harness (ggml's test-backend-ops, read through xformers' declarations): one walk over the
// registry that checks every estimator setting (`variants`) on every device this build can run and every
// mask it declares there, at awkward shapes, each case with a printed id and a fixed seed. Nothing here
// names an estimator: a new one is checked by registering it. Properties:
//   spec          the spec and its defaults round trip; the samples knob; a deterministic target; help
//   determinism   the same key gives the same bits; another trial changes them iff the setting is random;
//                 the right shape; finite values
//   pools         the same bits without a pool, on one thread and on two (CPU)
//   reference     a deterministic estimator's float64 reference agrees with its float32 estimate
//   leak          under a causal mask no later token changes an earlier row (estimate and reference)
//   weights       the weights it declares reproduce its output (Â·V); none where it declares none
//   backward      a backward of form `out` matches central differences of its float64 output
//   parity        a device version against the CPU's: the same draws, within the declared tolerance
//   flops, baseline: bench can place it under the roofline; the regression gate has rows for it
// Each property is a function returning "" or what failed, so the negative controls at the end can show
// that it fails on an estimator built to break it (registered here, family "test-bad", never walked).
// ATTNPROBE_CONFORMANCE=TEXT keeps only the cases whose id contains TEXT.
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>

#include "attnprobe/common/error.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/rounded_estimate.h"
#include "attnprobe/exact/exact_attention.h"
#include "attnprobe/records/csv.h"
#include "attnprobe/rng/random_matrix.h"
#include "attnprobe/view/rounded_view.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

namespace {

struct Shape {
  int64_t n;
  int p, pv;  ///< pv ≠ p catches an estimator that confuses the two
};

struct ConformanceCase {
  std::string spec;  ///< canonical
  Device device = Device::kCpu;
  Mask mask = Mask::kFull;
  Shape shape{};
  uint64_t seed = 0;

  // window:W cases see about a third of the slice, so windows start inside the kernels' blocks.
  int64_t window() const { return mask == Mask::kWindow ? std::max<int64_t>(1, shape.n / 3) : 0; }
  std::string id() const {
    return fmt::format("{} {} {} n={} p={} pv={} seed={}", spec, device_name(device), mask_text(mask, window()),
                       shape.n, shape.p, shape.pv, seed);
  }
  HeadView view() const {
    HeadView view = synth_slice(shape.n, shape.p, 0.3, seed, shape.pv);
    view.mask = mask;
    view.window = window();
    return view;
  }
  EstimateContext context(uint32_t trial = 0) const { return {make_random_key(seed, spec, trial), nullptr}; }
};

// The families that are not the library's estimators: this binary's own test registrations.
bool walked(const EstimatorDef& def) { return def.family != "test" && def.family != "test-bad"; }

std::string filter() {
  const char* text = std::getenv("ATTNPROBE_CONFORMANCE");
  return text ? text : "";
}

// Whether `device` can run here; its cases are skipped (and counted) otherwise.
bool runnable(Device device) { return device_compiled(device) && device_problem(device).empty(); }

// Every setting of every walked estimator × each device that declares it and can run here × each mask the
// setting computes there (with `decode`, each mask of its decode form there) × `shapes`. `masks` narrows the
// masks (e.g. the leak harness: causal and window only).
std::vector<ConformanceCase> cases(const std::vector<Shape>& shapes, Forms masks = kAllMasks, bool cpu_only = false,
                                   bool decode = false) {
  std::vector<ConformanceCase> out;
  const std::string only = filter();
  for (const EstimatorDef* def : registered_estimators()) {
    if (!walked(*def)) continue;
    for (const std::string& text : variants(*def)) {
      const Spec spec = parse_spec(text);
      for (const Device device : devices_of(*def)) {
        if ((cpu_only && device != Device::kCpu) || !runnable(device)) continue;
        const DeviceDeclaration& declared = *device_declaration(*def, device);
        const Forms forms = decode ? spec.capabilities().decode & declared.decode & masks
                                   : spec.capabilities().forms & declared.forms & masks;
        for (const Mask mask : {Mask::kFull, Mask::kCausal, Mask::kWindow}) {
          if (!forms.has(mask)) continue;
          for (size_t s = 0; s < shapes.size(); ++s) {
            ConformanceCase c{text, device, mask, shapes[s], 11 + s};
            if (c.id().find(only) != std::string::npos) out.push_back(c);
          }
        }
      }
    }
  }
  return out;
}

MatrixF run(const ConformanceCase& c, const HeadView& view, uint32_t trial = 0) {
  MatrixF out;
  make_estimator(parse_spec(c.spec), c.device)->estimate(view, c.context(trial), out);
  return out;
}

double relative(const MatrixD& a, const MatrixD& b) { return (a - b).norm() / b.norm(); }

// ---- the properties -----------------------------------------------------------------------------------

std::string spec_round_trip(const EstimatorDef& def) {
  const Spec spec = parse_spec(def.name);
  if (!(parse_spec(spec.canonical()) == spec)) return "the canonical spec does not parse back to itself";
  if (parse_spec(spec.canonical()).canonical() != spec.canonical()) return "the canonical spec is not canonical";
  for (const std::string& text : variants(def))
    if (parse_spec(text).canonical() != text) return "variant " + text + " is not canonical";
  if (def.summary.empty()) return "no summary";
  // Every built-in estimator says what it stores below float32 (docs/precision.md); the inputs-and-output default is
  // for estimators defined elsewhere (Python's py: estimators).
  if (!def.capabilities.rounding) return "no rounding points declared (Capabilities::rounding)";
  if (def.page.empty() || !std::filesystem::exists(std::string(ATTNPROBE_SOURCE_DIR) + "/docs/" + def.page))
    return "its documentation page docs/" + def.page + " does not exist";
  for (const ParamDef& p : def.params) {
    if (p.help.empty()) return "key " + p.name + " has no help";
    // The default printed by `list` is the value a spec without the key gets.
    const Spec given = parse_spec(fmt::format("{}({}={})", def.name, p.name, p.default_value));
    if (!(given == spec)) return "key " + p.name + "'s default does not parse to the default setting";
  }
  if (spec.has_samples_knob()) {
    // Above the default: a knob may have a floor set by another key (snapkv's budget counts its window).
    const int64_t samples = spec.samples() + 6;
    const Spec more = spec.with_samples(samples);
    if (more.samples() != samples || !(parse_spec(more.canonical()) == more))
      return "the samples knob does not round trip";
  }
  if (parse_spec(spec.target()).random()) return "its target " + spec.target() + " is random";
  return "";
}

// The longest of the walk's shapes (kShapes, below): every default budget leaves keys out there.
constexpr int64_t kLongShape = 300;

std::string determinism(const ConformanceCase& c) {
  const HeadView view = c.view();
  const MatrixF a = run(c, view), b = run(c, view), other = run(c, view, 1);
  if (a.rows() != view.n() || a.cols() != view.pv())
    return fmt::format("returned {} × {} for a {} × {} slice", a.rows(), a.cols(), view.n(), view.pv());
  if (!a.allFinite()) return "non-finite values";
  if (a != b) return "the same key gave different bits";
  const bool random = parse_spec(c.spec).random();
  // A random setting may be exact on a short slice (a budget that covers every key), so it must draw on
  // the longest shape only.
  if (random && c.shape.n >= kLongShape && a == other) return "declared random, but another trial gave the same bits";
  if (!random && a != other) return "declared deterministic, but another trial changed the bits";
  return "";
}

std::string pool_invariance(const ConformanceCase& c) {
  const PooledEstimates runs = estimate_with_pools(c.spec, c.view(), c.context().key);
  if (!(runs.alone == runs.one_thread)) return "a one-thread pool changed the bits";
  if (!(runs.alone == runs.two_threads)) return "a two-thread pool changed the bits";
  return "";
}

// float32 against float64 evaluation of the same formula: ~1e-7 relative.
constexpr double kReferenceTolerance = 1e-5;
std::string reference_agrees(const ConformanceCase& c) {
  const auto estimator = make_estimator(parse_spec(c.spec), c.device);
  const HeadView view = c.view();
  const auto reference = estimator->reference(view, nullptr);
  if (!reference) return "";
  const double error = relative(run(c, view).cast<double>(), *reference);
  return error <= kReferenceTolerance ? "" : fmt::format("float32 estimate {:.3g} from its float64 reference", error);
}

std::string no_causal_leak(const ConformanceCase& c) {
  const HeadView view = c.view();
  const auto estimator = make_estimator(parse_spec(c.spec), c.device);
  for (const int64_t j : {int64_t{1}, view.n() / 3, view.n() / 2 + 1, view.n() - 1}) {
    const HeadView changed = with_tokens_replaced(view, j, 77 + j);
    if (!rows_identical(run(c, view, 3), run(c, changed, 3), j))
      return fmt::format("replacing tokens {}.. changed an earlier row", j);
    const auto ref = estimator->reference(view, nullptr), ref_changed = estimator->reference(changed, nullptr);
    if (ref && ref->topRows(j) != ref_changed->topRows(j))
      return fmt::format("replacing tokens {}.. changed an earlier row of the float64 reference", j);
  }
  return "";
}

// The implied weights reproduce the float32 estimate (float32 rounding: observed ≤ 4.4e-7, linformer) and
// are zero above the diagonal under the causal mask; an estimator states them exactly where it declares so.
constexpr double kWeightsTolerance = 1e-5;
std::string weights_reproduce(const ConformanceCase& c) {
  const Spec spec = parse_spec(c.spec);
  const auto estimator = spec.make();
  const HeadView view = c.view();
  const EstimateContext ctx = c.context(1);
  const bool declared = spec.capabilities().weights.has(c.mask);
  Estimator::WeightRows rows;
  try {
    rows = estimator->weights(view, ctx);
  } catch (const UsageError&) {  // the refusal of an undeclared mask
    rows = nullptr;
  }
  if (static_cast<bool>(rows) != declared)
    return declared ? "declares its weights but states none" : "states weights it does not declare";
  if (!rows) return "";
  const int64_t split = view.n() / 3;  // two uneven blocks
  MatrixD w(view.n(), view.k.rows());
  w.topRows(split) = rows(0, split);
  w.bottomRows(view.n() - split) = rows(split, view.n() - split);
  if (c.mask == Mask::kCausal && !MatrixD(w.triangularView<Eigen::StrictlyUpper>()).isZero(0))
    return "causal weights above the diagonal";
  MatrixF out;
  estimator->estimate(view, ctx, out);
  const double error = relative(w * view.v, out.cast<double>());
  return error <= kWeightsTolerance ? "" : fmt::format("Â·V is {:.3g} from the estimate", error);
}

// A backward of form `out` is the gradient of L = ⟨G, out⟩ with respect to Q and V: against central
// differences (h = 1e-6) of the float64 output Â·V with the same draws (truncation ~h², rounding ~1e-10).
// Observed ≤ 1.5e-9 (softmax, vmean, performer; full and causal).
constexpr double kGradientTolerance = 1e-7;
std::string backward_matches(const ConformanceCase& c) {
  const Spec spec = parse_spec(c.spec);
  const Capabilities can = spec.capabilities();
  if (can.backward != Backward::kOut || !can.backward_forms.has(c.mask)) return "";
  const auto estimator = spec.make();
  const HeadView view = c.view();
  const EstimateContext ctx = c.context();
  const MatrixD g = normal_rows(RandomStream(make_random_key(c.seed, "upstream", 0), Purpose::kUpstreamGradient),
                                view.n(), view.pv());
  const auto grad = estimator->backward(view, g, ctx);
  if (!grad) return "declares a backward form but has none";
  auto loss = [&](const MatrixD& q, const MatrixD& v) {
    const HeadView moved = with_data(view, q, view.k, v);
    return (g.array() * (estimator->weights(moved, ctx)(0, moved.n()) * v).array()).sum();
  };
  const MatrixD fd_q = central_differences(view.q, 1e-6, [&](const MatrixD& q) { return loss(q, view.v); });
  const MatrixD fd_v = central_differences(view.v, 1e-6, [&](const MatrixD& v) { return loss(view.q, v); });
  const double error_q = fd_q.norm() == 0 ? grad->q.norm() : relative(grad->q, fd_q);
  const double error_v = relative(grad->v, fd_v);
  if (error_q > kGradientTolerance || error_v > kGradientTolerance)
    return fmt::format("gradients {:.3g} (Q), {:.3g} (V) from central differences", error_q, error_v);
  return "";
}

// A device version against the CPU's on `view`, by the rule its declaration states (capabilities.h).
std::string device_parity_on(const ConformanceCase& c, const HeadView& view) {
  if (c.device == Device::kCpu) return "";
  const Spec spec = parse_spec(c.spec);
  const double tolerance = device_declaration(spec.def(), c.device)->tolerance;
  ConformanceCase on_cpu = c;
  on_cpu.device = Device::kCpu;
  const MatrixF cpu = run(on_cpu, view), device = run(c, view);
  if (device.rows() != cpu.rows() || device.cols() != cpu.cols() || !device.allFinite())
    return "wrong shape or non-finite values";
  if (const auto reference = spec.make()->reference(view, nullptr)) {
    const double cpu_error = relative(cpu.cast<double>(), *reference),
                 device_error = relative(device.cast<double>(), *reference);
    if (device_error > 2 * cpu_error + tolerance)
      return fmt::format("error {:.3g} against the float64 reference, the CPU's {:.3g}", device_error, cpu_error);
    return "";
  }
  const double gap = relative(device.cast<double>(), cpu.cast<double>());
  return gap <= tolerance ? "" : fmt::format("{:.3g} from the CPU version (declared {:g})", gap, tolerance);
}

std::string device_parity(const ConformanceCase& c) { return device_parity_on(c, c.view()); }

// A device's decode form, by the same rule, on the last rows of the slice against all its keys (one row, a
// few, half). A device kernel chooses its own splits of the keys, so its decode rows are held to the
// declared tolerance, not to the bits of its whole-slice rows as on the CPU (last_rows_equal).
std::string device_decode_parity(const ConformanceCase& c) {
  const HeadView whole = c.view();
  for (const int64_t rows : {int64_t{1}, int64_t{7}, whole.n() / 2})
    if (std::string problem = device_parity_on(c, last_rows(whole, rows)); !problem.empty())
      return fmt::format("the last {} rows: {}", rows, problem);
  return "";
}

// A decode form: the last rows of a slice evaluated alone against all its keys (a decode step with the slice as
// its cache; the draws are keyed without the queries, DESIGN §11) give the very bits of the same rows of the
// whole slice's estimate: one row, a few, half the slice.
std::string last_rows_equal(const ConformanceCase& c) {
  // An estimator that compresses the prompt has no whole-slice estimate to compare with: its decode rows depend on
  // where the prompt ends (tests/test_selection.cpp checks them against their definition and for leaks).
  // Nor one anchored at the prompt boundary (its state comes from the keys before the first evaluated row).
  if (parse_spec(c.spec).capabilities().decode_only() || parse_spec(c.spec).capabilities().anchored) return "";
  const HeadView whole = c.view();
  const MatrixF all = run(c, whole, 2);
  for (const int64_t rows : {int64_t{1}, int64_t{7}, whole.n() / 2}) {
    const MatrixF last = run(c, last_rows(whole, rows), 2);
    if (last.rows() != rows || last.cols() != whole.pv())
      return fmt::format("the last {} rows alone gave a {} × {} estimate", rows, last.rows(), last.cols());
    if (!rows_identical(last, all.bottomRows(rows), rows))
      return fmt::format("the last {} rows alone differ from those of the whole slice", rows);
  }
  return "";
}

// Below float32 (--precision, docs/precision.md), on the CPU: the estimate of the view rounded to bf16 and to f16 is
// deterministic, finite on these ordinary slices and representable in the precision; and a decode form that
// last_rows_equal holds keeps it there: the last rows of the rounded slice alone are the same rows of its estimate.
std::string rounded_forms(const ConformanceCase& c) {
  const Spec spec = parse_spec(c.spec);
  const auto estimator = spec.make();
  const Capabilities can = spec.capabilities();
  const bool decode = can.decode.has(c.mask) && !can.decode_only() && !can.anchored;
  for (const Precision precision : {Precision::kBf16, Precision::kF16}) {
    const HeadView whole = rounded_view(c.view(), precision);
    MatrixF first, again;
    estimate_at_precision(*estimator, whole, c.context(2), precision, first);
    estimate_at_precision(*estimator, whole, c.context(2), precision, again);
    const char* name = precision_name(precision);
    if (!first.allFinite()) return fmt::format("{}: non-finite values", name);
    if (first != again) return fmt::format("{}: two calls with one key differ", name);
    for (int64_t i = 0; i < first.size(); ++i)
      if (round_to(first.data()[i], precision) != first.data()[i])
        return fmt::format("{}: a value not representable in it", name);
    if (!decode) continue;
    MatrixF last;
    estimate_at_precision(*estimator, last_rows(whole, 7), c.context(2), precision, last);
    if (!rows_identical(last, first.bottomRows(7), 7))
      return fmt::format("{}: the last 7 rows alone differ from those of the whole slice", name);
  }
  return "";
}

// Checks `property` on every case, printing each case's id; counts what it checked.
int check_all(const std::vector<ConformanceCase>& all,
              const std::function<std::string(const ConformanceCase&)>& property) {
  for (const ConformanceCase& c : all) {
    INFO(c.id());
    CHECK(property(c) == "");
  }
  return static_cast<int>(all.size());
}

// The shapes: inside one block, across the kernels' 64/128/256/512-row blocks and 1024-key chunks.
const std::vector<Shape> kShapes = {{37, 8, 11}, {97, 16, 19}, {300, 32, 32}};

}  // namespace

TEST_CASE("conformance: the cases, one line each", "[conformance]") {
  const std::vector<ConformanceCase> all = cases(kShapes);
  for (const ConformanceCase& c : all) WARN("case " << c.id());
  int skipped_devices = 0;
  for (const EstimatorDef* def : registered_estimators())
    for (const Device device : devices_of(*def)) skipped_devices += walked(*def) && !runnable(device);
  WARN(all.size() << " cases; " << skipped_devices << " device versions skipped here (backend not built or no device)");
  CHECK(all.size() >= 3 * 57);  // 57 variants (`list --variants`) at three shapes, more with their causal forms
}

TEST_CASE("conformance: specs round trip with their defaults", "[conformance][registry]") {
  int walked_estimators = 0;
  for (const EstimatorDef* def : registered_estimators()) {
    if (!walked(*def)) continue;
    INFO(def->name);
    CHECK(spec_round_trip(*def) == "");
    ++walked_estimators;
  }
  CHECK(walked_estimators >= 16);
}

TEST_CASE("conformance: determinism per key, shape, finiteness", "[conformance]") {
  CHECK(check_all(cases(kShapes), determinism) > 0);
}

TEST_CASE("conformance: the same bits on any pool", "[conformance][threads]") {
  // n = 1300 spans several row blocks (256 and 128 rows) and key chunks (1024 keys) of every blocked estimator.
  CHECK(check_all(cases({{1300, 16, 12}}, kAllMasks, true), pool_invariance) >= 57);
}

TEST_CASE("conformance: float64 references agree with their float32 estimates", "[conformance]") {
  CHECK(check_all(cases({{64, 8, 8}, {300, 16, 12}}, kAllMasks, true), reference_agrees) > 0);
}

TEST_CASE("conformance: no causal form lets a later token change an earlier row", "[conformance][causal][leak]") {
  // Every variant with a causal form (`list --variants --causal`: 18) at three shapes, and the window forms.
  CHECK(check_all(cases({{37, 8, 8}, {300, 16, 16}, {700, 32, 32}}, {Mask::kCausal, Mask::kWindow}), no_causal_leak) >=
        3 * 17);
}

TEST_CASE("conformance: decode rows equal the same rows of the whole slice, bit for bit", "[conformance][decode]") {
  // Every variant with a decode form, under each mask of it, at awkward shapes (devices: device_decode_parity).
  CHECK(check_all(cases({{37, 8, 11}, {300, 16, 19}, {1100, 32, 32}}, kAllMasks, true, true), last_rows_equal) > 0);
}

TEST_CASE("conformance: in bf16 and f16, deterministic, finite, representable, and decode rows kept",
          "[conformance][precision]") {
  CHECK(check_all(cases({{97, 16, 19}}, kAllMasks, true), rounded_forms) >= 57);
}

TEST_CASE("conformance: stated weights reproduce the output", "[conformance][weights]") {
  CHECK(check_all(cases({{300, 16, 12}}, kAllMasks, true), weights_reproduce) >= 57 + 17);
}

TEST_CASE("conformance: backward passes match central differences", "[conformance][gradients]") {
  CHECK(check_all(cases({{12, 8, 6}}, kAllMasks, true), backward_matches) > 0);
}

TEST_CASE("conformance: device versions agree with the CPU's", "[conformance][gpu]") {
  std::vector<ConformanceCase> on_devices;
  for (const ConformanceCase& c : cases({{97, 50, 50}, {1025, 64, 64}, {4096, 128, 128}}))
    if (c.device != Device::kCpu) on_devices.push_back(c);
  if (on_devices.empty()) SKIP_TEST("no device other than the CPU can run here (backend not built or no GPU)");
  check_all(on_devices, device_parity);
}

TEST_CASE("conformance: device decode forms agree with the CPU's", "[conformance][gpu][decode]") {
  // Shapes past one block of keys (512) and one split (kernels' thousands), p ≠ pv, and a 4096-key cache.
  std::vector<ConformanceCase> on_devices;
  for (const ConformanceCase& c :
       cases({{97, 50, 40}, {1025, 64, 64}, {4096, 128, 128}, {5000, 100, 128}}, kAllMasks, false, true))
    if (c.device != Device::kCpu) on_devices.push_back(c);
  if (on_devices.empty()) SKIP_TEST("no device decode form can run here (backend not built or no GPU)");
  check_all(on_devices, device_decode_parity);
}

TEST_CASE("conformance: every estimator counts its flops", "[conformance][bench]") {
  // bench's GFLOP/s and %peak columns are blank for an estimator whose flops() is the default 0.
  for (const EstimatorDef* def : registered_estimators()) {
    if (!walked(*def)) continue;
    INFO(def->name);
    const auto estimator = parse_spec(def->name).make();
    const double at_1024 = estimator->flops(1024, 64, 64);
    CHECK(at_1024 > 0);
    CHECK(estimator->flops(4096, 64, 64) > at_1024);   // work grows with n
    CHECK(estimator->flops(1024, 64, 128) > at_1024);  // and with the value width
  }
}

TEST_CASE("conformance: every estimator has a committed baseline", "[conformance][check]") {
  for (const std::string name : {"synth-demo", "synth-demo-causal"}) {
    const CsvContents baseline = read_csv(std::string(ATTNPROBE_SOURCE_DIR) + "/data/baselines/" + name + ".csv");
    REQUIRE(baseline.summary);
    for (const EstimatorDef* def : registered_estimators()) {
      if (!walked(*def)) continue;
      for (const std::string& spec : variants(*def)) {
        if (name == std::string("synth-demo-causal") && !parse_spec(spec).causal()) continue;
        // The full gate runs the settings with a full form (`list --variants --full`).
        if (name == std::string("synth-demo") && !parse_spec(spec).capabilities().forms.has(Mask::kFull)) continue;
        const bool present = std::any_of(baseline.summaries.begin(), baseline.summaries.end(),
                                         [&](const SummaryRow& s) { return s.key.spec == spec; });
        INFO(spec << " has no rows in data/baselines/" << name << ".csv: run tools/baseline.sh --refresh");
        CHECK(present);
      }
    }
  }
}

// ---- negative controls: each property fails on an estimator built to break it ---------------------------

namespace {

// Exact attention with one defect each, chosen by the spec: an estimator every property passes but one.
enum class Defect {
  kLeaks,
  kUnkeyed,
  kIgnoresKey,  ///< declared random, draws nothing
  kUsesKey,     ///< declared deterministic, depends on the key
  kPoolDependent,
  kWrongReference,
  kWrongWeights,
  kWrongGradient,
  kNonFinite,
  kWrongShape
};

struct BadParams {
  Defect defect = Defect::kLeaks;
};

class Defective final : public Estimator {
 public:
  explicit Defective(BadParams params) : defect_(params.defect) {}
  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    MatrixD exact = parse_spec("softmax").make()->reference(view, nullptr).value();
    if (defect_ == Defect::kLeaks && view.mask == Mask::kCausal)  // every row sees the last value row
      exact.rowwise() += 1e-3 * view.v.row(view.n() - 1);
    if (defect_ == Defect::kUnkeyed) exact *= 1.0 + 1e-3 * static_cast<double>(unkeyed_calls++ % 7);
    if (defect_ == Defect::kUsesKey) exact *= 1.0 + 1e-3 * static_cast<double>(ctx.key.value % 7 + 1);
    if (defect_ == Defect::kPoolDependent && ctx.pool) exact *= 1.0 + 1e-6;
    if (defect_ == Defect::kWrongReference) exact *= 1.001;
    if (defect_ == Defect::kNonFinite) exact(0, 0) = std::numeric_limits<double>::quiet_NaN();
    out = exact.cast<float>();
    if (defect_ == Defect::kWrongShape) out.conservativeResize(view.n() - 1, view.pv());
  }
  std::optional<MatrixD> reference(const HeadView& view, ThreadPool*) const override {
    if (defect_ != Defect::kWrongReference) return std::nullopt;
    return parse_spec("softmax").make()->reference(view, nullptr);
  }
  WeightRows weights(const HeadView& view, const EstimateContext&) const override {
    const double scale = defect_ == Defect::kWrongWeights ? 1.01 : 1.0;
    return [&view, scale](int64_t r0, int64_t rows) {
      return MatrixD(scale * attention_rows_f64(view.q, view.k, view.scale, r0, rows, view.mask));
    };
  }
  std::optional<Gradients> backward(const HeadView& view, const MatrixD& upstream,
                                    const EstimateContext& ctx) const override {
    Gradients grad = *parse_spec("softmax").make()->backward(view, upstream, ctx);
    if (defect_ == Defect::kWrongGradient) grad.v *= 1.01;
    return grad;
  }
  double flops(int64_t n, int64_t p, int64_t pv) const override { return 2.0 * n * n * (p + pv); }

 private:
  Defect defect_;
  static inline std::atomic<int> unkeyed_calls = 0;  ///< state shared across calls: what no estimator may have
};

[[maybe_unused]] const bool kBadRegistered = register_estimator(Declaration<BadParams>{
    .name = "test-bad",
    .family = "test-bad",
    .summary = "exact attention with one defect, to show that each conformance property can fail",
    .params = ParamSet<BadParams>().choice("defect", &BadParams::defect,
                                           {{"leaks", Defect::kLeaks},
                                            {"unkeyed", Defect::kUnkeyed},
                                            {"ignores_key", Defect::kIgnoresKey},
                                            {"uses_key", Defect::kUsesKey},
                                            {"pool", Defect::kPoolDependent},
                                            {"reference", Defect::kWrongReference},
                                            {"weights", Defect::kWrongWeights},
                                            {"gradient", Defect::kWrongGradient},
                                            {"nonfinite", Defect::kNonFinite},
                                            {"shape", Defect::kWrongShape}},
                                           "which property it breaks"),
    .capabilities = {.random = false,
                     .forms = kFullAndCausal,
                     .weights = kFullAndCausal,
                     .backward = Backward::kOut,
                     .backward_forms = kFullAndCausal},
    .narrow = [](const BadParams& params, Capabilities& can) { can.random = params.defect == Defect::kIgnoresKey; },
    .make = [](const BadParams& params) { return std::make_unique<Defective>(params); },
});

ConformanceCase bad(const std::string& defect, Mask mask = Mask::kFull, Shape shape = {97, 16, 19}) {
  return {parse_spec("test-bad(defect=" + defect + ")").canonical(), Device::kCpu, mask, shape, 5};
}

}  // namespace

TEST_CASE("conformance negative controls: each property catches the estimator built to break it",
          "[conformance][negative]") {
  // The same estimator without its defect passes them all.
  for (const Mask mask : {Mask::kFull, Mask::kCausal}) {
    ConformanceCase good = bad("leaks", Mask::kFull, {60, 8, 8});
    good.spec = "softmax";
    good.mask = mask;
    CHECK(determinism(good) == "");
    if (mask == Mask::kCausal) CHECK(no_causal_leak(good) == "");
    CHECK(weights_reproduce(good) == "");
    CHECK(backward_matches(ConformanceCase{good.spec, Device::kCpu, mask, {12, 8, 6}, 5}) == "");
  }
  CHECK_THAT(no_causal_leak(bad("leaks", Mask::kCausal, {60, 8, 8})), Catch::Contains("changed an earlier row"));
  CHECK_THAT(determinism(bad("unkeyed")), Catch::Contains("same key gave different bits"));
  CHECK_THAT(determinism(bad("ignores_key", Mask::kFull, {kLongShape, 16, 16})),
             Catch::Contains("declared random, but another trial gave the same bits"));
  CHECK_THAT(determinism(bad("uses_key")), Catch::Contains("declared deterministic, but another trial changed"));
  CHECK_THAT(determinism(bad("nonfinite")), Catch::Contains("non-finite"));
  CHECK_THAT(determinism(bad("shape")), Catch::Contains("returned 96 × 19"));
  CHECK_THAT(pool_invariance(bad("pool")), Catch::Contains("pool changed the bits"));
  CHECK_THAT(weights_reproduce(bad("weights")), Catch::Contains("from the estimate"));
  CHECK_THAT(backward_matches(bad("gradient", Mask::kFull, {12, 8, 6})), Catch::Contains("central differences"));
  CHECK_THAT(reference_agrees(bad("reference")), Catch::Contains("from its float64 reference"));
}
