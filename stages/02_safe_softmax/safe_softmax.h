/// \file safe_softmax.h
/// \brief Stage 02: three-kernel attention with the safe softmax (row max
/// subtracted) and the logsumexp L. Host entry points; CUDA-free.
#pragma once

#include <cstdint>
#include <vector>

#include "common/naive_matmul.h"
#include "common/stage.h"

namespace flashstep::safe_softmax {

/// Threads per softmax block: one block per row of S; 8 warps keep enough
/// loads in flight on a long row, and short rows only idle a few lanes.
inline constexpr int kSoftmaxThreads = 256;

/// Runs kernel 1 (S = scale Q K^T), kernel 2 (m = rowmax(S),
/// P = exp(S - m) / rowsum(exp(S - m)), L = m + log(l)) and kernel 3 (O = P V),
/// in fp32, fp16 or bf16 (p.dtype): S is fp32 in every type, P is in p.dtype.
void forward(const Problem& p, const ForwardTensors& t, Stream stream);

/// Arrays inside a workspace start at multiples of this many bytes, as the
/// workspace itself does (cudaMalloc's alignment).
inline constexpr std::int64_t kArrayAlignBytes = 256;

/// Byte offset of P [B, H, Nq, Nk] (p.dtype) in the forward's workspace: 0 in
/// fp32, where P overwrites S in place; after S, rounded up to
/// kArrayAlignBytes, in fp16 and bf16, where P has an array of its own (a
/// 16-bit row written over an fp32 one would overwrite scores other threads
/// have yet to read).
std::int64_t probabilities_offset(const Problem& p);

/// S [B, H, Nq, Nk] in fp32 and P in p.dtype (over S in fp32, after it otherwise).
std::int64_t workspace_bytes(const Problem& p);

/// Traffic and FLOPs: kernel 1 + softmax (S read three times, P and L
/// written) + kernel 3.
Cost model(const Problem& p);

/// Threads per block of the backward's dS kernel: one block per row of dP, as
/// the softmax; the work is elementwise, so 8 warps only keep a long row's
/// loads in flight.
inline constexpr int kDsThreads = 256;

/// Grid x holds at most 2^31 - 1 blocks; the dS kernel walks longer row
/// counts in strides.
inline constexpr std::int64_t kDsMaxBlocks = 2147483647;

/// Standard attention's backward, in fp32, as autograd runs it, with P read from the
/// forward's workspace (BackwardTensors::saved), never recomputed; only D is
/// FlashAttention's rowsum(dO o O), where autograd sums dP o P over Nk:
///   D  = rowsum(dO o O)                      launch_row_dot
///   dV = P^T dO                              launch_gemm
///   dP = dO V^T         -> workspace         launch_gemm
///   dS = P o (dP - D)   in place over dP     ds_kernel (safe_softmax_backward.cu)
///   dQ = scale dS K                          launch_gemm
///   dK = scale dS^T Q                        launch_gemm
void backward(const Problem& p, const BackwardTensors& t, Stream stream);

/// The four products of the backward as batched GEMMs over the B*H heads,
/// shared by backward() and backward_model() so that the model counts what runs.
struct BackwardGemms {
  Gemm dV;  ///< [Nk, d] = P^T [Nk, Nq] dO [Nq, d]
  Gemm dP;  ///< [Nq, Nk] = dO [Nq, d] V^T [d, Nk]
  Gemm dQ;  ///< [Nq, d] = scale * dS [Nq, Nk] K [Nk, d]
  Gemm dK;  ///< [Nk, d] = scale * dS^T [Nk, Nq] Q [Nq, d]
};
BackwardGemms backward_gemms(const Problem& p);

/// Byte offset of D [B, H, Nq] in the backward workspace: after dP/dS, rounded
/// up to kArrayAlignBytes.
std::int64_t backward_D_offset(const Problem& p);

/// dP (then dS, in place) [B, H, Nq, Nk] and D [B, H, Nq].
std::int64_t backward_workspace_bytes(const Problem& p);

/// Traffic and FLOPs of the backward: row_dot_cost + the four gemm_costs + the
/// dS kernel (P and dP read once, one D per row, dS written once).
Cost backward_model(const Problem& p);

}  // namespace flashstep::safe_softmax

namespace flashstep {
/// Registry entries of this folder.
std::vector<Stage> stages_02_safe_softmax();
}  // namespace flashstep
