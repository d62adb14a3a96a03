// The element types: names, sizes, and rounding fp32 to fp16 and bf16 on the
// host exactly as the GPU does (checked against CUDA's own host conversions).
#include <doctest/doctest.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "common/error.h"
#include "common/problem.h"
#include "common/rounding.h"

using flashstep::DType;
using flashstep::from_bits;
using flashstep::round_to_dtype;
using flashstep::to_bits;

namespace {

float float_of(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// CUDA's host-side conversions: what __float2half_rn / __float2bfloat16_rn give.
std::uint16_t cuda_bits(DType t, float x) {
  if (t == DType::kFp16) return static_cast<__half_raw>(__float2half_rn(x)).x;
  return static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(x)).x;
}

float cuda_value(DType t, std::uint16_t bits) {
  if (t == DType::kFp16) {
    __half_raw r;
    r.x = bits;
    return __half2float(__half(r));
  }
  __nv_bfloat16_raw r;
  r.x = bits;
  return __bfloat162float(__nv_bfloat16(r));
}

}  // namespace

TEST_CASE("dtype: names, parsing and element sizes") {
  CHECK(flashstep::dtype_name(DType::kFp32) == "fp32");
  CHECK(flashstep::dtype_name(DType::kFp16) == "fp16");
  CHECK(flashstep::dtype_name(DType::kBf16) == "bf16");
  for (DType t : {DType::kFp32, DType::kFp16, DType::kBf16}) {
    CHECK(flashstep::parse_dtype(flashstep::dtype_name(t)) == t);
  }
  CHECK_THROWS_WITH_AS(flashstep::parse_dtype("float16"),
                       "unknown element type 'float16' (known: fp32, fp16, bf16)", flashstep::Error);
  CHECK_THROWS_AS(flashstep::parse_dtype(""), flashstep::Error);
  CHECK(flashstep::dtype_bytes(DType::kFp32) == 4);
  CHECK(flashstep::dtype_bytes(DType::kFp16) == 2);
  CHECK(flashstep::dtype_bytes(DType::kBf16) == 2);
  flashstep::Problem p;
  CHECK(p.dtype == DType::kFp32);
  CHECK(p.elem_bytes() == 4);
  CHECK(p.describe().find("fp32") == std::string::npos);  // fp32 goes unsaid
  p.dtype = DType::kBf16;
  CHECK(p.elem_bytes() == 2);
  CHECK(p.describe().find(" bf16") != std::string::npos);
}

TEST_CASE("rounding to bf16: ties to even, overflow to inf, NaN stays NaN") {
  const DType t = DType::kBf16;
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: the tie goes to even (1).
  CHECK(round_to_dtype(t, 1.0f + std::ldexp(1.0f, -8)) == 1.0f);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  CHECK(round_to_dtype(t, 1.0f + 3 * std::ldexp(1.0f, -8)) == 1.0f + std::ldexp(1.0f, -6));
  // Just above the tie rounds up.
  CHECK(round_to_dtype(t, std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)) ==
        1.0f + std::ldexp(1.0f, -7));
  CHECK(to_bits(t, 1.0f) == 0x3F80);
  CHECK(to_bits(t, -2.0f) == 0xC000);
  // The largest fp32 rounds past bf16's largest finite value to inf.
  CHECK(std::isinf(round_to_dtype(t, std::numeric_limits<float>::max())));
  CHECK(to_bits(t, std::numeric_limits<float>::infinity()) == 0x7F80);
  CHECK(to_bits(t, std::nanf("")) == 0x7FFF);
  CHECK(to_bits(t, -std::nanf("")) == 0x7FFF);
  CHECK(std::isnan(from_bits(t, 0xFFFF)));  // the runner's poison: NaN in every type
  CHECK(round_to_dtype(t, -0.0f) == 0.0f);
  CHECK(std::signbit(round_to_dtype(t, -0.0f)));
}

