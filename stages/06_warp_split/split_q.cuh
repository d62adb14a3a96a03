/// \file split_q.cuh
/// \brief Stage 06, split-Q (FlashAttention-2, Dao 2023, §3.3 and Figure 3b):
/// the body of one Q block. Each warp owns whole rows of Qi and reads all of
/// the shared Kj and Vj, so the softmax statistics of a row never leave its
/// warp. Device code: the kernel and launcher are in split_q.cu.
///
/// Work partitioning of one thread block (d <= 128 bucket: Br = 128, Bc = 64;
/// d = 256: 8 rows per warp, Br = 64, Bc = 32):
///
// clang-format off
///                 Kj, Vj (Bc keys, shared by all warps, read by all)
///              +--------------------------------------------+
///   Qi rows    | S_ij, P~_ij: 16 x Bc       O~_i: 16 x d     |
///     0 -  15  | warp 0   (m_i, l_i of rows 0-15: warp 0's)  |
///    16 -  31  | warp 1                                      |
///      ...     |  ...                                        |
///   112 - 127  | warp 7                                      |
///              +--------------------------------------------+
///   inside a warp, lane = 8 rg + cg (rg 0..3, cg 0..7):
///     S_ij, P~_ij: rows kTM rg .. kTM rg + kTM-1, keys cg + 8 cc (cc 0..kTN-1)
///     O~_i:        the same rows, columns 4 (cg + 8 q) .. +3 (q 0..d/32-1)
///   a row's keys sit in the 8 lanes of one rg: row max and row sum are
///   3 butterfly shuffles (xor 4, 2, 1), no shared memory, no barrier.
// clang-format on
///
/// Barriers guard only the shared Kj and Vj tiles: 2 per K/V tile. Each warp's
/// Qi^T and P~_ij^T slices are its own (written and read by its lanes only).
#pragma once

#include <cstddef>
#include <cstdint>

#include "warp_split_common.cuh"
#include "warp_split_tiles.h"

namespace flashstep::warp_split {

template <int kHeadDim>
struct SplitQ {
  static constexpr SplitQShape kShape = split_q_shape(kHeadDim);
  static constexpr int kWarps = kSplitQWarps;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kWarpRows = kShape.warp_rows;
  static constexpr int kBr = kShape.br();
  static constexpr int kBc = kShape.bc;
  // Lane layout inside a warp (drawn above): 8 column groups, so that a
  // warp's float4 reads of Kj (rows cg + 8 cc) and of Vj (columns 4 (cg + 8 q))
  // are 8 distinct float4s, one 128-byte wavefront; the 4 row groups read the
  // same addresses (broadcast).
  static constexpr int kLaneColGroups = 8;
  static constexpr int kLaneRowGroups = kWarpSize / kLaneColGroups;
  static constexpr int kTM = kWarpRows / kLaneRowGroups;  // rows per lane
  static constexpr int kTN = kBc / kLaneColGroups;        // keys per lane
  static constexpr int kOVecs = kHeadDim / (kVec * kLaneColGroups);  // float4s of O~ per row
  static constexpr int kOCols = kOVecs * kVec;
  static_assert(kWarpRows % kLaneRowGroups == 0 && kBc % kLaneColGroups == 0,
                "a warp's rows and keys split evenly over its lanes");
  static_assert(kTM == 4 || kTM == 2, "a lane reads its rows of Qi^T and P~^T as one vector");
  static_assert(kHeadDim % (kVec * kLaneColGroups) == 0, "each lane owns whole float4s of O~");
  static_assert(kWarpSize % kWarpRows == 0, "whole lanes per row when a warp loads its Qi");

