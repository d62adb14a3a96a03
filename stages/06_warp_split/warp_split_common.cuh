/// \file warp_split_common.cuh
/// \brief Device helpers shared by stage 06's split-Q and split-K bodies:
/// vector shared-memory reads and the HBM -> registers -> shared tile copies.
/// Device code: include it from .cu files only. Kernel arguments, masks and
/// the log2 constants are stage 04/05's (common/fa2_q_block.cuh).
#pragma once

#include <cstdint>

#include "common/fa2_q_block.cuh"

namespace flashstep::warp_split {

using fa2::kv_blocks_unmasked;
using fa2::kVec;
using fa2::Params;
using fa2::visible_in_block;

// One float of padding would break 16-byte row alignment; a float4 of padding
// per row moves consecutive rows by 4 banks, so a warp's float4 reads of 8
// consecutive rows (Kj, Vj) are one conflict-free 128-byte wavefront.
inline constexpr int kRowPad = kVec;

// Reads N (4 or 2) consecutive floats of shared memory as one vector access.
template <int N>
__device__ void load_vec(const float* src, float (&dst)[N]) {
  static_assert(N == 4 || N == 2, "float4 or float2 reads");
  if constexpr (N == 4) {
    const float4 v = *reinterpret_cast<const float4*>(src);
    dst[0] = v.x;
    dst[1] = v.y;
    dst[2] = v.z;
    dst[3] = v.w;
  } else {
    const float2 v = *reinterpret_cast<const float2*>(src);
    dst[0] = v.x;
    dst[1] = v.y;
  }
}

// Writes N (4 or 2) floats as one vector access.
template <int N>
__device__ void store_vec(const float (&src)[N], float* dst) {
  static_assert(N == 4 || N == 2, "float4 or float2 writes");
  if constexpr (N == 4) {
    *reinterpret_cast<float4*>(dst) = make_float4(src[0], src[1], src[2], src[3]);
  } else {
    *reinterpret_cast<float2*>(dst) = make_float2(src[0], src[1]);
  }
}

// Which elements of a kRows x kHeadDim tile a thread copies, kWidth floats at
// a time (a float4, or one float when d is not a multiple of 4): pieces
// e = tid, tid + kThreads, ... of the tile in row-major order, so that a
// warp's global loads are contiguous.
template <int kRows, int kHeadDim, int kThreads, int kWidth>
struct TilePlace {
  static constexpr int kPerRow = kHeadDim / kWidth;  // pieces in one row
  static_assert(kRows * kPerRow % kThreads == 0, "the threads cover the tile evenly");
  static constexpr int kCount = kRows * kPerRow / kThreads;  // pieces per thread
  // When whole rows fit the block, a thread keeps its columns in every row
  // and steps down the rows: fewer address registers.
  static constexpr bool kSameColumns = kThreads % kPerRow == 0;
  static __device__ int row(int n) {
    const int tid = static_cast<int>(threadIdx.x);
    if constexpr (kSameColumns) return tid / kPerRow + n * (kThreads / kPerRow);
    return (tid + n * kThreads) / kPerRow;
  }
  static __device__ int col(int n) {
    const int tid = static_cast<int>(threadIdx.x);
    if constexpr (kSameColumns) return kWidth * (tid % kPerRow);
    return kWidth * ((tid + n * kThreads) % kPerRow);
  }
};

// A kRows x kHeadDim tile staged in registers between HBM and shared memory,
// so that its loads can be in flight while the thread computes.
template <int kRows, int kHeadDim, int kThreads>
struct StagedTile {
  static constexpr int kFloats = kRows * kHeadDim / kThreads;
  static_assert(kFloats % kVec == 0, "the staging holds whole float4s");
  float v[kFloats];

