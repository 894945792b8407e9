#pragma once
// streaming(sink, window) — StreamingLLM's attention sinks (docs/estimators/selection.md). Target: softmax.
// Row t keeps S_t = [0, sink) ∪ [t − window + 1, t] within the keys it sees, and attends them with their exact
// logits (w = 1): the rolling cache of StartRecentKVCache(start_size = sink, recent_size = window − 1), one token
// a step. Without the positional re-rotation of the paper (it needs keys before RoPE: the dumps hold them after).
// Positional: causal and window masks only (the full mask has no recency). sink + window ≥ t + 1 is exact.
// roll=0 is kvpress's StreamingLLMPress instead, the prompt compressed once at the prefill boundary P (the first
// evaluated row of a --queries last:W case): S_t = [0, sink) ∪ [P − window, P) ∪ [P, t] — `window` then counts the
// prompt's last keys kept, and decode keys are never evicted. It needs positions after a prompt (P > 0): causal
// decode rows only.
#include <cstdint>

namespace attnprobe {

struct StreamingParams {
  int64_t sink = 4;      ///< the first keys, always kept (StreamingLLM's start_size)
  int64_t window = 256;  ///< the last keys up to the query's own (recent_size + 1); the samples knob
  bool roll = true;      ///< evict every step (StreamingLLM); false: compress the prompt once (kvpress)
};

}  // namespace attnprobe
