/// \file tensor_core_tiles.h
/// \brief Stage 07's ablation steps and tile shapes, shared by the kernel
/// (tensor_core.cuh), the launchers and the closed-form model. CUDA-free.
///
/// The stage's two compile-time knobs: the head-dimension bucket (d is
/// zero-padded up to 64, 128 or 256 inside the tiles) and the ablation step.
/// Each step switches on one more of the ideas FlashAttention-2's CUDA code
/// is made of, so that each can be timed on its own (README.md, "Ablation").
#pragma once

#include <string_view>

namespace flashstep::tensor_core {

/// The ablation ladder. Every step keeps the previous steps' ideas.
enum class Step : int {
  /// mma.sync.m16n8k16 for Q K^T and P V; fragments gathered from plain
  /// row-major shared memory with 32-bit loads; tiles copied in by the
  /// threads (global -> registers -> shared) and then computed; P~ goes
  /// through shared memory between the two products.
  kPlainMma = 1,
  /// + ldmatrix (.trans for V) and a swizzled shared-memory layout, so that
  ///   the fragment loads are 4 instructions instead of 16 and hit no bank twice.
  kLdmatrix = 2,
  /// + cp.async: tiles copied global -> shared without passing through the
  ///   registers, V_j loading under the product Q K_j^T and K_{j-1} under
  ///   the softmax and P V_j.
  kCpAsync = 3,
  /// + P~ stays in registers: the fp32 score fragments, rounded to 16 bits,
  ///   are the A operand of P V (mma_sm80.cuh shows why the layouts agree).
  kPInRegisters = 4,
  /// + tile shapes chosen per head dimension by measurement (below).
  kTunedTiles = 5,
};

/// Short names of the steps, for the registry entries.
constexpr std::string_view step_slug(Step step) {
  switch (step) {
    case Step::kPlainMma: return "step1_plain_mma";
    case Step::kLdmatrix: return "step2_ldmatrix";
    case Step::kCpAsync: return "step3_cp_async";
    case Step::kPInRegisters: return "step4_p_in_registers";
    case Step::kTunedTiles: break;
  }
  return "tensor_core";
}

/// Rows of the m16n8k16 tile: the rows one warp computes at a time.
inline constexpr int kMmaM = 16;
/// Columns of its n8 output tile, and of one 16-byte chunk of 16-bit elements.
inline constexpr int kMmaN = 8;
/// Its k depth.
inline constexpr int kMmaK = 16;

/// Tiles of one (bucket, step). Warps split Q (stage 06's lesson): warp w
/// owns rows w * warp_rows .. of the Q tile and reads all of Kj and Vj.
struct TileShape {
  int br;     ///< rows of Q per thread block (the paper's Br)
  int bc;     ///< keys per K/V tile (the paper's Bc)
  int warps;  ///< warps per thread block
  constexpr int warp_rows() const { return br / warps; }  ///< rows of Qi one warp owns
};

/// Steps 1-4 share one shape, so that each step's gain is its idea alone:
/// Br = Bc = 64 as in stages 04-05, 4 warps of 16 rows (one m16 tile each).
/// Step 5 takes FlashAttention-2's own choices on the H100 (its
/// flash_fwd_launch_template.h), confirmed on the H200 by the tile sweep in
/// README.md. Limits behind them: 255 registers per thread, and a warp holds
/// (warp_rows x d + warp_rows x Bc) fp32 accumulators of O~_i and S_ij:
/// - d = 64: 128 x 128 with 4 warps. 32 rows per warp share every K and V
///   fragment between two m16 tiles, halving the shared-memory reads per
///   mma against 16 rows; 64 + 128 accumulator registers per thread fit.
///   Qi, Kj, Vj take 48 KiB: four blocks could share an SM's 228 KiB, and
///   registers allow two.
/// - d = 128: 128 x 64: 128 registers of O~_i and 64 of S_ij; 64 KiB of
///   shared memory, two blocks per SM.
/// - d = 256: 64 x 64, 16 rows per warp: O~_i alone is 128 registers, so 32
///   rows per warp would not fit; 96 KiB, two blocks per SM.
constexpr TileShape tile_shape(int head_dim, Step step) {
  if (step != Step::kTunedTiles) return {64, 64, 4};
  return head_dim <= 64 ? TileShape{128, 128, 4}
         : head_dim <= 128 ? TileShape{128, 64, 4}
                           : TileShape{64, 64, 4};
}

/// log2(e): the kernel works in log2 units, e^x = 2^(x log2 e), with log2(e)
/// folded into the softmax scale, so each exponential is one exp2 (MUFU.EX2).
inline constexpr double kLog2e = 1.4426950408889634;
/// ln(2): turns the row max and sum from log2 units into the natural L.
inline constexpr double kLn2 = 0.6931471805599453;

}  // namespace flashstep::tensor_core
