#pragma once
// moba(block, topk) — Mixture of Block Attention's gate applied at decode, training-free
// (docs/estimators/selection.md). Target: softmax. Keys in blocks of `block` aligned to key 0; the row at position t
// attends its own block up to itself, [⌊t/block⌋·block, t], and the topk − 1 complete past blocks with the largest
// gate g_b = s·q_t·k̄_b (k̄_b the mean of the block's keys, float64; ties to the older block); w = 1. A row with at
// most topk − 1 past blocks is exact. The release runs dense attention at decode: this is what a MoBA decode kernel
// would compute. Causal mask only (the current block is a position). keys_scored: the past blocks' means.
#include <cstdint>

#include "attnprobe/estimators/selection/sharing.h"

namespace attnprobe {

struct MobaParams {
  int64_t block = 64;
  int64_t topk = 4;            ///< blocks attended, the query's own included (the samples knob)
  Share share = Share::kHead;  ///< MoBA repeats K per query head
  Aggregate agg = Aggregate::kMean;
};

}  // namespace attnprobe
