/// \file backward_tiles.h
/// \brief Tile sizes of stage 05's backward (FlashAttention-2, Algorithm 2),
/// shared by the kernel (sequence_parallel_backward.cu), the closed-form model
/// and the CPU mirror. CUDA-free.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flashstep::sequence_parallel::bwd {

/// Threads per block.
inline constexpr int kThreads = 256;

/// Rows of Q (and dO, dQ) per inner step (the paper's Br). The block keeps Kj,
/// Vj, dK_j and dV_j for its whole life and streams Q blocks past them, so Br
/// sizes only the streamed tiles: 32 keeps Qi, dOi, P_ij, dS_ij and dS_ij^T of
/// d = 256 beside Kj and Vj in 144 KiB, inside an sm_80 block's 163 KiB.
inline constexpr int kBr = 32;

/// Keys per K/V block (the paper's Bc), per head-dimension bucket.
/// - d <= 64: 64 keys. The tiles take 77 KiB and dK_j, dV_j 32 registers per
///   thread, so two blocks share an SM.
/// - d = 128: 32 keys. With 64, dK_j and dV_j need 64 registers per thread
///   (244 in all) and the tiles 125 KiB: one 8-warp block per SM, no warp
///   ready in 54% of the cycles (ncu). 32 keys halve both (80 KiB, 128
///   registers) and two blocks share an SM: faster at every point of the
///   recorded sweep (docs/results/backward.csv, commit 6efea7d against
///   a78d9a8), although every Q block is now streamed past twice as many K/V
///   blocks.
/// - d = 256: 32 keys; 64 keys of Kj and Vj alone would take 130 KiB and, with
///   the streamed tiles, pass sm_80's 163 KiB.
constexpr int block_keys(int head_dim_bucket) { return head_dim_bucket <= 64 ? 64 : 32; }

/// Grid y holds at most 65535 blocks; beyond that one block takes the same K/V
/// block of several heads.
inline constexpr std::int64_t kMaxGridY = 65535;

}  // namespace flashstep::sequence_parallel::bwd
