/// \file rounding.h
/// \brief fp32 to fp16 and bf16 and back, on the host, bit for bit as the GPU
/// does it: rounding to nearest with ties to even (the device's
/// __float2half_rn and __float2bfloat16_rn), and exact widening. The runner
/// rounds the host's fp32 inputs this way on their way to a 16-bit stage, and
/// the tests and the CLI round the inputs the fp64 reference is computed from.
///
/// CUDA-free: a test checks these against CUDA's own host conversions.
#pragma once

#include <cstdint>

#include "problem.h"

namespace flashstep {

/// The 16 bits of x rounded to `t` (fp16 or bf16), to nearest with ties to
/// even. Beyond the type's range x becomes +-inf (fp16 above 65504 and a half
/// ulp), small values become subnormals or +-0, and any NaN becomes the
/// canonical NaN 0x7FFF, as the GPU's conversions give. Throws
/// flashstep::Error for fp32, which has no 16-bit form.
std::uint16_t to_bits(DType t, float x);

/// The fp32 value of `t`'s 16 bits (fp16 or bf16): exact, since fp32 holds
/// every fp16 and bf16 value. Throws flashstep::Error for fp32.
float from_bits(DType t, std::uint16_t bits);

/// x rounded to the nearest value of type t (ties to even), as fp32; x
/// itself for fp32.
float round_to_dtype(DType t, float x);

/// Every element of x [n] rounded to type t in place (nothing for fp32): the
/// inputs a 16-bit stage actually sees.
void round_to_dtype(DType t, float* x, std::int64_t n);

}  // namespace flashstep
