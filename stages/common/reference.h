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
/// max subtracted. Q [B,H,Nq,d], K and V [B,H_kv,Nk,d] (query head h reads
/// K/V head h / (H / H_kv)), host fp32.
ReferenceResult reference_forward(const Problem& p, const float* Q, const float* K,
                                  const float* V);

/// The same from double inputs (for finite differences, which need more than
/// fp32's digits in the inputs themselves).
ReferenceResult reference_forward(const Problem& p, const double* Q, const double* K,
                                  const double* V);

/// dQ, dK and dV of the loss sum(O o dO), in double.
struct ReferenceGradients {
  std::vector<double> dQ;  ///< [B, H, Nq, d]
  std::vector<double> dK;  ///< [B, H_kv, Nk, d]
  std::vector<double> dV;  ///< [B, H_kv, Nk, d]
};

/// The backward of attention, in double, by the textbook formulas with P
/// recomputed: dV = P^T dO, dP = dO V^T, D = rowsum(dO o O),
/// dS = P o (dP - D), dQ = scale dS K, dK = scale dS^T Q. A row that sees no
/// key has P = 0 and contributes nothing. dO [B,H,Nq,d], host fp32. With
/// H_kv < H, dK and dV [B,H_kv,Nk,d] sum the gradients of each group's query heads.
ReferenceGradients reference_backward(const Problem& p, const float* Q, const float* K,
                                      const float* V, const float* dO);

/// The same from double inputs.
ReferenceGradients reference_backward(const Problem& p, const double* Q, const double* K,
                                      const double* V, const double* dO);

/// The same for query rows 0, row_step, 2*row_step, ... of every head only
/// (other rows of O and L are NaN), so large problems can be spot-checked in
/// O(rows * Nk * d) time and O(Nk * d) extra memory.
ReferenceResult reference_forward_rows(const Problem& p, const float* Q, const float* K,
                                       const float* V, std::int64_t row_step);

/// O [B,H,Nq,d] of attention done naively in p.dtype (fp16 or bf16) on the
/// host: standard attention in half precision, whose error sets the bound of
/// the low-precision check (check.h). From Q, K, V as given (already rounded
/// to p.dtype), S = scale Q K^T and its softmax in fp32, P rounded to p.dtype,
/// O = P V summed in fp32 and rounded to p.dtype. Stage 02 runs exactly this
/// on the GPU. Rows 0, row_step, 2*row_step, ... of every head; the other rows
/// are NaN, as in reference_forward_rows.
std::vector<double> naive_low_precision_rows(const Problem& p, const float* Q, const float* K,
                                             const float* V, std::int64_t row_step);

/// dQ, dK and dV of attention done naively in p.dtype (fp16 or bf16) on the
/// host: the standard backward in half precision, whose error sets the bound
/// of the low-precision gradient check (check.h). From Q, K, V and dO as given
/// (already rounded to p.dtype) and O, the forward's output that a backward
/// reads (FlashAttention's takes O as an input): the stage's own O when given
/// (as its forward wrote it, in p.dtype), else naive_low_precision_rows
/// (rounded to p.dtype, as a forward in that type hands it over). Per row, S
/// and its softmax P in fp32; D = rowsum(dO o O) in fp32 from that rounded O, as a
/// backward must compute it; dP = dO V^T in fp32; dS = P o (dP - D) and P
/// rounded to p.dtype (the operands of the next products); dV = P^T dO,
/// dQ = scale dS K and dK = scale dS^T Q summed in fp32 and rounded to
/// p.dtype. A row that sees no key contributes nothing. With H_kv < H, dK and
/// dV [B,H_kv,Nk,d] sum the group's query heads in fp32 before the rounding.
ReferenceGradients naive_low_precision_backward(const Problem& p, const float* Q, const float* K,
                                                const float* V, const float* dO,
                                                const float* O = nullptr);

}  // namespace flashstep
