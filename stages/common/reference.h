/// \file reference.h
/// \brief The fp64 reference: the truth every stage is compared with.
///
/// Eigen lives only in reference.cpp (host code), never in a .cu file.
#pragma once

#include <cstdint>
#include <vector>

#include "problem.h"

namespace flashstep {

/// O and L computed in double precision.
struct ReferenceResult {
  std::vector<double> O;  ///< [B, H, Nq, d]
  std::vector<double> L;  ///< [B, H, Nq]; -inf for a row that sees no key
};

/// softmax(scale * Q K^T + mask) V and its logsumexp, in double, with the
/// max subtracted. Q [B,H,Nq,d], K and V [B,H,Nk,d], host fp32.
ReferenceResult reference_forward(const Problem& p, const float* Q, const float* K,
                                  const float* V);

/// The same for query rows 0, row_step, 2*row_step, ... of every head only
/// (other rows of O and L are NaN), so large problems can be spot-checked in
/// O(rows * Nk * d) time and O(Nk * d) extra memory.
ReferenceResult reference_forward_rows(const Problem& p, const float* Q, const float* K,
                                       const float* V, std::int64_t row_step);

}  // namespace flashstep