TEST_CASE("rounding to fp16: ties to even, overflow to inf, subnormals, NaN") {
  const DType t = DType::kFp16;
  CHECK(to_bits(t, 1.0f) == 0x3C00);
  CHECK(to_bits(t, 65504.0f) == 0x7BFF);  // the largest finite fp16
  // 65520 is halfway from 65504 to 65536 (inf): the tie goes to even, inf.
  CHECK(to_bits(t, 65520.0f) == 0x7C00);
  CHECK(to_bits(t, std::nextafter(65520.0f, 0.0f)) == 0x7BFF);
  CHECK(to_bits(t, -1e6f) == 0xFC00);
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: even is 1.
  CHECK(round_to_dtype(t, 1.0f + std::ldexp(1.0f, -11)) == 1.0f);
  // Subnormals: 2^-24 is the smallest; 2^-25 is the tie between it and 0 (even: 0);
  // 3 * 2^-25 is the tie between 2^-24 (odd) and 2^-23 (even).
  CHECK(to_bits(t, std::ldexp(1.0f, -24)) == 0x0001);
  CHECK(to_bits(t, std::ldexp(1.0f, -25)) == 0x0000);
  CHECK(to_bits(t, std::nextafter(std::ldexp(1.0f, -25), 1.0f)) == 0x0001);
  CHECK(to_bits(t, 3 * std::ldexp(1.0f, -25)) == 0x0002);
  CHECK(to_bits(t, -std::ldexp(1.0f, -24)) == 0x8001);
  CHECK(from_bits(t, 0x0001) == std::ldexp(1.0f, -24));
  CHECK(from_bits(t, 0x03FF) == 1023 * std::ldexp(1.0f, -24));  // the largest subnormal
  // The largest subnormal plus half a unit rounds up into the smallest normal.
  CHECK(to_bits(t, 1023.5f * std::ldexp(1.0f, -24)) == 0x0400);
  CHECK(to_bits(t, std::nanf("")) == 0x7FFF);
  CHECK(std::isnan(from_bits(t, 0xFFFF)));
  CHECK(std::isinf(from_bits(t, 0x7C00)));
}

TEST_CASE("rounding matches CUDA's host conversions bit for bit, both ways") {
  // One fp32 bit pattern in every 0x1001 (about a million, every exponent and
  // sign, NaNs and infinities, low bits varying so ties and near-ties occur).
  for (DType t : {DType::kFp16, DType::kBf16}) {
    CAPTURE(flashstep::dtype_name(t));
    std::int64_t checked = 0, wrong = 0;
    for (std::uint64_t u = 0; u <= 0xFFFFFFFFull; u += 0x1001) {
      const float x = float_of(static_cast<std::uint32_t>(u));
      const std::uint16_t want = cuda_bits(t, x);
      const std::uint16_t got = to_bits(t, x);
      wrong += got != want ? 1 : 0;
      ++checked;
    }
    CHECK(wrong == 0);
    CHECK(checked > 1000000);
    // Widening: every one of the 65536 bit patterns.
    wrong = 0;
    for (std::uint32_t h = 0; h <= 0xFFFF; ++h) {
      const float got = from_bits(t, static_cast<std::uint16_t>(h));
      const float want = cuda_value(t, static_cast<std::uint16_t>(h));
      wrong += (std::isnan(want) ? !std::isnan(got) : bits_of(got) != bits_of(want)) ? 1 : 0;
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("rounding an array in place: fp32 untouched, 16-bit types idempotent") {
  std::vector<float> x = {0.1f, 1.0f / 3.0f, -2.7182817f, 1e-7f, 7e4f};
  const std::vector<float> original = x;
  round_to_dtype(DType::kFp32, x.data(), static_cast<std::int64_t>(x.size()));
  CHECK(x == original);
  for (DType t : {DType::kFp16, DType::kBf16}) {
    std::vector<float> y = original;
    round_to_dtype(t, y.data(), static_cast<std::int64_t>(y.size()));
    for (size_t k = 0; k < y.size(); ++k) CHECK(y[k] == round_to_dtype(t, original[k]));
    std::vector<float> again = y;
    round_to_dtype(t, again.data(), static_cast<std::int64_t>(again.size()));
    CHECK(again == y);
  }
  CHECK(std::isinf(round_to_dtype(DType::kFp16, 7e4f)));
  CHECK_THROWS_AS(to_bits(DType::kFp32, 1.0f), flashstep::Error);
}
