/// \file smem_tile_sm80.cuh
/// \brief Swizzled shared-memory tiles of 16-bit elements for the sm_80
/// tensor-core instructions (mma_sm80.cuh): the swizzle, the tile copy from
/// global memory (cp.async or through registers), and where each lane points
/// its ldmatrix row address for the A and B fragments of mma.m16n8k16. Stage
/// 07's forward and backward and stage 09's tensor-core split kernel share
/// them. Device code: include it from .cu files only.
#pragma once

#include <cstdint>

#include "mma_sm80.cuh"

namespace flashstep::sm80 {

/// Rows (m), columns (n) and depth (k) of the mma.m16n8k16 tile.
inline constexpr int kMmaM = 16;
inline constexpr int kMmaN = 8;
inline constexpr int kMmaK = 16;

// ---------------------------------------------------------------------------
// Shared-memory layout.
//
// A tile is row-major, [rows][kCols] 16-bit elements, split into 16-byte
// chunks of 8 elements. ldmatrix reads one chunk from each of 8 consecutive
// rows at the same column. With rows of 128 bytes or more those 8 chunks all
// start at the same bank (row stride is a multiple of 128 bytes = 32 banks):
// an 8-way bank conflict. The swizzle stores chunk c of row r at chunk
// position c ^ (r % 8), so those 8 chunks land in 8 different 16-byte bank
// groups (CUTLASS calls this Swizzle<3, 3, 3>):
//
//   chunk position:   0   1   2   3   4   5   6   7
//   row 0 holds       c0  c1  c2  c3  c4  c5  c6  c7
//   row 1 holds       c1  c0  c3  c2  c5  c4  c7  c6
//   row 2 holds       c2  c3  c0  c1  c6  c7  c4  c5
//   ...
//   row 7 holds       c7  c6  c5  c4  c3  c2  c1  c0
//
// Column c0 of rows 0..7 sits at positions 0, 1, ..., 7: all banks once.
// Rows wider than 8 chunks repeat the pattern in each 128-byte half.

/// Element offset of (row, col) in a [rows][kCols] tile.
template <int kCols, bool kSwizzle>
__device__ inline int tile_offset(int row, int col) {
  if constexpr (kSwizzle) {
    // chunk ^ (row % 8) changes only the chunk's low 3 bits. Written as the
    // high bits plus the swizzled low bits, the compiler sees that the
    // high bits (a compile-time constant in every fragment loop) only add
    // to a handful of lane-dependent offsets, instead of keeping one
    // address register per fragment for the whole kernel.
    const int chunk = col / kChunkElems;
    const int swizzled = (chunk & ~7) | ((chunk & 7) ^ (row & 7));
    return row * kCols + swizzled * kChunkElems + col % kChunkElems;
  } else {
    return row * kCols + col;
  }
}

/// How kThreads threads split a [kRows][kCols] tile into 16-byte chunks for
/// a copy (load_tile, load_full_tile_async): a thread takes one chunk column
/// col and the rows row0 + k * kRowsPerPass.
template <int kRows, int kCols, int kThreads>
struct ChunkColumn {
  static constexpr int kChunksPerRow = kCols / kChunkElems;
  static constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  static constexpr int kPasses = kRows / kRowsPerPass;
  static_assert(kThreads % kChunksPerRow == 0 && kRows % kRowsPerPass == 0,
                "the threads cover whole rows, and the tile whole passes");
  int row0 = threadIdx.x / kChunksPerRow;
  int col = threadIdx.x % kChunksPerRow * kChunkElems;
};

/// Copies rows [0, rows_valid) x columns [0, d) of a row-major global array
/// with d columns into a [kRows][kCols] tile, zero-filling the rest (rows past
/// the sequence's end, columns past d).
///
/// Each thread copies one column of 16-byte chunks: chunk column
/// tid % (chunks per row), rows tid / (chunks per row) + k * kRowsPerPass.
/// Consecutive threads take consecutive chunks of a row (coalesced), and a
/// thread's shared-memory offsets differ by whole multiples of 8 rows, where
/// the swizzle repeats, so its k-th offset is its first plus a constant.
///
/// With `vec` (d a multiple of 8 and 16-byte aligned tensors, so every chunk
/// is wholly inside or wholly outside): whole chunks, by cp.async (kAsync:
/// the caller commits and waits) or through registers. Otherwise element by
/// element.
template <typename Elem, int kRows, int kCols, bool kSwizzle, bool kAsync, int kThreads>
__device__ inline void load_tile(Elem* tile, const Elem* src, int rows_valid, int d, bool vec) {
  using Split = ChunkColumn<kRows, kCols, kThreads>;
  const Split mine;
  const int row0 = mine.row0, col = mine.col;
  if (vec) {
    // A compile-time trip count: fully unrolled with no exit test per chunk.
#pragma unroll
    for (int pass = 0; pass < Split::kPasses; ++pass) {
      const int row = row0 + pass * Split::kRowsPerPass;
      Elem* dst = tile + tile_offset<kCols, kSwizzle>(row, col);
      const bool inside = row < rows_valid && col < d;
      const Elem* from = inside ? src + static_cast<std::int64_t>(row) * d + col : src;
      if constexpr (kAsync) {
        sm80::cp_async_16(dst, from, inside);
      } else {
        *reinterpret_cast<uint4*>(dst) = inside ? *reinterpret_cast<const uint4*>(from) : uint4{};
      }
    }
  } else {
    // d not a multiple of 8 (rows not 16-byte aligned) or a misaligned
    // tensor: element by element, zeros past d. Rolled: it is the slow path.
#pragma unroll 1
    for (int row = row0; row < kRows; row += Split::kRowsPerPass) {
      Elem* dst = tile + tile_offset<kCols, kSwizzle>(row, col);
      const bool inside = row < rows_valid;
      const Elem* from = src + static_cast<std::int64_t>(inside ? row : 0) * d;
      for (int e = 0; e < kChunkElems; ++e) {
        dst[e] = inside && col + e < d ? from[col + e] : static_cast<Elem>(0.0f);
      }
    }
  }
}

/// load_tile's fast path by cp.async, for a tile with nothing to check: all
/// kRows rows inside the array, rows exactly kCols elements long (d equal to
/// the tile's width) and 16-byte aligned. The chunks are then the tile's
/// kRows * kCols elements in order, so a thread's first chunk starts at
/// element tid * 8 of src and its k-th a compile-time distance after it;
/// its shared-memory chunks are load_tile's. load_tile works out every
/// chunk's row and column, checks them and selects its address: about 10
/// integer instructions a chunk, against 2 here (the 64-bit add: cp.async
/// takes no offset on its global address), which counts in a loop that
/// streams a Q or K/V block past every few hundred instructions (stage 07's
/// backward). tile: [kRows][kCols], swizzled; src: [kRows, kCols].
template <typename Elem, int kRows, int kCols, int kThreads>
__device__ inline void load_full_tile_async(Elem* tile, const Elem* src) {
  using Split = ChunkColumn<kRows, kCols, kThreads>;
  const Split mine;
  const Elem* from = src + threadIdx.x * kChunkElems;
#pragma unroll
  for (int pass = 0; pass < Split::kPasses; ++pass) {
    sm80::cp_async_16(tile + tile_offset<kCols, true>(mine.row0 + pass * Split::kRowsPerPass,
                                                      mine.col),
                      from + pass * Split::kRowsPerPass * kCols, true);
  }
}

// ---------------------------------------------------------------------------
// Fragments from shared memory (the picture in common/mma_sm80.cuh).
// lane = threadIdx.x % 32, g = lane / 4, t = lane % 4.
//
// ldmatrix.x4 reads a 16 x 16 block as four 8 x 8 matrices; each lane gives
// the address of one 16-byte row of one of them. Where a lane points inside
// the block depends on what the block becomes:
//
//   A (Qi, P~):     lanes 0-15 rows 0-15 of columns 0-7, lanes 16-31 of 8-15
//                   -> a0 (rows 0-7, cols 0-7), a1 (8-15, 0-7), a2, a3
//   B of Q K^T:     lanes 0-7 keys 0-7 cols 0-7, 8-15 keys 0-7 cols 8-15,
//                   16-23 keys 8-15 cols 0-7, 24-31 keys 8-15 cols 8-15
//                   -> b0, b1 of keys 0-7; b0, b1 of keys 8-15
//   B of P V (.trans): lanes 0-7 keys 0-7 cols 0-7, 8-15 keys 8-15 cols 0-7,
//                   16-23 keys 0-7 cols 8-15, 24-31 keys 8-15 cols 8-15
//                   -> b0, b1 of columns 0-7; b0, b1 of columns 8-15

/// Where a lane's ldmatrix row address points inside a 16 x 16 block.
struct LanePoint {
  int row;  ///< 0..15
  int col;  ///< 0 or 8
};
__device__ inline LanePoint a_point(int lane) { return {lane % 16, lane / 16 * kChunkElems}; }
__device__ inline LanePoint k_point(int lane) {
  return {lane % 8 + lane / 16 * 8, lane / 8 % 2 * kChunkElems};
}
__device__ inline LanePoint v_point(int lane) {
  return {lane % 8 + lane / 8 % 2 * 8, lane / 16 * kChunkElems};
}

/// Elements in 8 chunks: the span over which the swizzle repeats along a row.
inline constexpr int kSwizzleSpan = 8 * kChunkElems;
/// 16-column fragment blocks in one swizzle span.
inline constexpr int kBlocksPerSpan = kSwizzleSpan / kMmaK;

/// A lane's swizzled offsets for the 16 x 16 blocks of a [rows][kCols] tile.
/// For a block at (row0, col0), row0 a multiple of 16 and col0 of 16, the
/// swizzle (above) XORs the chunk with the row's low 3 bits, which row0 does
/// not change, so the lane's offset is row0 * kCols + (col0 / 64) * 64, a
/// compile-time constant in the unrolled loops, plus one of 4 numbers that
/// depend on col0's place in its 64-column span. Computed once per kernel,
/// those 4 numbers leave the fragment loops nothing but constants to add
/// (left to itself, the compiler keeps one address per fragment, or
/// recomputes the swizzle on every load).
template <int kCols>
struct LaneOffsets {
  int at[kBlocksPerSpan];
  __device__ explicit LaneOffsets(LanePoint point) {
#pragma unroll
    for (int b = 0; b < kBlocksPerSpan; ++b) {
      at[b] = tile_offset<kCols, true>(point.row, b * kMmaK + point.col);
    }
  }
  __device__ int operator()(int row0, int col0) const {
    return row0 * kCols + col0 / kSwizzleSpan * kSwizzleSpan + at[col0 % kSwizzleSpan / kMmaK];
  }
};

}  // namespace flashstep::sm80