  // Shared memory: Qw [kWarps][kHeadDim][kWarpRows] (each warp's rows of Qi,
  // transposed so that a lane reads its kTM rows at one k as one vector),
  // Kj and Vj [kBc][kKVStride] each (separate, so that Vj can be stored while
  // other warps still read Kj), Pw [kWarps][kBc][kWarpRows] (each warp's P~_ij,
  // transposed). Qw and Pw need no padding: a warp reads 4 consecutive vectors.
  static constexpr int kKVStride = kHeadDim + kRowPad;
  static constexpr int kQFloats = kWarps * kHeadDim * kWarpRows;
  static constexpr int kKVFloats = kBc * kKVStride;
  static constexpr int kPFloats = kWarps * kBc * kWarpRows;
  static constexpr std::size_t kSmemBytes =
      sizeof(float) * (kQFloats + 2 * kKVFloats + kPFloats);
  static_assert(kSmemBytes <= fa2::kSm80MaxSmem, "tiles must fit an sm_80 block");
  using Staged = StagedTile<kBc, kHeadDim, kThreads>;
};

// A warp's rows of Qi, HBM -> shared, transposed: dst [kHeadDim][kRows] from
// src [rows, d] (zero past rows and d). Lane l takes row l % kRows and the
// float4s l / kRows, l / kRows + 32 / kRows, ... of it: one warp-wide load
// reads whole 32-byte sectors, and a transposed store of 32 lanes puts
// at most 32 / kRows lanes on one bank (2-way at 16 rows, 4-way at 8). Done
// once per Q block.
template <int kHeadDim, int kRows>
__device__ void load_rows_transposed(const float* src, int rows, int d, bool vec, float* dst) {
  constexpr int kLanesPerRow = kWarpSize / kRows;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int r = lane % kRows;
  const int part = lane / kRows;
  const float* from = src + static_cast<std::int64_t>(r) * d;
  if (vec) {
#pragma unroll
    for (int k = kVec * part; k < kHeadDim; k += kVec * kLanesPerRow) {
      float x[kVec] = {};
      if (r < rows && k < d) load_vec(from + k, x);
#pragma unroll
      for (int e = 0; e < kVec; ++e) dst[(k + e) * kRows + r] = x[e];
    }
  } else {
#pragma unroll
    for (int k = part; k < kHeadDim; k += kLanesPerRow) {
      dst[k * kRows + r] = r < rows && k < d ? from[k] : 0.0f;
    }
  }
}

// Line 8: S_ij = Qi Kj^T for the lane's kTM x kTN piece (unscaled). Per 4 k:
// 4 vector reads of Qw and kTN float4 reads of Kj feed 4 kTM kTN FMAs
// (d <= 128: 12 reads, 128 FMAs).
template <int kHeadDim>
__device__ void multiply_qk(const float* Qw, const float* Kj, int rg, int cg,
                            float (&S_ij)[SplitQ<kHeadDim>::kTM][SplitQ<kHeadDim>::kTN]) {
  using T = SplitQ<kHeadDim>;
#pragma unroll
  for (int rr = 0; rr < T::kTM; ++rr) {
#pragma unroll
    for (int cc = 0; cc < T::kTN; ++cc) S_ij[rr][cc] = 0.0f;
  }
#pragma unroll 4
  for (int k = 0; k < kHeadDim; k += kVec) {
    float q[kVec][T::kTM];
#pragma unroll
    for (int kk = 0; kk < kVec; ++kk) load_vec(Qw + (k + kk) * T::kWarpRows + T::kTM * rg, q[kk]);
#pragma unroll
    for (int cc = 0; cc < T::kTN; ++cc) {
      float kv[kVec];
      load_vec(Kj + (cg + T::kLaneColGroups * cc) * T::kKVStride + k, kv);
#pragma unroll
      for (int kk = 0; kk < kVec; ++kk) {
#pragma unroll
        for (int rr = 0; rr < T::kTM; ++rr) S_ij[rr][cc] = fmaf(q[kk][rr], kv[kk], S_ij[rr][cc]);
      }
    }
  }
}

// The P~_ij Vj half of line 10 for the lane's kTM rows and kOCols columns.
// Per key: one vector of P~ and kOVecs float4s of Vj feed 4 kTM kOVecs FMAs.
template <int kHeadDim>
__device__ void accumulate_pv(const float* Pw, const float* Vj, int rg, int cg,
                              float (&O_tilde)[SplitQ<kHeadDim>::kTM][SplitQ<kHeadDim>::kOCols]) {
  using T = SplitQ<kHeadDim>;
#pragma unroll 8
  for (int c = 0; c < T::kBc; ++c) {
    float pc[T::kTM];
    load_vec(Pw + c * T::kWarpRows + T::kTM * rg, pc);
#pragma unroll
    for (int q = 0; q < T::kOVecs; ++q) {
      float v[kVec];
      load_vec(Vj + c * T::kKVStride + kVec * (cg + T::kLaneColGroups * q), v);
#pragma unroll
      for (int rr = 0; rr < T::kTM; ++rr) {
#pragma unroll
        for (int x = 0; x < kVec; ++x) {
          O_tilde[rr][q * kVec + x] = fmaf(pc[rr], v[x], O_tilde[rr][q * kVec + x]);
        }
      }
    }
  }
}

// Combines a value over the 8 lanes holding one row (lane bits 0-2).
template <typename Op>
__device__ float reduce_row(float v, Op op) {
  for (int offset = SplitQ<64>::kLaneColGroups / 2; offset > 0; offset /= 2) {
    v = op(v, __shfl_xor_sync(kFullWarpMask, v, offset));
  }
  return v;
}

// Algorithm 1, lines 4-15, for Q block i of head bh, split-Q. smem:
// SplitQ<kHeadDim>::kSmemBytes. Contains barriers (uniform control flow).
template <int kHeadDim>
__device__ void split_q_block(const Params& p, std::int64_t bh, int i, float* smem) {
  using T = SplitQ<kHeadDim>;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int rg = lane / T::kLaneColGroups;
  const int cg = lane % T::kLaneColGroups;
  float* Qw = smem + warp * kHeadDim * T::kWarpRows;  // [kHeadDim][kWarpRows]: my rows of Qi^T
  float* Kj = smem + T::kQFloats;                      // [kBc][kKVStride]
  float* Vj = Kj + T::kKVFloats;                       // [kBc][kKVStride]
  float* Pw = Vj + T::kKVFloats + warp * T::kBc * T::kWarpRows;  // [kBc][kWarpRows]: my P~_ij^T

  const int row0 = i * T::kBr;
  const int rows = min(T::kBr, p.Nq - row0);
  const int Tc_i = kv_tiles_seen_by(p, row0 + rows - 1, T::kBc);  // the rest: skipped (causal)
  const std::int64_t q_offset = (bh * p.Nq + row0) * p.d;
  float* Oi = p.O + q_offset;          // [rows, d]
  float* Li = p.L + bh * p.Nq + row0;  // [rows]
  if (Tc_i == 0) {  // every row of the block sees no key: nothing to load
    write_empty_rows<T::kThreads>(Oi, Li, rows, p.d);
    return;
  }
  // My rows: block rows warp_r0 .. warp_r0 + my_rows - 1 (none past Nq). With
  // the causal mask my rows may see fewer K/V tiles than the block's last
  // row: tiles Tc_w .. Tc_i - 1 I only help load.
  const int warp_r0 = warp * T::kWarpRows;
  const int my_rows = max(0, min(T::kWarpRows, rows - warp_r0));
  const int Tc_w = my_rows > 0 ? kv_tiles_seen_by(p, std::int64_t{row0} + warp_r0 + my_rows - 1,
                                                  T::kBc)
                               : 0;
  // Tiles 0 .. Tc_w_unmasked - 1 my rows see whole: no mask test there.
  const int Tc_w_unmasked = kv_blocks_unmasked(p, row0 + warp_r0, T::kWarpRows, T::kBc);
  const std::int64_t kv = kv_head_of(bh, p.H, p.H_kv);  // the K/V head of bh's group
  const float* K = p.K + kv * p.Nk * p.d;  // [Nk, d] of this head's group
  const float* V = p.V + kv * p.Nk * p.d;  // [Nk, d] of this head's group

  // Line 4 (my rows of Qi) and line 7's first Kj, ahead of the loop.
  const float* Qw_src = p.Q + q_offset + static_cast<std::int64_t>(warp_r0) * p.d;  // [my_rows, d]
  load_rows_transposed<kHeadDim, T::kWarpRows>(Qw_src, my_rows, p.d, p.vec, Qw);
  typename T::Staged staged;
  staged.load(K, min(T::kBc, p.Nk), p.d, p.vec);
  staged.store(Kj, p.vec);
  __syncthreads();

  // Line 5. l_i holds this lane's share of each row sum: every share of a row
  // is scaled by the same e^(m_i - m_new), and the 8 shares are added at the end.
  float O_tilde[T::kTM][T::kOCols] = {};
  float l_i[T::kTM] = {};
  float m_i[T::kTM];  // running row max, in log2 units
#pragma unroll
  for (int rr = 0; rr < T::kTM; ++rr) m_i[rr] = -INFINITY;

  for (int j = 0; j < Tc_i; ++j) {  // line 6
    const int key0 = j * T::kBc;
    // Line 7 (Vj): its loads are in flight while S_ij is computed.
    staged.load(V + static_cast<std::int64_t>(key0) * p.d, min(T::kBc, p.Nk - key0), p.d, p.vec);
    const bool mine = j < Tc_w;  // warp-uniform: do my rows see any key of Kj?
    if (mine) {
      // Line 8, scaled into log2 units; keys past Nk or above the diagonal -> -inf,
      // tested one by one only in the tiles my rows do not all see whole.
      float S_ij[T::kTM][T::kTN];
      multiply_qk<kHeadDim>(Qw, Kj, rg, cg, S_ij);
      const bool test = j >= Tc_w_unmasked;  // warp-uniform
#pragma unroll
      for (int rr = 0; rr < T::kTM; ++rr) {
        // Line 9: m_new = max(m_i, rowmax(S_ij)), over the row's 8 lanes.
        float m_new = m_i[rr];
        if (test) {
          const int visible =
              visible_in_block(p, std::int64_t{row0} + warp_r0 + T::kTM * rg + rr, key0);
#pragma unroll
          for (int cc = 0; cc < T::kTN; ++cc) {
            const bool seen = cg + T::kLaneColGroups * cc < visible;
            S_ij[rr][cc] = seen ? S_ij[rr][cc] * p.scale_log2 : -INFINITY;
            m_new = fmaxf(m_new, S_ij[rr][cc]);
          }
        } else {
#pragma unroll
          for (int cc = 0; cc < T::kTN; ++cc) {
            S_ij[rr][cc] *= p.scale_log2;
            m_new = fmaxf(m_new, S_ij[rr][cc]);
          }
        }
        m_new = reduce_row(m_new, MaxOp{});
        // BEGIN ASSIGNMENT: line 9-10 for row rr of this lane: P~_ij = exp2(S_ij - m_new) in S_ij (against 0 when m_new = -inf), this lane's share of l_i rescaled and summed, O_tilde[rr] *= e^(m_i - m_new), m_i[rr] = m_new
        // Line 9: P~_ij = exp(S_ij - m_new), l_i = e^(m_i - m_new) l_i + rowsum(P~_ij);
        // line 10's rescale of O~_i by the same factor. A row that has seen no
        // key yet has m_new = -inf: subtracting 0 instead keeps exp(-inf - -inf)
        // from giving NaN, and leaves P~ = 0, l_i = 0, O~_i = 0.
        const float m_safe = m_new == -INFINITY ? 0.0f : m_new;
        const float alpha = exp2f(m_i[rr] - m_safe);
        m_i[rr] = m_new;
        float rowsum = 0.0f;
#pragma unroll
        for (int cc = 0; cc < T::kTN; ++cc) {
          S_ij[rr][cc] = exp2f(S_ij[rr][cc] - m_safe);  // now P~_ij
          rowsum += S_ij[rr][cc];
        }
        l_i[rr] = alpha * l_i[rr] + rowsum;
#pragma unroll
        for (int c = 0; c < T::kOCols; ++c) O_tilde[rr][c] *= alpha;
        // END ASSIGNMENT
      }
      // P~_ij^T to my warp's slice. The previous tile's reads of it ended
      // before the last barrier, and the barrier below publishes it.
#pragma unroll
      for (int cc = 0; cc < T::kTN; ++cc) {
        float column[T::kTM];
#pragma unroll
        for (int rr = 0; rr < T::kTM; ++rr) column[rr] = S_ij[rr][cc];
        store_vec(column, Pw + (cg + T::kLaneColGroups * cc) * T::kWarpRows + T::kTM * rg);
      }
    }
    // Vj: every warp's reads of the previous Vj ended before the last barrier.
    staged.store(Vj, p.vec);
    __syncthreads();  // Vj and P~_ij complete; every read of Kj done

    // Line 7 (next Kj): in flight during the P~_ij Vj product.
    const bool more = j + 1 < Tc_i;
    if (more) {
      staged.load(K + static_cast<std::int64_t>(key0 + T::kBc) * p.d,
                  min(T::kBc, p.Nk - key0 - T::kBc), p.d, p.vec);
    }
    if (mine) accumulate_pv<kHeadDim>(Pw, Vj, rg, cg, O_tilde);  // line 10: O~_i += P~_ij Vj
    if (more) {
      staged.store(Kj, p.vec);
      __syncthreads();  // next Kj complete; every read of Vj done
    }
  }

  // Line 12: O_i = diag(l_i)^-1 O~_i, one reciprocal per row. Line 13:
  // L_i = m_i + log(l_i), m_i converted back from log2 units. A row that saw no
  // key has l_i = 0: O_i = 0 and L_i = -inf.
  float L_i[T::kTM];
#pragma unroll
  for (int rr = 0; rr < T::kTM; ++rr) {
    const float l = reduce_row(l_i[rr], SumOp{});
    const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
    L_i[rr] = l > 0.0f ? m_i[rr] * fa2::kLn2F + logf(l) : -INFINITY;
#pragma unroll
    for (int c = 0; c < T::kOCols; ++c) O_tilde[rr][c] *= inv_l;
  }
  // Lines 14-15: 8 lanes write a row's float4s side by side.
#pragma unroll
  for (int rr = 0; rr < T::kTM; ++rr) {
    const int r = T::kTM * rg + rr;  // in my rows
    if (r >= my_rows) continue;
    float* O_row = Oi + static_cast<std::int64_t>(warp_r0 + r) * p.d;  // [d]
#pragma unroll
    for (int q = 0; q < T::kOVecs; ++q) {
      const int k = kVec * (cg + T::kLaneColGroups * q);
      const float* o = &O_tilde[rr][q * kVec];
      if (p.vec) {
        if (k < p.d) *reinterpret_cast<float4*>(O_row + k) = make_float4(o[0], o[1], o[2], o[3]);
      } else {
#pragma unroll
        for (int x = 0; x < kVec; ++x) {
          if (k + x < p.d) O_row[k + x] = o[x];
        }
      }
    }
  }
  // Lanes cg = 0 .. kTM-1 of a row group each write one of its rows' L.
  if (cg < T::kTM && T::kTM * rg + cg < my_rows) {
    float L_lane = L_i[0];
#pragma unroll
    for (int rr = 1; rr < T::kTM; ++rr) L_lane = cg == rr ? L_i[rr] : L_lane;
    Li[warp_r0 + T::kTM * rg + cg] = L_lane;
  }
}

}  // namespace flashstep::warp_split
