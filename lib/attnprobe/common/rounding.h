#pragma once
// The precisions a case can be computed in (`--precision`, docs/precision.md) and rounding to them.
// bf16 and f16 values are carried in float32 storage: a float whose value is representable in the precision.
// Rounding is IEEE round-to-nearest-even; f16 overflows to ±inf (values ≥ 65520 in magnitude), keeps its
// subnormals (down to 2^-24) and flushes nothing; NaN stays NaN. bf16 has float32's exponent range, so only
// float32's own overflow reaches ±inf.
#include <cstdint>
#include <string>
#include <vector>

#include "attnprobe/common/matrix.h"

namespace attnprobe {

enum class Precision { kF64, kF32, kBf16, kF16 };
inline constexpr Precision kAllPrecisions[] = {Precision::kF64, Precision::kF32, Precision::kBf16, Precision::kF16};

/// "f64", "f32", "bf16" or "f16": the CLI's and the CSV's names.
const char* precision_name(Precision precision);
/// A name above; throws UsageError naming the valid ones otherwise.
Precision parse_precision(const std::string& name);
/// A comma-separated list of names ("f32,bf16"), each once, in the order given; throws UsageError otherwise.
std::vector<Precision> parse_precisions(const std::string& list);

/// Whether values are stored below float32 (bf16, f16): the precisions whose cases have rounding metrics.
inline bool below_float32(Precision precision) { return precision == Precision::kBf16 || precision == Precision::kF16; }

/// x rounded to the precision (f32 and f64: x itself, a float already being float32).
float round_to(float x, Precision precision);
/// Every element rounded in place.
void round_in_place(MatrixF& x, Precision precision);
void round_in_place(float* x, int64_t count, Precision precision);
/// A float64 value rounded to float32, then to the precision: what storing a wider accumulation does.
inline float store_as(double x, Precision precision) { return round_to(static_cast<float>(x), precision); }
/// Below float32, every element of a float64 tensor replaced by store_as's value: a tensor an estimator computes wider
/// and a kernel would store in the precision. At f32 and f64 it is left as it is (the float32 paths keep it wider).
template <class Tensor>
void store_below_float32(Tensor& x, Precision precision) {
  if (below_float32(precision))
    x = x.unaryExpr([precision](double value) { return static_cast<double>(store_as(value, precision)); });
}

}  // namespace attnprobe
