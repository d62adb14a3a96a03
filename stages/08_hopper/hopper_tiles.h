/// \file hopper_tiles.h
/// \brief Stage 08's ablation steps and tile shapes, shared by the kernel
/// (hopper.cuh), the launchers, the model and the CPU mirror. CUDA-free.
#pragma once

#include <string_view>

namespace flashstep::hopper {

/// The ablation ladder of FlashAttention-3's ideas. Every step keeps the
/// previous steps' ideas. Steps 3-5 (warp specialization with setmaxnreg,
/// ping-pong of two consumer warpgroups, softmax overlapped with the next
/// GEMM inside a warpgroup) are not written yet (README.md, "Not yet").
enum class Step : int {
  /// wgmma.mma_async for S = Qi Kj^T (A and B from shared memory) and
  /// O~ += P~ Vj (P~ from registers, V through a transposed descriptor),
  /// each waited for at once; tiles copied in by the threads with ordinary
  /// loads and stores into the 128-byte-swizzled layout wgmma reads.
  kWgmmaSync = 1,
  /// + TMA: Qi, Kj and Vj brought in by cp.async.bulk.tensor, kStages
  ///   buffers deep, each completing on an mbarrier; K/V tile j - 1 lands
  ///   while tile j computes.
  kTmaPipeline = 2,
};

constexpr std::string_view step_slug(Step step) {
  switch (step) {
    case Step::kWgmmaSync: return "step1_wgmma_sync";
    case Step::kTmaPipeline: break;
  }
  return "step2_tma_pipeline";
}

/// Rows of Q per thread block: one consumer warpgroup of 4 warps, one m64
/// wgmma tall (the paper's Br).
inline constexpr int kBr = 64;
/// Keys per K/V tile (the paper's Bc): one n64 wgmma wide for S, and one
/// 128-byte swizzle row of Vj's column blocks for O += P V.
inline constexpr int kBc = 64;
/// Threads per block: one warpgroup.
inline constexpr int kThreads = 128;
/// K/V buffers of the TMA pipeline (step 2): two, so that the next tile's
/// copy runs under this tile's products and softmax. At d = 256 two stages
/// of Kj and Vj take 128 KiB beside Qi's 32 KiB, inside the 227 KiB a block
/// may have.
inline constexpr int kStages = 2;

/// log2(e) and ln(2), as in stage 07: exponentials as exp2, scale folded in.
inline constexpr double kLog2e = 1.4426950408889634;
inline constexpr double kLn2 = 0.6931471805599453;

}  // namespace flashstep::hopper
