#pragma once
// Exact attention of a head view in the precision of a case (--precision, docs/precision.md).
#include "attnprobe/common/rounding.h"
#include "attnprobe/exact/exact_attention.h"
#include "attnprobe/view/head_view.h"

namespace attnprobe {

/// R_ℓ of the precision metrics: exact attention of `view` (its geometry and score shaping) in float32
/// (exact_attention_f32) or at FlashAttention-2's rounding points in bf16/f16 (exact_attention_rounded), n × pv.
/// f64 is refused (exact_attention_f64 returns float64).
MatrixF exact_attention_at(const HeadView& view, Precision precision, ThreadPool* pool);

}  // namespace attnprobe
