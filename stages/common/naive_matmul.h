/// \file naive_matmul.h
/// \brief Kernels 1 and 3 of standard (three-kernel) attention, shared by stages
/// 01 and 02: S = scale * Q K^T written to HBM, and O = P V read from HBM; and
/// the batched GEMM with transposes that standard attention's backward runs
/// (stage 02: dV = P^T dO, dP = dO V^T, dQ = scale dS K, dK = scale dS^T Q).
///
/// CUDA-free header; the kernels are in naive_matmul.cu.
#pragma once

#include "cost.h"
#include "problem.h"
#include "stage.h"

namespace flashstep {

/// Output tile edge of every kernel here: a 32 x 32 thread block computes a 32 x 32
/// tile, one element per thread, staging 32 x 32 input tiles in shared memory.
/// 32 matches the warp width so that a warp loads one 128-byte row segment.
inline constexpr int kNaiveTile = 32;

/// Kernel 1: S[b,h,i,j] = scale * Q[b,h,i,:] . K[b,h,j,:], or -inf where the
/// causal mask hides key j from query i. Q and K are in p.dtype; S is
/// [B, H, Nq, Nk] fp32 in device memory.
void launch_scores(const Problem& p, const void* Q, const void* K, float* S, Stream stream);

/// Kernel 3: O[b,h,i,:] = sum_j P[b,h,i,j] V[b,h,j,:], accumulated in fp32.
/// P [B, H, Nq, Nk], V and O are in p.dtype.
void launch_pv(const Problem& p, const void* P, const void* V, void* O, Stream stream);

/// Model of kernel 1: Q re-read once per 32-key tile, K once per 32-query
/// tile (p.dtype's bytes), S written once (fp32); one scale multiply per
/// score. Shared-memory tiles hold fp32.
Cost scores_cost(const Problem& p);

/// Model of kernel 3: P re-read once per 32-column tile of d, V once per
/// 32-query tile, O written once (all p.dtype's bytes); fp32 tiles.
Cost pv_cost(const Problem& p);

/// One batched GEMM: for each of `batch` heads h, C_h = alpha * op(A_h) op(B_h),
/// with op(X) = X or X^T. Every operand is row-major with its heads packed one
/// after another: A_h = A + h*M*K, B_h = B + h*K*N, C_h = C + h*M*N.
struct Gemm {
  std::int64_t batch = 1;    ///< heads, B * H
  std::int64_t M = 1;        ///< rows of C and of op(A)
  std::int64_t N = 1;        ///< columns of C and of op(B)
  std::int64_t K = 1;        ///< the dimension summed over
  bool transpose_A = false;  ///< A_h is stored [K, M] and op(A) = A^T; else stored [M, K]
  bool transpose_B = false;  ///< B_h is stored [N, K] and op(B) = B^T; else stored [K, N]
  float alpha = 1.0f;        ///< multiplies every element of C; 1 skips the multiply
};

/// C [batch, M, N] = alpha * op(A) op(B), with A and B stored as `g` says.
/// Textbook 32 x 32 shared-memory tiling, one output element per thread, like
/// kernels 1 and 3. Throws flashstep::Error on a size < 1 or a launch error.
void launch_gemm(const Gemm& g, const float* A, const float* B, float* C, Stream stream);

/// Its model: op(A) read once per 32-column tile of C, op(B) once per 32-row
/// tile, C written once; every loaded element staged once in shared memory and
/// two shared-memory reads per multiply-add; M*N multiplies by alpha unless
/// alpha is 1.
Cost gemm_cost(const Gemm& g);

}  // namespace flashstep