  // HBM -> registers: the first `rows` rows and `d` columns come from
  // src [rows, d]; the rest of the tile is zero.
  __device__ void load(const float* src, int rows, int d, bool vec) {
    if (vec) {
      using At = TilePlace<kRows, kHeadDim, kThreads, kVec>;
#pragma unroll
      for (int n = 0; n < At::kCount; ++n) {
        const int r = At::row(n);
        const int k = At::col(n);
        float x[kVec] = {};
        if (r < rows && k < d) load_vec(src + static_cast<std::int64_t>(r) * d + k, x);
#pragma unroll
        for (int e = 0; e < kVec; ++e) v[n * kVec + e] = x[e];
      }
    } else {
      using At = TilePlace<kRows, kHeadDim, kThreads, 1>;
#pragma unroll
      for (int n = 0; n < At::kCount; ++n) {
        const int r = At::row(n);
        const int k = At::col(n);
        v[n] = r < rows && k < d ? src[static_cast<std::int64_t>(r) * d + k] : 0.0f;
      }
    }
  }

  // Registers -> shared, row-major: dst [kRows][kHeadDim + kRowPad].
  __device__ void store(float* dst, bool vec) const {
    constexpr int kStride = kHeadDim + kRowPad;
    if (vec) {
      using At = TilePlace<kRows, kHeadDim, kThreads, kVec>;
#pragma unroll
      for (int n = 0; n < At::kCount; ++n) {
        float x[kVec];
#pragma unroll
        for (int e = 0; e < kVec; ++e) x[e] = v[n * kVec + e];
        store_vec(x, dst + At::row(n) * kStride + At::col(n));
      }
    } else {
      using At = TilePlace<kRows, kHeadDim, kThreads, 1>;
#pragma unroll
      for (int n = 0; n < At::kCount; ++n) dst[At::row(n) * kStride + At::col(n)] = v[n];
    }
  }
};

// HBM -> shared without staging: dst [kRows][kHeadDim + kRowPad] from src
// [rows, d], zero past rows and d. For tiles that nothing else overlaps.
template <int kRows, int kHeadDim, int kThreads>
__device__ void copy_tile(const float* src, int rows, int d, bool vec, float* dst) {
  constexpr int kStride = kHeadDim + kRowPad;
  if (vec) {
    using At = TilePlace<kRows, kHeadDim, kThreads, kVec>;
#pragma unroll 4
    for (int n = 0; n < At::kCount; ++n) {
      const int r = At::row(n);
      const int k = At::col(n);
      float x[kVec] = {};
      if (r < rows && k < d) load_vec(src + static_cast<std::int64_t>(r) * d + k, x);
      store_vec(x, dst + r * kStride + k);
    }
  } else {
    using At = TilePlace<kRows, kHeadDim, kThreads, 1>;
#pragma unroll 4
    for (int n = 0; n < At::kCount; ++n) {
      const int r = At::row(n);
      const int k = At::col(n);
      dst[r * kStride + k] = r < rows && k < d ? src[static_cast<std::int64_t>(r) * d + k] : 0.0f;
    }
  }
}

// K/V tiles that a query row sees: those holding a key of keys 0 ..
// visible - 1. 0 for a row that sees none, or for a row past Nq. With
// skipping off (CausalMode::kNoSkip) every tile, for a row before Nq.
inline __device__ int kv_tiles_seen_by(const Params& p, std::int64_t row, int bc) {
  if (row >= p.Nq) return 0;
  if (p.mode == CausalMode::kNoSkip) return (p.Nk - 1) / bc + 1;
  const int keys = visible_in_block(p, row, 0);
  return keys <= 0 ? 0 : (keys - 1) / bc + 1;
}

// A Q block whose rows all see no key: O = 0 and L = -inf, nothing loaded.
template <int kThreads>
__device__ void write_empty_rows(float* Oi, float* Li, int rows, int d) {
  for (int e = static_cast<int>(threadIdx.x); e < rows * d; e += kThreads) Oi[e] = 0.0f;
  for (int r = static_cast<int>(threadIdx.x); r < rows; r += kThreads) Li[r] = -INFINITY;
}

}  // namespace flashstep::warp_split
