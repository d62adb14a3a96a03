/// \file warp_split_tiles.h
/// \brief Tile sizes of stage 06's two variants, per head-dimension bucket,
/// shared by the kernels (split_q.cuh, split_k.cuh) and the closed-form models
/// (warp_split_model.cpp). CUDA-free.
///
/// The two compile-time knobs of the stage: the head-dimension bucket (d is
/// zero-padded up to 64, 128 or 256 inside the tiles) and the tile shape that
/// each bucket picks below.
#pragma once

#include <cstdint>

namespace flashstep::warp_split {

/// Split-Q: warps per thread block. 8 warps (256 threads) give each SM
/// scheduler two warps to switch between while one waits on shared memory,
/// with one thread block per SM (the register use of every bucket, below).
inline constexpr int kSplitQWarps = 8;

/// Split-Q tiles of one bucket. Every warp owns warp_rows whole rows of the
/// Q tile (Br = kSplitQWarps * warp_rows) and reads the whole Kj, Vj tile of bc keys.
struct SplitQShape {
  int warp_rows;  ///< rows of Qi (and of S_ij, P~_ij, O~_i) one warp owns
  int bc;         ///< keys per K/V tile (the paper's Bc)
  int min_blocks_per_sm;  ///< __launch_bounds__ occupancy target
  constexpr int br() const { return kSplitQWarps * warp_rows; }  ///< the paper's Br
};

/// Why these shapes (limits: 255 registers per thread, 64K registers per SM,
/// 163 KiB of shared memory per sm_80 block):
/// - d <= 128: 16 rows per warp and Bc = 64 give each lane a 4 x 8 piece of
///   S_ij (12 float4 shared reads per 128 FMAs) and 4 rows x d/8 columns of
///   O~_i. Qi^T, Kj, Vj and P~_ij^T take 98 KiB at d = 64 and 162 KiB at
///   d = 128 (just inside sm_80's 163 KiB). One block per SM in both: at
///   d = 64 two blocks would need <= 128 registers per thread, and nvcc 13
///   then spills (S_ij, O~_i, the staged tile and the operands need more).
/// - d = 256: 16 rows per warp would hold 128 floats of O~_i per lane beside
///   S_ij and the staged tile, past 255 registers; 8 rows per warp keep 64.
///   Bc = 32 keeps Kj and Vj (2 x 32 x 260 floats) inside sm_80's limit.
constexpr SplitQShape split_q_shape(int head_dim) {
  return head_dim <= 64    ? SplitQShape{16, 64, 1}
         : head_dim <= 128 ? SplitQShape{16, 64, 1}
                           : SplitQShape{8, 32, 1};
}

/// Split-K, one shape for every bucket (the contrast needs to be correct and
/// to show its costs, not to be tuned): 4 warps share Kj/Vj's keys, 8 each.
/// Every warp keeps partial results for ALL Br rows, and the partial
/// P~ V products of the 4 warps pass through shared memory in column chunks:
/// [4 warps][Br][chunk] floats. Br = Bc = 32 and 32-column chunks keep the
/// d = 256 bucket (Qi^T, Kj, Vj, O~_i and the partials) inside sm_80's 163 KiB
/// and a lane's partial chunk at 32 registers.
inline constexpr int kSplitKWarps = 4;
inline constexpr int kSplitKBr = 32;
inline constexpr int kSplitKBc = 32;
inline constexpr int kSplitKChunk = 32;  ///< O~ columns combined per round
/// Column chunks (rounds of write-partials, barrier, add-up, barrier) per K/V tile.
constexpr int split_k_chunks(int head_dim) { return head_dim / kSplitKChunk; }

}  // namespace flashstep::warp_split
