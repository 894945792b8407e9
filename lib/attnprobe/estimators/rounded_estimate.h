#pragma once
// An estimate in a precision below float32 (--precision bf16|f16, docs/precision.md): the sweep's runner and
// Python's estimate(precision=...) make it the same way.
#include "attnprobe/estimators/estimator.h"

namespace attnprobe {

/// `estimator`'s estimate of `rounded` (the view with its inputs rounded to `precision`: rounded_view) with
/// ctx.precision set, so that it rounds the intermediates it declares (Capabilities::rounding), and its output
/// rounded to the precision. The draws are ctx.key's, whatever the precision. For f32 it is estimate() itself.
inline void estimate_at_precision(const Estimator& estimator, const HeadView& rounded, EstimateContext ctx,
                                  Precision precision, MatrixF& out) {
  ctx.precision = precision;
  estimator.estimate(rounded, ctx, out);
  round_in_place(out, precision);
}

}  // namespace attnprobe
