/// \file fa2_tiles.h
/// \brief Tile sizes and log2-unit constants of the FlashAttention-2 forward
/// (stages 04 and 05), shared by the kernel body (fa2_q_block.cuh), the closed
/// form model (fa2_model.h) and stage 04's CPU mirror. CUDA-free.
#pragma once

namespace flashstep::fa2 {

/// Rows of Q per block (the paper's Br). Q blocks, K/V blocks and the thread
/// layout are tied together in fa2_q_block.cuh: 256 threads each own a 4 x 4
/// piece of the Br x Bc scores, and the shared-memory tiles of the largest head
/// dimension (256) fit the 163 KiB an sm_80 block can have.
inline constexpr int kBr = 64;
/// Rows of K and V per block (the paper's Bc).
inline constexpr int kBc = 64;
/// Threads per block.
inline constexpr int kThreads = 256;

/// log2(e). Kernel and mirror work in log2 units, e^x = 2^(x log2 e), with
/// log2(e) folded into the softmax scale: still one multiply per score, and
/// each exponential is a single exp2.
inline constexpr double kLog2e = 1.4426950408889634;
/// ln(2): turns the row max back from log2 units into the natural log of L.
inline constexpr double kLn2 = 0.6931471805599453;

}  // namespace flashstep::fa2
