#pragma once
// A head view with its inputs rounded to a precision below float32 (--precision bf16|f16, docs/precision.md):
// what an estimator computing in that precision reads.
#include "attnprobe/common/rounding.h"
#include "attnprobe/view/head_view.h"

namespace attnprobe {

/// `view` with q, k, v (float32 and float64 copies alike), the prompt's and its group's query rows (and the group's
/// keys of other kv heads) rounded to `precision`; geometry and score shaping unchanged (a model's bias stays as
/// stored: its rounding is the logit's, which an estimator declares). f32 and f64 return a copy of the view.
HeadView rounded_view(const HeadView& view, Precision precision);

}  // namespace attnprobe
