/// \file sequence_parallel.h
/// \brief Stage 05: FlashAttention-2 forward with sequence parallelism (Dao
/// 2023, §3.2 "Parallelism"). Stage 04's algorithm, unchanged, but each thread
/// block handles one Q block of one head: the outer loop over Q blocks
/// (Algorithm 1, line 3) becomes the grid. Host entry points; CUDA-free.
#pragma once

#include <cstdint>
#include <vector>

#include "common/fa2_model.h"
#include "common/fa2_tiles.h"
#include "common/stage.h"
#include "common/tile_mask.h"

namespace flashstep::sequence_parallel {

/// Grid y holds at most 65535 blocks; beyond that one block takes the same Q
/// block of several heads. Grid x (Q blocks, at most ceil((2^31 - 1) / Br))
/// always fits its 2^31 - 1 limit.
inline constexpr std::int64_t kMaxGridY = 65535;

/// One thread block per (Q block, batch, head).
void forward(const Problem& p, const ForwardTensors& t, Stream stream);
/// The same in a causal mode (common/tile_mask.h): kFast is the forward
/// above; the other two are for the benchmark's ablation.
void forward(const Problem& p, const ForwardTensors& t, Stream stream, CausalMode mode);

/// Stage 05 needs no scratch memory: 0.
std::int64_t workspace_bytes(const Problem& p);

/// Stage 04's closed form (fa2::model in common/fa2_model.h): the same traffic
/// and FLOPs, over Tr * min(B * H, kMaxGridY) thread blocks (Tr * B * H
/// whenever B * H <= 65535).
Cost model(const Problem& p);

/// The backward pass, FlashAttention-2's Algorithm 2 (sequence_parallel_backward.cu):
/// D = rowsum(dO o O), then one thread block per (K/V block, batch, head)
/// keeping dK_j and dV_j on chip while the Q blocks stream past, S and P
/// recomputed from L, dQ accumulated in HBM with fp32 atomics.
void backward(const Problem& p, const BackwardTensors& t, Stream stream);

/// D [B, H, Nq]: B * H * Nq floats.
std::int64_t backward_workspace_bytes(const Problem& p);

/// The backward's traffic and FLOPs in closed form (formulae in README.md):
/// per K/V block j, Kj and Vj read once and dK_j, dV_j written once; per
/// visited (i, j), Qi, dOi, Li, Di read and dQ_i read and written by the
/// atomics; plus the D kernel and zeroing dQ.
Cost backward_model(const Problem& p);

/// Algorithm 2 on the host with the kernel's loops and tiles, counting every
/// element moved, every shared-memory access and every FLOP
/// (sequence_parallel_backward_mirror.cpp).
Cost backward_mirror(const Problem& p, const HostBackwardTensors& t);

}  // namespace flashstep::sequence_parallel

namespace flashstep {
/// Registry entries of this folder.
std::vector<Stage> stages_05_sequence_parallel();
}  // namespace flashstep
