#pragma once
// duo(sink, window, pattern, threshold, fraction, mix) — DuoAttention's retrieval and streaming heads
// (docs/estimators/selection.md). Target: softmax. A pattern file (DuoAttention's full_attention_heads.tsv: one
// line per layer, one tab-separated value α per kv head, no header) labels each (layer, kv head); α is clipped
// to [0, 1]. Query head h of a layer is a retrieval head iff the α of its kv head is ≥ threshold (or, with
// fraction f ≥ 0, iff its pair is not among the ⌊f·pairs⌋ with the lowest α, ties by (α, layer, kv head), as
// kvpress's DuoAttentionPress). Retrieval heads attend every key they see (exact); streaming heads attend
// streaming(sink, window): the first `sink` keys and the last `window` up to the query's own (DuoAttention's
// decode cache of sink + recent keys plus the new token: window = recent + 1). No pattern: every head streams
// (a per-head probe of how streamable it is, to compare with shipped labels). mix=1 is the training-time blend
// ô = α·o + (1 − α)·streaming(sink, window − 1) (its mask is recent keys without the +1), stated through
// log-weights ω_j = log Â_tj − ℓ_j over every key the row sees. Deterministic; causal and window masks (positions).
// Cost per row: |S_t|·(p + pv); mix reads every visible key.
#include <cstdint>
#include <string>
#include <vector>

namespace attnprobe {

struct DuoParams {
  int64_t sink = 128;      ///< DuoAttention's sink size
  int64_t window = 257;    ///< recent size 256 plus the query's own key
  std::string pattern;     ///< the full_attention_heads.tsv; "" streams every head
  double threshold = 0.5;  ///< retrieval iff α ≥ threshold
  double fraction = -1;    ///< ≥ 0: stream this fraction of all (layer, kv head) pairs, the lowest α first
  bool mix = false;        ///< the training-time blend by α instead of the 0/1 label
};

/// α[layer][kv head] from a DuoAttention pattern file, clipped to [0, 1]; throws InputError naming the file and
/// line for what it cannot read (a missing file, a value that is not a finite number, ragged or empty lines).
std::vector<std::vector<double>> read_duo_pattern(const std::string& path);

}  // namespace attnprobe
