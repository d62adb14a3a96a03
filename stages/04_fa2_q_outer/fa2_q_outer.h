/// \file fa2_q_outer.h
/// \brief Stage 04: FlashAttention-2 forward (Dao 2023, Algorithm 1). Q blocks in
/// the outer loop, K/V blocks in the inner loop, O~, l and m kept on chip, O~
/// divided by l once at the end, and only the logsumexp L written beside O.
/// Host entry points; CUDA-free.
#pragma once

#include <cstdint>
#include <vector>

#include "common/stage.h"

namespace flashstep::fa2_q_outer {

/// Rows of Q per block (the paper's Br). Q blocks, K/V blocks and the thread
/// layout are tied together in fa2_q_outer.cu: 256 threads each own a 4 x 4
/// piece of the Br x Bc scores, and the shared-memory tiles of the largest head
/// dimension (256) fit the 163 KiB an sm_80 block can have.
inline constexpr int kBr = 64;
/// Rows of K and V per block (the paper's Bc).
inline constexpr int kBc = 64;
/// Threads per block.
inline constexpr int kThreads = 256;
/// Grid x holds at most 2^31 - 1 blocks; beyond that one block takes several heads.
inline constexpr std::int64_t kMaxBlocks = 2147483647;

/// log2(e). Kernel and mirror work in log2 units, e^x = 2^(x log2 e), with
/// log2(e) folded into the softmax scale: still one multiply per score, and
/// each exponential is a single exp2.
inline constexpr double kLog2e = 1.4426950408889634;
/// ln(2): turns the row max back from log2 units into the natural log of L.
inline constexpr double kLn2 = 0.6931471805599453;

/// One thread block per (batch, head), looping over that head's Q blocks.
void forward(const Problem& p, const ForwardTensors& t, Stream stream);

/// Stage 04 needs no scratch memory: 0.
std::int64_t workspace_bytes(const Problem& p);

/// Traffic and FLOPs in closed form, summed over the Q blocks of one head:
/// Qi read once, Kj and Vj once per visited (i, j), O and L written once.
Cost model(const Problem& p);

/// The algorithm on the host with the kernel's loops and tiles, counting every
/// element moved, every shared-memory access and every FLOP (fa2_q_outer_mirror.cpp).
Cost mirror(const Problem& p, const HostTensors& t);

/// Q blocks of one head: ceil(Nq / Br).
std::int64_t q_blocks(const Problem& p);

/// K/V blocks that Q block i visits. Non-causal: all ceil(Nk / Bc). Causal:
/// those holding a key that the block's last row sees; the rest lie wholly
/// above the diagonal and are skipped.
std::int64_t kv_blocks_visited(const Problem& p, std::int64_t i);

}  // namespace flashstep::fa2_q_outer

namespace flashstep {
/// Registry entries of this folder.
std::vector<Stage> stages_04_fa2_q_outer();
}  // namespace flashstep
