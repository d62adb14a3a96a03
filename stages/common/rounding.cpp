// fp32 <-> fp16 / bf16 on the host by hand, on the bits (rounding.h).
//
//   fp32  sign | 8 exponent bits (bias 127) | 23 fraction bits
//   bf16  sign | 8 exponent bits (bias 127) |  7 fraction bits   = fp32's upper half
//   fp16  sign | 5 exponent bits (bias 15)  | 10 fraction bits
//
// Rounding to nearest, ties to even, drops k low bits of a magnitude: add
// half of the dropped range, less one when the kept lowest bit is 0, and
// shift. A carry out of the fraction moves into the exponent, which is right:
// rounding up the largest fraction of one binade gives the next power of two
// (and, past the largest finite value, infinity).
#include "rounding.h"

#include <cmath>
#include <cstring>

#include "error.h"

namespace flashstep {

namespace {

constexpr std::uint32_t kSignBit = 0x80000000u;
constexpr std::uint32_t kAbsMask = 0x7FFFFFFFu;
constexpr std::uint32_t kInfBits = 0x7F800000u;  // fp32 +inf; larger magnitudes are NaN
// The NaN the GPU's conversions return for any NaN input, in both 16-bit types.
constexpr std::uint16_t kCanonicalNaN16 = 0x7FFF;
constexpr int kHalfShift = 16;  // fp32's sign moves from bit 31 to bit 15

// fp16 facts.
constexpr std::uint16_t kFp16Inf = 0x7C00;
constexpr int kFp16FractionBits = 10;
constexpr int kFp32FractionBits = 23;
constexpr int kFractionShift = kFp32FractionBits - kFp16FractionBits;  // 13 bits dropped
constexpr std::uint32_t kFp32ImplicitOne = 1u << kFp32FractionBits;
constexpr std::uint32_t kFp32FractionMask = kFp32ImplicitOne - 1;
// Exponent bias difference 127 - 15 = 112, in fp32's exponent field.
constexpr std::uint32_t kRebias = 112u << kFp32FractionBits;
// |x| at or above 65520 (halfway from fp16's largest, 65504, to 65536; the
// tie goes to the even neighbour, which is the infinity) rounds to inf.
constexpr std::uint32_t kFp16Overflow = 0x477FF000u;
// |x| below 2^-14 is an fp16 subnormal (or zero).
constexpr std::uint32_t kFp16MinNormal = 0x38800000u;
// |x| at or below 2^-25, half the smallest subnormal 2^-24, rounds to +-0 (the
// tie at exactly 2^-25 goes to the even neighbour, 0).
constexpr std::uint32_t kFp16HalfMinSubnormal = 0x33000000u;
// An fp16 subnormal counts units of 2^-24; a normal fp32 with biased exponent
// e has value fraction_with_one * 2^(e - 150), i.e. that many units shifted
// right by 126 - e bits.
constexpr std::uint32_t kSubnormalShiftBase = 126;
constexpr int kFp16SubnormalExponent = -24;
constexpr int kFp16ExponentMask = 0x1F;

std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

float float_of(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// `value` with its low `dropped` bits rounded away (to nearest, ties to even).
std::uint32_t round_shift(std::uint32_t value, int dropped) {
  const std::uint32_t kept_lsb = (value >> dropped) & 1u;
  const std::uint32_t half_less_one = (1u << (dropped - 1)) - 1u;
  return (value + half_less_one + kept_lsb) >> dropped;
}

std::uint16_t bf16_bits(float x) {
  const std::uint32_t u = bits_of(x);
  if ((u & kAbsMask) > kInfBits) return kCanonicalNaN16;
  return static_cast<std::uint16_t>(round_shift(u, kHalfShift));
}

std::uint16_t fp16_bits(float x) {
  const std::uint32_t u = bits_of(x);
  const auto sign = static_cast<std::uint16_t>((u & kSignBit) >> kHalfShift);
  const std::uint32_t a = u & kAbsMask;
  if (a > kInfBits) return kCanonicalNaN16;
  if (a >= kFp16Overflow) return sign | kFp16Inf;
  if (a >= kFp16MinNormal) {  // normal: rebias the exponent, round the fraction
    return sign | static_cast<std::uint16_t>(round_shift(a - kRebias, kFractionShift));
  }
  if (a <= kFp16HalfMinSubnormal) return sign;
  // Subnormal: a whole number of 2^-24 units, rounded. (Rounding up from the
  // largest subnormal gives 0x0400, the smallest normal: also right.)
  const std::uint32_t units = (a & kFp32FractionMask) | kFp32ImplicitOne;
  const int shift = static_cast<int>(kSubnormalShiftBase - (a >> kFp32FractionBits));
  return sign | static_cast<std::uint16_t>(round_shift(units, shift));
}

float bf16_value(std::uint16_t h) { return float_of(static_cast<std::uint32_t>(h) << kHalfShift); }

float fp16_value(std::uint16_t h) {
  const std::uint32_t sign = (static_cast<std::uint32_t>(h) << kHalfShift) & kSignBit;
  const std::uint32_t exponent = (h >> kFp16FractionBits) & kFp16ExponentMask;
  const std::uint32_t fraction = h & ((1u << kFp16FractionBits) - 1);
  if (exponent == kFp16ExponentMask) {  // inf, or NaN with its payload kept
    return float_of(sign | kInfBits | (fraction << kFractionShift));
  }
  if (exponent != 0) {
    const std::uint32_t rebiased = (exponent << kFp32FractionBits) + kRebias;
    return float_of(sign | rebiased | (fraction << kFractionShift));
  }
  const float magnitude = std::ldexp(static_cast<float>(fraction), kFp16SubnormalExponent);
  return sign ? -magnitude : magnitude;
}

}  // namespace

std::uint16_t to_bits(DType t, float x) {
  switch (t) {
    case DType::kFp16: return fp16_bits(x);
    case DType::kBf16: return bf16_bits(x);
    case DType::kFp32: break;
  }
  throw Error("to_bits: fp32 has no 16-bit form");
}

float from_bits(DType t, std::uint16_t bits) {
  switch (t) {
    case DType::kFp16: return fp16_value(bits);
    case DType::kBf16: return bf16_value(bits);
    case DType::kFp32: break;
  }
  throw Error("from_bits: fp32 has no 16-bit form");
}

float round_to_dtype(DType t, float x) {
  return t == DType::kFp32 ? x : from_bits(t, to_bits(t, x));
}

void round_to_dtype(DType t, float* x, std::int64_t n) {
  if (t == DType::kFp32) return;
  for (std::int64_t k = 0; k < n; ++k) x[k] = from_bits(t, to_bits(t, x[k]));
}

}  // namespace flashstep
