#pragma once
// What a model does to the scores s·q·k before the softmax besides the mask (docs/dumps.md, "Score shaping"):
// an additive bias per (query, key) pair (T5's relative buckets, any learned bias), ALiBi's linear bias, and a
// soft-cap (Gemma 2: c·tanh(S/c)). Exact attention honours it; estimators declare whether they can
// (Capabilities::shaping) and the others are refused.
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "attnprobe/common/matrix.h"

namespace attnprobe {

/// "a soft-cap of 50, ALiBi and an additive bias" (the parts present; "nothing" when none).
std::string shaping_description(double softcap, bool alibi, bool bias);

struct ScoreShaping {
  /// c > 0: the score S = s·q·k becomes c·tanh(S/c) (Gemma 2's attention logit soft-capping); 0: none.
  double softcap = 0;
  /// Whether the bias is added before the soft-cap (c·tanh((S + b)/c)) instead of after it (c·tanh(S/c) + b, the
  /// order of the models that have both). The dump attribute `bias_before_softcap`.
  bool bias_before_softcap = false;
  /// ALiBi's slope m of this head: adds m·(j − t) to the score of key j for the query at position t. Models write it
  /// as m·j (Bloom) or −m·(t − j) (the paper); they differ by a constant per row, which the softmax ignores.
  double alibi_slope = 0;
  /// An additive bias for each (query row, key) of the view (rows × keys, float64 as stored), or null.
  std::shared_ptr<const MatrixD> bias;

  bool any() const { return softcap > 0 || alibi_slope != 0 || bias != nullptr; }

  /// The logit of key `key` for query row `row` at absolute position `position`, from its score s·q·k, in T
  /// (double for the reference, float for the float32 path, which rounds the bias to float as a kernel would).
  template <class T>
  T logit(T score, int64_t row, int64_t position, int64_t key) const {
    T added = 0;
    if (bias != nullptr) added += static_cast<T>((*bias)(row, key));
    if (alibi_slope != 0) added += static_cast<T>(alibi_slope) * static_cast<T>(key - position);
    if (!(softcap > 0)) return score + added;
    const T cap = static_cast<T>(softcap);
    return bias_before_softcap ? cap * std::tanh((score + added) / cap) : cap * std::tanh(score / cap) + added;
  }

  /// The same shaping for rows [first, first + count) of this view's rows against its first `keys` keys (a view of
  /// its last rows, or of a prefix of its tokens).
  ScoreShaping cut(int64_t first, int64_t count, int64_t keys) const {
    ScoreShaping part = *this;
    if (bias != nullptr) part.bias = std::make_shared<const MatrixD>(bias->block(first, 0, count, keys));
    return part;
  }

  /// What it does, for messages: e.g. "a soft-cap of 50 and an additive bias".
  std::string description() const { return shaping_description(softcap, alibi_slope != 0, bias != nullptr); }
};

}  // namespace attnprobe
