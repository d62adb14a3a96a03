/// \file row_dot.h
/// \brief The backward's preprocessing kernel, shared by every backward pass:
/// D = rowsum(dO o O), one number per query row (FlashAttention-2, Algorithm 2,
/// line 4). CUDA-free header; the kernel is in row_dot.cu.
#pragma once

#include "cost.h"
#include "problem.h"
#include "stage.h"

namespace flashstep {

/// Rows per thread block of the D kernel: one warp per row, 8 warps a block.
inline constexpr int kRowDotRowsPerBlock = 8;
/// Grid x holds at most 2^31 - 1 blocks; beyond that blocks walk rows in strides.
inline constexpr std::int64_t kRowDotMaxBlocks = 2147483647;

/// D [B, H, Nq] = rowsum(dO o O) over d, from dO and O [B, H, Nq, d].
/// dS = P o (dP - D) needs D_i = sum_j P_ij dP_ij, which equals dO_i . O_i:
/// a d-long dot product per row instead of an Nk-long one.
void launch_row_dot(const Problem& p, const float* dO, const float* O, float* D, Stream stream);

/// Its model: O and dO read once, D written once; a multiply and an add per
/// element (non-matmul); B*H*Nq / kRowDotRowsPerBlock thread blocks.
Cost row_dot_cost(const Problem& p);

}  // namespace flashstep
