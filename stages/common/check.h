/// \file check.h
/// \brief Inputs from a seed, and comparison against the fp64 reference.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "problem.h"

namespace flashstep {

/// Q, K and V on the host.
struct Inputs {
  std::vector<float> Q;  ///< [B, H, Nq, d]
  std::vector<float> K;  ///< [B, H, Nk, d]
  std::vector<float> V;  ///< [B, H, Nk, d]
};

/// Mean of the random inputs. Not zero: zero-mean V makes O tiny and relative
/// errors meaningless; shifted Q and K make the logits' row max matter.
inline constexpr float kInputMean = 0.5f;

/// Q, K, V drawn from Normal(kInputMean, 1) with a fixed seed (same seed, same data).
Inputs random_inputs(const Problem& p, std::uint64_t seed);

/// The backward's input dO [B, H, Nq, d]: the gradient of the loss in O, drawn
/// from Normal(kInputMean, 1) like the inputs, from its own seed. A nonzero
/// mean makes dP and D = rowsum(dO o O) large and close, so dS = P o (dP - D)
/// carries the cancellation a real backward must survive.
std::vector<float> random_output_grad(const Problem& p, std::uint64_t seed);

/// Elementwise bound |got - want| <= atol + rtol * |want|.
struct Tolerance {
  double atol;  ///< absolute part: matters where the reference is near 0
  double rtol;  ///< relative part
};

/// The bound every fp32 stage meets against the fp64 reference. fp32 sums of
/// up to ~1e3 terms of size ~1 carry relative rounding near 1e-6; 1e-4 leaves
/// two orders of margin while still catching any wrong rescale or mask
/// (those give errors of order 1e-2 and up). atol covers elements of O near 0.
inline constexpr Tolerance kFp32Tolerance{1e-5, 1e-4};

/// The bound every fp32 gradient meets against the fp64 reference: the
/// forward's relative part, ten times its absolute part. The gradients inherit
/// the forward's fp32 errors in O and L (D = rowsum(dO o O) sums d of them),
/// and dS = P o (dP - D) subtracts two numbers of size near |dO| |V| sqrt(d)
/// that agree in their leading digits, so elements of dQ and dK near zero
/// carry absolute errors a little above the forward's 1e-5. A wrong mask,
/// scale or recomputed P still errs by 1e-2 and more.
inline constexpr Tolerance kFp32GradTolerance{1e-4, 1e-4};

/// Outcome of comparing one output array with the reference.
struct Comparison {
  std::int64_t checked = 0;      ///< elements compared (NaN in the reference: skipped)
  std::int64_t mismatches = 0;   ///< elements outside the bound (NaN got: always)
  double max_abs_error = 0.0;    ///< over finite pairs
  double max_rel_error = 0.0;    ///< |got - want| / |want| over |want| > atol
  std::int64_t worst_index = -1; ///< element with the largest error / bound ratio
  std::string first_mismatches;  ///< up to a few "index: got X, want Y" lines

  bool ok() const { return mismatches == 0; }
  /// One line: "max abs 1.2e-07, max rel 3.4e-06, 0 of 4096 outside" plus
  /// the first mismatches when there are any.
  std::string summary() const;
};

/// Compares got (fp32) with want (fp64). Infinite reference values must be
/// matched exactly; a NaN reference element marks "not computed" and is skipped.
Comparison compare(const float* got, const std::vector<double>& want, Tolerance tol);

}  // namespace flashstep
