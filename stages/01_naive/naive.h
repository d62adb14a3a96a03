/// \file naive.h
/// \brief Stage 01: naive three-kernel attention (S and P written to HBM, softmax
/// without the max subtracted). Host entry points; CUDA-free.
#pragma once

#include <vector>

#include "common/stage.h"

namespace flashstep::naive {

/// Threads per softmax block: one block per row of S; 8 warps keep enough
/// loads in flight on a long row, and short rows only idle a few lanes.
inline constexpr int kSoftmaxThreads = 256;

/// Runs kernel 1 (S = scale Q K^T), kernel 2 (P = exp(S) / rowsum(exp(S)),
/// in place over S) and kernel 3 (O = P V). L is not written.
void forward(const Problem& p, const ForwardTensors& t, Stream stream);

/// S (then P, in place): B * H * Nq * Nk floats.
std::int64_t workspace_bytes(const Problem& p);

/// Traffic and FLOPs: kernel 1 + softmax (S read twice, P written once) + kernel 3.
Cost model(const Problem& p);

}  // namespace flashstep::naive

namespace flashstep {
/// Registry entries of this folder.
std::vector<Stage> stages_01_naive();
}  // namespace flashstep
