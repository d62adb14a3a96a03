/// \file fa2_q_outer.h
/// \brief Stage 04: FlashAttention-2 forward (Dao 2023, Algorithm 1). Q blocks in
/// the outer loop, K/V blocks in the inner loop, O~, l and m kept on chip, O~
/// divided by l once at the end, and only the logsumexp L written beside O.
/// Host entry points; CUDA-free.
#pragma once

#include <cstdint>
#include <vector>

#include "common/fa2_model.h"
#include "common/fa2_tiles.h"
#include "common/stage.h"
#include "common/tile_mask.h"

namespace flashstep::fa2_q_outer {

// The tile sizes and log2-unit constants, shared with stage 05 and the common
// kernel body (common/fa2_tiles.h).
using fa2::kBc;
using fa2::kBr;
using fa2::kLn2;
using fa2::kLog2e;
using fa2::kThreads;

/// Grid x holds at most 2^31 - 1 blocks; beyond that one block takes several heads.
inline constexpr std::int64_t kMaxBlocks = 2147483647;

/// One thread block per (batch, head), looping over that head's Q blocks.
void forward(const Problem& p, const ForwardTensors& t, Stream stream);
/// The same in a causal mode (common/tile_mask.h): kFast is the forward
/// above; the other two are for the benchmark's ablation and give the same
/// O and L bit for bit.
void forward(const Problem& p, const ForwardTensors& t, Stream stream, CausalMode mode);

/// Stage 04 needs no scratch memory: 0.
std::int64_t workspace_bytes(const Problem& p);

/// Traffic and FLOPs in closed form (fa2::model in common/fa2_model.h):
/// Qi read once, Kj and Vj once per visited (i, j), O and L written once;
/// min(B * H, kMaxBlocks) thread blocks.
Cost model(const Problem& p);

/// The algorithm on the host with the kernel's loops and tiles, counting every
/// element moved, every shared-memory access, every FLOP and every mask test
/// (fa2_q_outer_mirror.cpp).
Cost mirror(const Problem& p, const HostTensors& t);
/// The same in a causal mode, as the kernel runs it: fa2::model(p, blocks, mode) counts it.
Cost mirror(const Problem& p, const HostTensors& t, CausalMode mode);

// q_blocks(p) (Q blocks of one head) and kv_blocks_visited(p, i) (K/V blocks
// Q block i visits), shared with stage 05 (common/fa2_model.h).
using fa2::kv_blocks_visited;
using fa2::q_blocks;

}  // namespace flashstep::fa2_q_outer

namespace flashstep {
/// Registry entries of this folder.
std::vector<Stage> stages_04_fa2_q_outer();
}  // namespace flashstep
