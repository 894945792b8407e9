#pragma once
// The attention mask of a case: which keys a query attends to (docs/specs.md, "Masks").
#include <optional>
#include <string_view>

namespace attnprobe {

/// All n keys (`full`, bidirectional: encoders) or keys j ≤ i (`causal`: decoders). The mask is part
/// of the case: the reference is the softmax with this mask, and only estimators registered with a
/// causal form may run under `causal` (each output row i then depends on tokens 0..i alone).
enum class Mask { kFull, kCausal };

/// "full" | "causal" (the CSV's `mask` column and the case id's `;mask=causal`).
const char* mask_name(Mask mask);
/// Parses "full" | "causal"; nullopt for anything else.
std::optional<Mask> parse_mask(std::string_view text);

}  // namespace attnprobe
