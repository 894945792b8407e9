#pragma once
// What an estimator can do and where it runs, declared once in its CPU registration (registry.h), so
// a build without a device's backend still knows every device version, its forms and its parity
// tolerance: `list`, Python's estimators(), the plan's refusals and the conformance harness read these.
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "attnprobe/view/mask.h"

namespace attnprobe {

/// Where an estimator runs. Every estimator has a CPU version; others are declared with it.
enum class Device { kCpu, kCuda };
inline constexpr Device kAllDevices[] = {Device::kCpu, Device::kCuda};
/// "cpu" or "cuda"; throws UsageError otherwise.
Device parse_device(const std::string& name);
const char* device_name(Device device);

/// A set of masks: the forms an estimator computes (a causal form: output row i from tokens 0..i only; a
/// window form: from tokens i−W+1..i), or those under which it states its weights or has its backward form.
class Forms {
 public:
  constexpr Forms() = default;
  constexpr Forms(std::initializer_list<Mask> masks) {
    for (Mask mask : masks) bits_ |= bit(mask);
  }
  constexpr bool has(Mask mask) const { return (bits_ & bit(mask)) != 0; }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr Forms operator&(Forms other) const { return from_bits(bits_ & other.bits_); }
  constexpr bool operator==(const Forms&) const = default;
  /// The mask names, in Mask order ("full", "causal", "window").
  std::vector<std::string> names() const;

 private:
  static constexpr uint8_t bit(Mask mask) { return static_cast<uint8_t>(1u << static_cast<unsigned>(mask)); }
  static constexpr Forms from_bits(uint8_t bits) {
    Forms forms;
    forms.bits_ = bits;
    return forms;
  }
  uint8_t bits_ = 0;
};
inline constexpr Forms kFullOnly = {Mask::kFull};
inline constexpr Forms kFullAndCausal = {Mask::kFull, Mask::kCausal};
inline constexpr Forms kAllMasks = {Mask::kFull, Mask::kCausal, Mask::kWindow};

/// An estimator's backward form (Estimator::backward, the gradient metrics): what the gradient is of.
/// Gradients are compared only between an estimator and a reference of the same form.
enum class Backward {
  kNone,
  kOut,   ///< ∂⟨G, out⟩/∂(Q, V) (softmax, vmean, performer)
  kYoso,  ///< ∂⟨G, W·V⟩/∂(Q̂, V), Q̂ the normalised or lifted query rows (yoso, yoso-e)
};
/// The rounding points of an estimator that declares none of its own (Capabilities::rounding).
inline constexpr const char* kInputsAndOutputRounded =
    "inputs and output in the precision; every intermediate and accumulation float32";

/// "" (none), "out" or "yoso": the names `list` and Python print.
const char* backward_name(Backward backward);

/// Which heads share a kept set (Capabilities::shared_by).
enum class SharedBy { kHead, kGroup, kLayer };

struct Capabilities {
  bool random = true;       ///< draws random numbers (deterministic estimators run one trial)
  Forms forms = kFullOnly;  ///< the masks it computes on self-attention (query row i at position i)
  /// The masks of its decode form: query rows at positions against a longer cache of keys (decode steps, the
  /// last rows of a slice, cross-attention under the full mask), each row computed from its own query and
  /// the keys it sees, with the draws the whole slice would use (docs/specs.md, "Geometry"). Empty for an
  /// estimator whose rows depend on the other query rows (landmarks or samples of queries).
  Forms decode;
  Forms weights;  ///< the masks under which it states the attention weights it implies (docs/metrics.md)
  /// It states the keys each row reads (Estimator::kept_keys): the selection metrics apply to it.
  bool selection = false;
  /// It compresses the cache once from the prompt (docs/estimators/selection.md, "class B"): its state comes from
  /// the query rows before the first evaluated row (HeadView::prompt_qf), so it has a decode form only, on the
  /// last rows of a self-attention slice; a dump that stores only its decode rows lacks the prompt's queries.
  bool prompt = false;
  /// Its decode rows keep state fixed at the prompt boundary P (HeadView::prompt_end: the first evaluated row's
  /// position unless --prefill lowers it) from the keys before it (magicpig's tables of the prompt keys), so the
  /// last rows of a slice evaluated alone differ by design from the same rows of the whole slice's estimate, where
  /// P = 0 (the conformance decode property skips it).
  bool anchored = false;
  /// The query heads whose scores choose one kept set together (docs/estimators/selection.md, "Sharing a kept set
  /// over a kv group"): each head its own, every head of its kv group (share=group), or every head of its layer
  /// (tova(heads=layer)). A sweep gives its views the other heads' query rows, and for a layer the keys of the
  /// other kv heads (HeadView::group); a view without them is a group of one.
  SharedBy shared_by = SharedBy::kHead;
  /// It reads the dump's rotary frequencies (HeadView::rope_inv_freq: expected(stats=rope)), so it runs only on
  /// dumps that give them; `list --variants` leaves such settings to `--rotary` (the gate of a dump with them).
  bool rotary = false;
  /// It honours a dump's score shaping (additive bias, ALiBi, soft-cap: view/score_shaping.h) on the CPU: the logits
  /// it computes are the model's. The others estimate softmax(s·QKᵀ) from q and k alone and are refused there.
  bool shaping = false;
  /// Its rounding points below float32 (--precision bf16|f16, docs/precision.md) beyond the two every estimator has
  /// (inputs rounded before the call, the output after it): which stored intermediates it rounds, which
  /// accumulations stay float32, what it keeps in log space. Null: those two only, every intermediate float32.
  const char* rounding = nullptr;
  Backward backward = Backward::kNone;
  Forms backward_forms;  ///< the masks under which its backward form exists

  /// It measures decode rows after a prompt only: it reads the prompt's query rows, or it has a decode form and no
  /// form on whole slices (streaming(roll=0): its prompt is a position). `list --variants --prompt` lists these.
  bool decode_only() const { return prompt || (forms.empty() && !decode.empty()); }
};

/// The capabilities of a method that compresses or replays the cache from the prompt's query rows (class B and C
/// of the selection family): causal decode rows only, its kept keys and weights stated there.
inline constexpr Capabilities kDecodeAfterPrompt = {.random = false,
                                                    .forms = {},
                                                    .decode = {Mask::kCausal},
                                                    .weights = {Mask::kCausal},
                                                    .selection = true,
                                                    .prompt = true};

/// A version of the estimator for a device other than the CPU, declared beside the CPU version.
struct DeviceDeclaration {
  Device device = Device::kCuda;
  Forms forms = kFullOnly;  ///< the masks the device version computes (within the estimator's own)
  Forms decode;             ///< the masks of its decode form there
  /// Parity with the CPU version (the conformance harness): structural outputs identical, and
  ///  - an estimator with a float64 reference: its error against it at most 2× the CPU float32 path's plus this;
  ///  - otherwise (same draws, rounding only): ‖out_device − out_cpu‖_F ≤ this·‖out_cpu‖_F.
  double tolerance = 1e-4;
};

}  // namespace attnprobe
