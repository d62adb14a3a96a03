/// \file split_k.cuh
/// \brief Stage 06, split-K (FlashAttention-1's partitioning, Dao 2023, §3.3
/// and Figure 3a): the body of one Q block. The warps split the keys of each
/// Kj/Vj tile; every warp computes S and a partial O~ for ALL rows of Qi over
/// its keys, with its own partial row max and row sum, and after every K/V tile
/// the warps "write their intermediate results out to shared memory,
/// synchronize, then add up the intermediate results" (the paper's words).
/// Device code: the kernel and launcher are in split_k.cu.
///
/// It is the contrast to split-Q: correct, not tuned. Its point is the extra
/// shared-memory traffic and barriers of the per-tile combine.
///
// clang-format off
///              Kj, Vj keys:  0 - 7     8 - 15    16 - 23   24 - 31
///             +-----------+---------+---------+---------+---------+
///   Qi rows   |           | warp 0  | warp 1  | warp 2  | warp 3  |
///   0 - 31    | S, P~     | 32 x 8  | 32 x 8  | 32 x 8  | 32 x 8  |  each with its own
///   (all of   | m_w, l_w  | 32      | 32      | 32      | 32      |  partial m_w, l_w
///   them, in  | P~ V part | 32 x d  | 32 x d  | 32 x d  | 32 x d  |  -> shared memory
///   every     +-----------+---------+---------+---------+---------+
///   warp)       barrier; m_new = max(m_i, m_0..m_3);
///               O~_i = e^(m_i - m_new) O~_i + sum_w e^(m_w - m_new) (P~ V)_w
///               (in shared memory, d in 32-column chunks, a barrier pair each)
///   inside a warp, lane = 4 rg + cg (rg 0..7, cg 0..3): S rows 4 rg .. 4 rg+3,
///   keys 8 w + cg + 4 cc (cc 0..1); partial P~ V: the same rows, chunk
///   columns 4 (cg + 4 q) .. +3 (q 0..1).
// clang-format on
#pragma once

#include <cstddef>
#include <cstdint>

#include "warp_split_common.cuh"
#include "warp_split_tiles.h"

namespace flashstep::warp_split {

template <int kHeadDim>
struct SplitK {
  static constexpr int kWarps = kSplitKWarps;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kBr = kSplitKBr;
  static constexpr int kBc = kSplitKBc;
  static constexpr int kChunk = kSplitKChunk;
  static constexpr int kChunks = split_k_chunks(kHeadDim);
  static constexpr int kWarpKeys = kBc / kWarps;  // keys of Kj/Vj per warp
  static constexpr int kLaneColGroups = 4;
  static constexpr int kLaneRowGroups = kWarpSize / kLaneColGroups;
  static constexpr int kTM = kBr / kLaneRowGroups;              // rows per lane
  static constexpr int kTN = kWarpKeys / kLaneColGroups;        // keys per lane
  static constexpr int kPVecs = kChunk / (kVec * kLaneColGroups);  // float4s per row per chunk
  static constexpr int kPCols = kPVecs * kVec;
  static_assert(kBc % kWarps == 0 && kWarpKeys % kLaneColGroups == 0, "keys split evenly");
  static_assert(kTM == kVec, "a lane reads its rows of Qi^T and P~^T as one float4");
  static_assert(kHeadDim % kChunk == 0 && kChunk % (kVec * kLaneColGroups) == 0,
                "chunks split evenly into lanes' float4s");

