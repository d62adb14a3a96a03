/// \file partial_merge.h
/// \brief Merging attention partials: the output over the union of disjoint
/// key sets from the outputs over each set and their logsumexps.
///
/// Split-KV decoding (each thread block attends to a slice of the keys) and
/// ring attention (each GPU attends to the K/V slice passing by) both end with
/// partials (O_s, L_s), one per key set s, where O_s is attention over the
/// keys of s alone (already divided by its own sum l_s) and L_s = m_s + log l_s
/// its logsumexp. The merge is stage 03's two-block identity written with L:
///
///   L   = log(sum_s exp(L_s))            (the logsumexp of the logsumexps)
///   O   = sum_s exp(L_s - L) * O_s       (each partial weighted by its share)
///
/// because exp(L_s) = l_s * exp(m_s) is partial s's unnormalized softmax sum,
/// so exp(L_s - L) is the fraction of the total sum that s holds. A partial
/// that saw no key has L_s = -inf and weight 0, and when no partial saw a key
/// the merge gives the contract's empty row: O = 0, L = -inf.
///
/// The functions are header-only and CUDA-agnostic: the same code runs in the
/// split-KV combine kernel, in ring attention's in-place merge, and in the CPU
/// tests (tests/test_partial_merge.cpp).
#pragma once

#include <cmath>  // INFINITY: a constant nvcc takes in device code, unlike numeric_limits

#include <cstdint>

#include "host_device.h"

namespace flashstep {

/// Non-matmul FLOPs of one lse_merge as the models count them (common/cost.h):
/// max, min, subtract, exp, log1p, add. Counted even where an operand is -inf
/// and the function returns early: the models count the algorithm, not the data.
inline constexpr std::int64_t kLseMergeFlops = 6;
/// Non-matmul FLOPs of one partial_weight: subtract, exp (counted as above).
inline constexpr std::int64_t kPartialWeightFlops = 2;

/// log(exp(L_a) + exp(L_b)), exact for -inf operands (a partial that saw no
/// key) and free of overflow: the larger of the two is factored out, so the
/// exp never sees a positive argument.
FLASHSTEP_HOST_DEVICE inline float lse_merge(float L_a, float L_b) {
  const float m = L_a > L_b ? L_a : L_b;
  const float lo = L_a > L_b ? L_b : L_a;
  if (m == -INFINITY) return m;  // neither saw a key
  return m + std::log1p(std::exp(lo - m));
}

/// The weight of a partial with logsumexp `L_s` in a merge whose logsumexp is
/// `L` (lse_merge over every partial, L_s among them): exp(L_s - L), in
/// [0, 1]. 0 when the partial saw no key, including when none did (L = -inf,
/// where exp(-inf - -inf) would be NaN).
FLASHSTEP_HOST_DEVICE inline float partial_weight(float L_s, float L) {
  if (L_s == -INFINITY) return 0.0f;
  return std::exp(L_s - L);
}

/// Merges partial b into partial a in place, for one query row of d values:
/// O_a <- weight_a * O_a + weight_b * O_b and L_a <- lse_merge(L_a, L_b).
/// The order of merging does not matter beyond rounding (the identity is
/// associative and commutative), which is what lets ring attention merge the
/// K/V slices in the order they arrive.
FLASHSTEP_HOST_DEVICE inline void merge_into(float* O_a,        // [d]
                                             float& L_a,
                                             const float* O_b,  // [d]
                                             float L_b, int d) {
  const float L = lse_merge(L_a, L_b);
  const float w_a = partial_weight(L_a, L);
  const float w_b = partial_weight(L_b, L);
  for (int c = 0; c < d; ++c) O_a[c] = w_a * O_a[c] + w_b * O_b[c];
  L_a = L;
}

}  // namespace flashstep
