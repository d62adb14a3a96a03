/// \file safe_softmax.h
/// \brief Stage 02: three-kernel attention with the safe softmax (row max
/// subtracted) and the logsumexp L. Host entry points; CUDA-free.
#pragma once

#include <vector>

#include "common/stage.h"

namespace flashstep::safe_softmax {

/// Threads per softmax block: one block per row of S; 8 warps keep enough
/// loads in flight on a long row, and short rows only idle a few lanes.
inline constexpr int kSoftmaxThreads = 256;

/// Runs kernel 1 (S = scale Q K^T), kernel 2 (m = rowmax(S),
/// P = exp(S - m) / rowsum(exp(S - m)) in place over S, L = m + log(l)) and
/// kernel 3 (O = P V).
void forward(const Problem& p, const ForwardTensors& t, Stream stream);

/// S (then P, in place): B * H * Nq * Nk floats.
std::int64_t workspace_bytes(const Problem& p);

/// Traffic and FLOPs: kernel 1 + softmax (S read three times, P and L
/// written) + kernel 3.
Cost model(const Problem& p);

}  // namespace flashstep::safe_softmax

namespace flashstep {
/// Registry entries of this folder.
std::vector<Stage> stages_02_safe_softmax();
}  // namespace flashstep