  // Shared memory, in floats.
  static constexpr int kQStride = kBr + kRowPad;       // QiT  [kHeadDim][kQStride]
  static constexpr int kKVStride = kHeadDim + kRowPad; // Kj, Vj [kBc][kKVStride]
  static constexpr int kPStride = kBr + kRowPad;       // PT   [kBc][kPStride]: P~_ij^T
  static constexpr int kPartStride = kChunk + kRowPad; // part [kWarps][kBr][kPartStride]
  static constexpr int kQFloats = kHeadDim * kQStride;
  static constexpr int kKVFloats = kBc * kKVStride;
  static constexpr int kPFloats = kBc * kPStride;
  static constexpr int kPartFloats = kWarps * kBr * kPartStride;
  static constexpr int kOFloats = kBr * kHeadDim;  // O~_i [kBr][kHeadDim]
  // m_w, l_w [kWarps][kBr] each; m_i, l_i, alpha [kBr] each; beta [kWarps][kBr].
  static constexpr int kStatFloats = 3 * kWarps * kBr + 3 * kBr;
  static constexpr std::size_t kSmemBytes =
      sizeof(float) *
      (kQFloats + 2 * kKVFloats + kPFloats + kPartFloats + kOFloats + kStatFloats);
  static_assert(kSmemBytes <= fa2::kSm80MaxSmem, "tiles must fit an sm_80 block");
};

// Algorithm 1's loop order with FA1's split-K inside the thread block, for Q
// block i of head bh. smem: SplitK<kHeadDim>::kSmemBytes. Contains barriers.
template <int kHeadDim>
__device__ void split_k_block(const Params& p, std::int64_t bh, int i, float* smem) {
  using T = SplitK<kHeadDim>;
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / kWarpSize;
  const int lane = tid % kWarpSize;
  const int rg = lane / T::kLaneColGroups;
  const int cg = lane % T::kLaneColGroups;
  const int w_key0 = warp * T::kWarpKeys;  // my first key in the tile
  float* QiT = smem;                     // [kHeadDim][kQStride]
  float* Kj = QiT + T::kQFloats;         // [kBc][kKVStride]
  float* Vj = Kj + T::kKVFloats;         // [kBc][kKVStride]
  float* PT = Vj + T::kKVFloats;         // [kBc][kPStride]
  float* part = PT + T::kPFloats;        // [kWarps][kBr][kPartStride]: each warp's P~ V chunk
  float* O_tilde = part + T::kPartFloats;  // [kBr][kHeadDim]
  float* m_w = O_tilde + T::kOFloats;    // [kWarps][kBr]: each warp's partial row max
  float* l_w = m_w + T::kWarps * T::kBr; // [kWarps][kBr]: each warp's partial row sum
  float* beta = l_w + T::kWarps * T::kBr;  // [kWarps][kBr]: e^(m_w - m_new)
  float* m_i = beta + T::kWarps * T::kBr;  // [kBr]
  float* l_i = m_i + T::kBr;             // [kBr]
  float* alpha = l_i + T::kBr;           // [kBr]: e^(m_i - m_new), at the end 1 / l_i

  const int row0 = i * T::kBr;
  const int rows = min(T::kBr, p.Nq - row0);
  const int Tc_i = kv_tiles_seen_by(p, row0 + rows - 1, T::kBc);  // the rest: skipped (causal)
  const int Tc_unmasked = kv_blocks_unmasked(p, row0, T::kBr, T::kBc);  // no mask test in these
  const std::int64_t q_offset = (bh * p.Nq + row0) * p.d;
  float* Oi = p.O + q_offset;          // [rows, d]
  float* Li = p.L + bh * p.Nq + row0;  // [rows]
  if (Tc_i == 0) {
    write_empty_rows<T::kThreads>(Oi, Li, rows, p.d);
    return;
  }
  const float* Qi = p.Q + q_offset;        // [rows, d]
  const std::int64_t kv = kv_head_of(bh, p.H, p.H_kv);  // the K/V head of bh's group
  const float* K = p.K + kv * p.Nk * p.d;  // [Nk, d] of this head's group
  const float* V = p.V + kv * p.Nk * p.d;  // [Nk, d] of this head's group

  // Lines 4-5: Qi^T, O~_i = 0, l_i = 0, m_i = -inf, and the first Kj, Vj.
  for (int e = tid; e < T::kBr * kHeadDim; e += T::kThreads) {
    const int r = e / kHeadDim;
    const int k = e % kHeadDim;
    QiT[k * T::kQStride + r] = r < rows && k < p.d ? Qi[static_cast<std::int64_t>(r) * p.d + k] : 0.0f;
    O_tilde[e] = 0.0f;
  }
  if (tid < T::kBr) {
    m_i[tid] = -INFINITY;
    l_i[tid] = 0.0f;
  }
  copy_tile<T::kBc, kHeadDim, T::kThreads>(K, min(T::kBc, p.Nk), p.d, p.vec, Kj);
  copy_tile<T::kBc, kHeadDim, T::kThreads>(V, min(T::kBc, p.Nk), p.d, p.vec, Vj);
  __syncthreads();

  for (int j = 0; j < Tc_i; ++j) {  // line 6
    const int key0 = j * T::kBc;
    // Line 8 for ALL rows of Qi and my keys of Kj, in log2 units.
    float S[T::kTM][T::kTN] = {};
#pragma unroll 4
    for (int k = 0; k < kHeadDim; k += kVec) {
      float q[kVec][T::kTM];
#pragma unroll
      for (int kk = 0; kk < kVec; ++kk) load_vec(QiT + (k + kk) * T::kQStride + T::kTM * rg, q[kk]);
#pragma unroll
      for (int cc = 0; cc < T::kTN; ++cc) {
        float kv[kVec];
        load_vec(Kj + (w_key0 + cg + T::kLaneColGroups * cc) * T::kKVStride + k, kv);
#pragma unroll
        for (int kk = 0; kk < kVec; ++kk) {
#pragma unroll
          for (int rr = 0; rr < T::kTM; ++rr) S[rr][cc] = fmaf(q[kk][rr], kv[kk], S[rr][cc]);
        }
      }
    }
    // Line 9 over my keys only: partial m_w = rowmax(S), P~ = exp(S - m_w),
    // l_w = rowsum(P~), over the row's 4 lanes. A row that sees none of my
    // keys has m_w = -inf: subtracting 0 instead leaves P~ = 0, l_w = 0.
    // Keys past Nk or above the diagonal -> -inf, tested one by one only in the
    // tiles the block's rows do not all see whole.
    const bool test = j >= Tc_unmasked;
#pragma unroll
    for (int rr = 0; rr < T::kTM; ++rr) {
      const int r = T::kTM * rg + rr;
      float m_part = -INFINITY;
      if (test) {
        const int visible = visible_in_block(p, std::int64_t{row0} + r, key0);
#pragma unroll
        for (int cc = 0; cc < T::kTN; ++cc) {
          const bool seen = w_key0 + cg + T::kLaneColGroups * cc < visible;
          S[rr][cc] = seen ? S[rr][cc] * p.scale_log2 : -INFINITY;
          m_part = fmaxf(m_part, S[rr][cc]);
        }
      } else {
#pragma unroll
        for (int cc = 0; cc < T::kTN; ++cc) {
          S[rr][cc] *= p.scale_log2;
          m_part = fmaxf(m_part, S[rr][cc]);
        }
      }
      for (int offset = T::kLaneColGroups / 2; offset > 0; offset /= 2) {
        m_part = fmaxf(m_part, __shfl_xor_sync(kFullWarpMask, m_part, offset));
      }
      const float m_safe = m_part == -INFINITY ? 0.0f : m_part;
      float l_part = 0.0f;
#pragma unroll
      for (int cc = 0; cc < T::kTN; ++cc) {
        S[rr][cc] = exp2f(S[rr][cc] - m_safe);  // now my keys' P~
        l_part += S[rr][cc];
      }
      for (int offset = T::kLaneColGroups / 2; offset > 0; offset /= 2) {
        l_part += __shfl_xor_sync(kFullWarpMask, l_part, offset);
      }
      if (cg == 0) {
        m_w[warp * T::kBr + r] = m_part;
        l_w[warp * T::kBr + r] = l_part;
      }
    }
#pragma unroll
    for (int cc = 0; cc < T::kTN; ++cc) {
      float column[T::kTM];
#pragma unroll
      for (int rr = 0; rr < T::kTM; ++rr) column[rr] = S[rr][cc];
      store_vec(column, PT + (w_key0 + cg + T::kLaneColGroups * cc) * T::kPStride + T::kTM * rg);
    }
    __syncthreads();  // every warp's m_w, l_w written; every read of Kj done

    // The combine's scales, one thread per row: m_new = max(m_i, m_w over
    // warps), alpha = e^(m_i - m_new), beta_w = e^(m_w - m_new),
    // l_i = alpha l_i + sum_w beta_w l_w. Published by the next barrier.
    if (tid < T::kBr) {
      float m_new = m_i[tid];
      for (int w = 0; w < T::kWarps; ++w) m_new = fmaxf(m_new, m_w[w * T::kBr + tid]);
      const float m_safe = m_new == -INFINITY ? 0.0f : m_new;
      const float a = exp2f(m_i[tid] - m_safe);
      float l = a * l_i[tid];
      for (int w = 0; w < T::kWarps; ++w) {
        const float b = exp2f(m_w[w * T::kBr + tid] - m_safe);
        beta[w * T::kBr + tid] = b;
        l = fmaf(b, l_w[w * T::kBr + tid], l);
      }
      alpha[tid] = a;
      m_i[tid] = m_new;
      l_i[tid] = l;
    }

    // Line 10, one 32-column chunk of O~_i at a time: my keys' P~ Vj to
    // shared memory, barrier, everyone adds up, barrier.
    const bool more = j + 1 < Tc_i;
    for (int chunk = 0; chunk < T::kChunks; ++chunk) {
      const int col0 = chunk * T::kChunk;
      float acc[T::kTM][T::kPCols] = {};
#pragma unroll
      for (int c = w_key0; c < w_key0 + T::kWarpKeys; ++c) {
        float pc[T::kTM];
        load_vec(PT + c * T::kPStride + T::kTM * rg, pc);
#pragma unroll
        for (int q = 0; q < T::kPVecs; ++q) {
          float v[kVec];
          load_vec(Vj + c * T::kKVStride + col0 + kVec * (cg + T::kLaneColGroups * q), v);
#pragma unroll
          for (int rr = 0; rr < T::kTM; ++rr) {
#pragma unroll
            for (int x = 0; x < kVec; ++x) {
              acc[rr][q * kVec + x] = fmaf(pc[rr], v[x], acc[rr][q * kVec + x]);
            }
          }
        }
      }
      float* my_part = part + warp * T::kBr * T::kPartStride;  // [kBr][kPartStride]
#pragma unroll
      for (int rr = 0; rr < T::kTM; ++rr) {
#pragma unroll
        for (int q = 0; q < T::kPVecs; ++q) {
          float x4[kVec];
#pragma unroll
          for (int x = 0; x < kVec; ++x) x4[x] = acc[rr][q * kVec + x];
          store_vec(x4, my_part + (T::kTM * rg + rr) * T::kPartStride +
                            kVec * (cg + T::kLaneColGroups * q));
        }
      }
      __syncthreads();  // every warp's partials (and the scales) complete

      // Add up: O~_i = alpha O~_i + sum_w beta_w (P~ V)_w, element by element.
      for (int e = tid; e < T::kBr * T::kChunk; e += T::kThreads) {
        const int r = e / T::kChunk;
        const int c = e % T::kChunk;
        float o = alpha[r] * O_tilde[r * kHeadDim + col0 + c];
        for (int w = 0; w < T::kWarps; ++w) {
          o = fmaf(beta[w * T::kBr + r], part[(w * T::kBr + r) * T::kPartStride + c], o);
        }
        O_tilde[r * kHeadDim + col0 + c] = o;
      }
      // Line 7 for the next tile, after the last chunk's partials: Kj and Vj
      // have no readers left.
      if (more && chunk == T::kChunks - 1) {
        const int next = key0 + T::kBc;
        const int keys = min(T::kBc, p.Nk - next);
        copy_tile<T::kBc, kHeadDim, T::kThreads>(K + static_cast<std::int64_t>(next) * p.d, keys,
                                                  p.d, p.vec, Kj);
        copy_tile<T::kBc, kHeadDim, T::kThreads>(V + static_cast<std::int64_t>(next) * p.d, keys,
                                                  p.d, p.vec, Vj);
      }
      __syncthreads();  // partials added (their buffer is free); next Kj, Vj complete
    }
  }

  // Lines 12-13: 1 / l_i and L_i per row, then O_i = O~_i / l_i. A row that
  // saw no key has l_i = 0: O_i = 0 and L_i = -inf.
  if (tid < T::kBr) {
    const float l = l_i[tid];
    alpha[tid] = l > 0.0f ? 1.0f / l : 0.0f;
    if (tid < rows) Li[tid] = l > 0.0f ? m_i[tid] * fa2::kLn2F + logf(l) : -INFINITY;
  }
  __syncthreads();
  for (int e = tid; e < rows * p.d; e += T::kThreads) {  // lines 14-15
    const int r = e / p.d;
    const int c = e % p.d;
    Oi[e] = O_tilde[r * kHeadDim + c] * alpha[r];
  }
}

}  // namespace flashstep::warp_split
