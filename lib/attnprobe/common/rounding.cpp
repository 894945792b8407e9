#include "attnprobe/common/rounding.h"

#include <fmt/format.h>
#include <bit>
#include <cmath>

#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"

namespace attnprobe {

const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::kF64:
      return "f64";
    case Precision::kF32:
      return "f32";
    case Precision::kBf16:
      return "bf16";
    case Precision::kF16:
      return "f16";
  }
  return "?";
}

Precision parse_precision(const std::string& name) {
  for (Precision precision : kAllPrecisions)
    if (name == precision_name(precision)) return precision;
  throw UsageError(fmt::format("unknown precision '{}': use f64, f32, bf16 or f16", name));
}

std::vector<Precision> parse_precisions(const std::string& list) {
  std::vector<Precision> precisions;
  for (const std::string& name : split(list, ',')) {
    const Precision precision = parse_precision(trim(name));
    for (Precision seen : precisions)
      if (seen == precision) throw UsageError(fmt::format("--precision lists '{}' twice", name));
    precisions.push_back(precision);
  }
  if (precisions.empty()) throw UsageError("--precision needs at least one of f64, f32, bf16, f16");
  return precisions;
}

namespace {

// bf16 keeps float32's sign, exponent and top 7 mantissa bits: adding 0x7FFF plus the kept part's lowest bit to
// the dropped 16 bits carries into the kept part exactly when the dropped part is above half, or half with an odd
// kept part (round half to even); a carry out of the largest finite value makes the exponent all ones: ±inf.
float round_to_bf16(float x) {
  if (std::isnan(x)) return x;
  uint32_t bits = std::bit_cast<uint32_t>(x);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return std::bit_cast<float>(bits & 0xFFFF0000u);
}

// f16: 10 mantissa bits, normal exponents −14..15, subnormals in steps of 2^-24. The value is a multiple of its
// quantum (2^(e−10) in the binade [2^e, 2^(e+1)), 2^-24 below 2^-14); scaling by powers of two is exact in float,
// so nearbyint (round half to even in the default rounding mode) rounds it exactly. Half-way between 65504 (the
// largest finite) and 2^16 and beyond overflows to ±inf.
float round_to_f16(float x) {
  if (!std::isfinite(x)) return x;
  const float magnitude = std::fabs(x);
  if (magnitude >= 65520.0f) return std::copysign(std::numeric_limits<float>::infinity(), x);
  int exponent = 0;
  std::frexp(magnitude, &exponent);  // magnitude in [2^(exponent−1), 2^exponent)
  const int quantum_exponent = std::max(exponent - 1, -14) - 10;
  const float rounded = std::ldexp(std::nearbyint(std::ldexp(magnitude, -quantum_exponent)), quantum_exponent);
  return std::copysign(rounded, x);
}

}  // namespace

float round_to(float x, Precision precision) {
  switch (precision) {
    case Precision::kBf16:
      return round_to_bf16(x);
    case Precision::kF16:
      return round_to_f16(x);
    case Precision::kF32:
    case Precision::kF64:
      return x;
  }
  return x;
}

void round_in_place(float* x, int64_t count, Precision precision) {
  if (!below_float32(precision)) return;
  for (int64_t i = 0; i < count; ++i) x[i] = round_to(x[i], precision);
}

void round_in_place(MatrixF& x, Precision precision) { round_in_place(x.data(), x.size(), precision); }

}  // namespace attnprobe
