/// \file naive_matmul.h
/// \brief Kernels 1 and 3 of standard (three-kernel) attention, shared by stages
/// 01 and 02: S = scale * Q K^T written to HBM, and O = P V read from HBM.
///
/// CUDA-free header; the kernels are in naive_matmul.cu.
#pragma once

#include "cost.h"
#include "problem.h"
#include "stage.h"

namespace flashstep {

/// Output tile edge of both kernels: a 32 x 32 thread block computes a 32 x 32
/// tile, one element per thread, staging 32 x 32 input tiles in shared memory.
/// 32 matches the warp width so that a warp loads one 128-byte row segment.
inline constexpr int kNaiveTile = 32;

/// Kernel 1: S[b,h,i,j] = scale * Q[b,h,i,:] . K[b,h,j,:], or -inf where the
/// causal mask hides key j from query i. S is [B, H, Nq, Nk] in device memory.
void launch_scores(const Problem& p, const float* Q, const float* K, float* S, Stream stream);

/// Kernel 3: O[b,h,i,:] = sum_j P[b,h,i,j] V[b,h,j,:]. P is [B, H, Nq, Nk].
void launch_pv(const Problem& p, const float* P, const float* V, float* O, Stream stream);

/// Model of kernel 1: Q re-read once per 32-key tile, K once per 32-query
/// tile, S written once; one scale multiply per score.
Cost scores_cost(const Problem& p);

/// Model of kernel 3: P re-read once per 32-column tile of d, V once per
/// 32-query tile, O written once.
Cost pv_cost(const Problem& p);

}  // namespace flashstep
