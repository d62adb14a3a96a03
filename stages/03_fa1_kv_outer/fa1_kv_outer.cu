// Stage 03: FlashAttention-1 (Dao et al. 2022, Algorithm 1), K/V blocks outer.
//
//   for each K/V block j:                        (outer, Tc = ceil(Nk / Bc))
//     Kj, Vj -> shared memory
//     for each Q block i:                        (inner, Tr = ceil(Nq / Br))
//       Qi -> shared memory; O_i, l_i, m_i -> registers      (read from HBM)
//       S_ij = scale Qi Kj^T, P~_ij, m~_ij, l~_ij, m_new, l_new   (on chip)
//       O_i <- diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~_ij - m_new) P~_ij Vj)
//       O_i, l_i <- l_new, m_i <- m_new                      (written to HBM)
//
// What changed since stage 02: S and P never touch HBM. Each score tile lives
// on chip for one step and the softmax is computed online, one K/V block at a
// time, by rescaling what was accumulated so far. The price of putting K/V in
// the outer loop is that O_i, l_i and m_i make a round trip through HBM on every
// step: O is read and written Tc times. Stage 04 swaps the loops and removes it.
//
// One thread block per (batch, head), as in the paper. Like the paper, every
// (i, j) tile is computed, even where the causal mask hides all of it (stage 04
// skips those); the per-score mask test runs only in the tiles the rows do not
// all see whole (FlashAttention-2's other half of the lesson, common/tile_mask.h).
//
// Element types: Q, K, V and O are fp32, fp16 or bf16 (the Elem template
// parameter); tiles in shared memory and every sum are fp32. The running O_i
// makes its round trip through HBM in fp32 in every type, as l and m do: in O
// itself in fp32, and in fp16/bf16 in an fp32 array of the workspace (O_acc),
// with the last K/V block writing O in the element type. Rounding O_i to 16
// bits on each of the Tc round trips would add Tc roundings to the one the
// output needs; FlashAttention-1's own code keeps such an fp32 o_tmp too.
//
// Run: ./build/stages/cli/flashstep --stage 03 --B 8 --H 32 --N 2048 --d 64 [--causal]
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda_check.h"
#include "common/element.cuh"
#include "common/launch.cuh"
#include "common/reduce.cuh"
#include "common/tile_mask.h"
#include "fa1_kv_outer.h"

namespace flashstep::fa1_kv_outer {

namespace {

// The 256 threads form a 16 x 16 grid (tx = threadIdx.x % 16, ty = threadIdx.x / 16)
// laid over every tile; rows are interleaved so that each thread owns 4 of them:
//
//   S_ij / P~_ij [Br=64][Bc]          O_i [Br=64][D]
//   columns tx, tx+16, ...            columns 4tx..4tx+3, 64+4tx..64+4tx+3, ...
//
//             tx=0  tx=1 ... tx=15
//   ty=0      rows 0, 16, 32, 48      <- warp 0, lanes 0..15
//   ty=1      rows 1, 17, 33, 49      <- warp 0, lanes 16..31
//   ...
//   ty=15     rows 15, 31, 47, 63     <- warp 7, lanes 16..31
//
// All 16 threads of a tile row are one half-warp, so a row max or row sum is
// four shuffles, and the two rows of a warp read Qi / P~_ij as broadcasts.
constexpr int kGridCols = 16;
constexpr int kGridRows = kThreads / kGridCols;
static_assert(2 * kGridCols == kWarpSize, "a tile row's threads must be exactly one half-warp");
constexpr int kHalfWarpOffset = kGridCols / 2;  // first shuffle distance of a half-warp reduction

// Elements per vector access: a float4 in fp32, 8 bytes in fp16/bf16.
constexpr int kVec = 4;
// Padding of the Qi, Kj, Vj rows: a row stride = 4 (mod 32) words puts the
// 16-byte reads of 8 consecutive rows Kj[tx + 16b][k..k+3] on 32 distinct banks.
constexpr int kRowPad = 4;
// Padding of the P~_ij rows: a row stride = 16 (mod 32) puts the two half-warps'
// rows (ty, ty + 1) on disjoint banks when each writes its 16 scores.
constexpr int kScoreRowPad = 16;
// Shared memory per block on sm_80 with the opt-in attribute (163 KB); sm_90
// allows 227 KB. The tiles are sized for the smaller so one build serves both.
constexpr int kMaxSharedBytes = 163 * 1024;

// Tile geometry for padded head dimension D (the header's shared constants).
template <int D>
struct Tiles {
  static constexpr int Br = kBr;
  static constexpr int Bc = kv_tile_rows(D);
  static constexpr int kRows = Br / kGridRows;          // query rows per thread
  static constexpr int kCols = Bc / kGridCols;          // score columns per thread
  static constexpr int kOutVecs = D / (kVec * kGridCols);  // float4s of O_i per thread and row
  static constexpr int kStride = D + kRowPad;           // floats per row of Qi, Kj, Vj
  static constexpr int kScoreStride = Bc + kScoreRowPad;  // floats per row of P~_ij
  static constexpr int kSharedBytes =
      static_cast<int>(((Br + 2 * Bc) * kStride + Br * kScoreStride) * sizeof(float));

  static_assert(D == head_dim_bucket(D), "D must be one of the head-dimension buckets");
  static_assert(Br % kGridRows == 0 && Bc % kGridCols == 0, "tiles must cover the thread grid");
  static_assert(D % (kVec * kGridCols) == 0, "each thread owns whole float4s of O_i");
  static_assert(Bc % kVec == 0, "P~_ij Vj walks the K/V rows four at a time");
  static_assert(kStride % kWarpSize == kRowPad, "Kj row reads must be bank-conflict free");
  static_assert(kScoreStride % kWarpSize == kWarpSize / 2, "P~_ij writes must be conflict free");
  static_assert(kSharedBytes <= kMaxSharedBytes, "tiles must fit sm_80's shared memory");
};

__device__ float4 zero4() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }

// row[col .. col+3] widened to fp32, with the elements at or beyond d read as
// 0. One vector load when rows are 16-byte aligned (float4_ok), else four
// guarded ones.
template <typename Elem>
__device__ float4 load4(const Elem* row, int col, int d, bool vec4) {
  if (vec4) return col < d ? load_vec4(row + col) : zero4();
  return make_float4(col < d ? to_float(row[col]) : 0.0f,
                     col + 1 < d ? to_float(row[col + 1]) : 0.0f,
                     col + 2 < d ? to_float(row[col + 2]) : 0.0f,
                     col + 3 < d ? to_float(row[col + 3]) : 0.0f);
}

// row[col .. col+3] = v rounded to Elem, the elements at or beyond d left alone.
template <typename Elem>
__device__ void store4(Elem* row, int col, int d, bool vec4, float4 v) {
  if (vec4) {
    if (col < d) store_vec4(row + col, v);
    return;
  }
  if (col < d) row[col] = from_float<Elem>(v.x);
  if (col + 1 < d) row[col + 1] = from_float<Elem>(v.y);
  if (col + 2 < d) row[col + 2] = from_float<Elem>(v.z);
  if (col + 3 < d) row[col + 3] = from_float<Elem>(v.w);
}

__device__ float component(float4 v, int k) {
  return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

__device__ void fma4(float4& acc, float a, float4 b) {
  acc.x = fmaf(a, b.x, acc.x);
  acc.y = fmaf(a, b.y, acc.y);
  acc.z = fmaf(a, b.z, acc.z);
  acc.w = fmaf(a, b.w, acc.w);
}

__device__ float dot4(float4 a, float4 b, float acc) {
  return fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, fmaf(a.x, b.x, acc))));
}

// Reduces over the 16 threads of one tile row; xor distances 8..1 stay inside
// the half-warp. Every lane of the warp must call it.
template <typename Op>
__device__ float row_reduce(float v, Op op) {
  for (int offset = kHalfWarpOffset; offset > 0; offset /= 2) {
    v = op(v, __shfl_xor_sync(kFullWarpMask, v, offset));
  }
  return v;
}

// tile [kTileRows][kStride] <- src [rows, d] widened to fp32, rows and
// columns beyond the source zero-filled. Consecutive threads take consecutive
// 4-element vectors of the (contiguous) source rows, so each warp reads whole
// segments.
template <int D, int kTileRows, typename Elem>
__device__ void load_tile(float* tile,      // [kTileRows][kStride], shared
                          const Elem* src,  // [rows, d], global
                          int rows, int d, bool vec4) {
  constexpr int kVecsPerRow = D / kVec;
  for (int e = threadIdx.x; e < kTileRows * kVecsPerRow; e += kThreads) {
    const int r = e / kVecsPerRow;
    const int col = kVec * (e % kVecsPerRow);
    const float4 v =
        r < rows ? load4(src + static_cast<std::int64_t>(r) * d, col, d, vec4) : zero4();
    *reinterpret_cast<float4*>(tile + r * Tiles<D>::kStride + col) = v;
  }
}

// S_ij = Qi Kj^T for this thread's 4 rows and kCols columns, over the padded D.
// Per 4 values of k: kRows + kCols 16-byte shared loads feed kRows * kCols * 4 FMAs.
template <int D>
__device__ void qk_product(const float* Qi,  // [Br][kStride], shared
                           const float* Kj,  // [Bc][kStride], shared
                           int tx, int ty, float (&S_ij)[Tiles<D>::kRows][Tiles<D>::kCols]) {
  using T = Tiles<D>;
#pragma unroll
  for (int a = 0; a < T::kRows; ++a) {
#pragma unroll
    for (int b = 0; b < T::kCols; ++b) S_ij[a][b] = 0.0f;
  }
  for (int k = 0; k < D; k += kVec) {
    float4 q[T::kRows];
    float4 kv[T::kCols];
#pragma unroll
    for (int a = 0; a < T::kRows; ++a) {
      q[a] = *reinterpret_cast<const float4*>(Qi + (ty + kGridRows * a) * T::kStride + k);
    }
#pragma unroll
    for (int b = 0; b < T::kCols; ++b) {
      kv[b] = *reinterpret_cast<const float4*>(Kj + (tx + kGridCols * b) * T::kStride + k);
    }
#pragma unroll
    for (int a = 0; a < T::kRows; ++a) {
#pragma unroll
      for (int b = 0; b < T::kCols; ++b) S_ij[a][b] = dot4(q[a], kv[b], S_ij[a][b]);
    }
  }
}

// O_i += P_ij Vj for this thread's 4 rows and kOutVecs float4s of columns.
// Per 4 K/V rows: kRows + 4 * kOutVecs 16-byte shared loads feed
// kRows * kOutVecs * 16 FMAs.
template <int D>
__device__ void pv_product(const float* P_ij,  // [Br][kScoreStride], shared
                           const float* Vj,    // [Bc][kStride], shared
                           int tx, int ty, float4 (&O_i)[Tiles<D>::kRows][Tiles<D>::kOutVecs]) {
  using T = Tiles<D>;
  for (int c = 0; c < T::Bc; c += kVec) {
    float4 p[T::kRows];
#pragma unroll
    for (int a = 0; a < T::kRows; ++a) {
      p[a] = *reinterpret_cast<const float4*>(P_ij + (ty + kGridRows * a) * T::kScoreStride + c);
    }
#pragma unroll
    for (int cc = 0; cc < kVec; ++cc) {
      float4 v[T::kOutVecs];
#pragma unroll
      for (int b = 0; b < T::kOutVecs; ++b) {
        v[b] = *reinterpret_cast<const float4*>(Vj + (c + cc) * T::kStride + kVec * tx +
                                                kVec * kGridCols * b);
      }
#pragma unroll
      for (int a = 0; a < T::kRows; ++a) {
#pragma unroll
        for (int b = 0; b < T::kOutVecs; ++b) fma4(O_i[a][b], component(p[a], cc), v[b]);
      }
    }
  }
}

// One thread block per (batch, head): Algorithm 1 of the FlashAttention paper.
// In fp32, O_acc is O itself, so neither of the two is __restrict__.
// mask_every: test every score of every tile (CausalMode::kMaskEvery, the
// benchmark's ablation), not only those of the tiles that need it.
template <int D, typename Elem>
__global__ void __launch_bounds__(kThreads)
    fa1_kv_outer_kernel(const Elem* __restrict__ Q,  // [BH, Nq, d]
                        const Elem* __restrict__ K,  // [BH, Nk, d]
                        const Elem* __restrict__ V,  // [BH, Nk, d]
                        Elem* O,                     // [BH, Nq, d], written by the last K/V block
                        float* O_acc,                // [BH, Nq, d], the running O_i (see above)
                        float* __restrict__ L,       // [BH, Nq]
                        float* __restrict__ l,       // [BH, Nq] running row sums (workspace)
                        float* __restrict__ m,       // [BH, Nq] running row maxima (workspace)
                        std::int64_t BH, int Nq, int Nk, int d, float scale, bool causal,
                        bool vec4, bool mask_every) {
  using T = Tiles<D>;
  extern __shared__ float4 shared[];  // float4: 16-byte alignment for the vector accesses
  float* Qi = reinterpret_cast<float*>(shared);  // [Br][kStride]
  float* Kj = Qi + T::Br * T::kStride;           // [Bc][kStride]
  float* Vj = Kj + T::Bc * T::kStride;           // [Bc][kStride]
  // [Br][kScoreStride]: P~_ij scaled by e^(m~_ij - m_new) / l_new, the factor
  // line 12 applies to P~_ij Vj, folded in so O_i accumulates in place.
  float* P_ij = Vj + T::Bc * T::kStride;

  const int tx = threadIdx.x % kGridCols;
  const int ty = threadIdx.x / kGridCols;
  const int Tr = (Nq - 1) / T::Br + 1;
  const int Tc = (Nk - 1) / T::Bc + 1;
  // Query q sees key k iff k <= q + Nk - Nq (bottom-right aligned).
  const std::int64_t causal_shift = static_cast<std::int64_t>(Nk) - Nq;

  for (std::int64_t bh = blockIdx.x; bh < BH; bh += gridDim.x) {
    const Elem* Qh = Q + bh * Nq * d;      // [Nq, d]
    const Elem* Kh = K + bh * Nk * d;      // [Nk, d]
    const Elem* Vh = V + bh * Nk * d;      // [Nk, d]
    Elem* Oh = O + bh * Nq * d;            // [Nq, d]
    float* O_acc_h = O_acc + bh * Nq * d;  // [Nq, d]
    float* Lh = L + bh * Nq;               // [Nq]
    float* lh = l + bh * Nq;               // [Nq]
    float* mh = m + bh * Nq;               // [Nq]

    // Line 2: O = 0 (in O_acc), l = 0, m = -inf in HBM. Each thread initialises
    // the elements of O it will own in every step, so it reads back its own writes.
    for (int i = 0; i < Tr; ++i) {
#pragma unroll
      for (int a = 0; a < T::kRows; ++a) {
        const std::int64_t q = static_cast<std::int64_t>(i) * T::Br + ty + kGridRows * a;
        if (q >= Nq) continue;
#pragma unroll
        for (int b = 0; b < T::kOutVecs; ++b) {
          store4(O_acc_h + q * d, kVec * (tx + kGridCols * b), d, vec4, zero4());
        }
        if (tx == 0) {
          lh[q] = 0.0f;
          mh[q] = -INFINITY;
        }
      }
    }

    // Line 5: outer loop over K/V blocks.
    for (int j = 0; j < Tc; ++j) {
      const int j0 = j * T::Bc;
      const int cols = min(T::Bc, Nk - j0);
      // Every thread is done with the previous Kj, Vj; the l, m written by
      // other threads (initialisation or the last step) are visible.
      __syncthreads();
      // Line 6: load Kj, Vj to shared memory (visible after the next barrier).
      load_tile<D, T::Bc>(Kj, Kh + static_cast<std::int64_t>(j0) * d, cols, d, vec4);
      load_tile<D, T::Bc>(Vj, Vh + static_cast<std::int64_t>(j0) * d, cols, d, vec4);

      // Line 7: inner loop over Q blocks.
      for (int i = 0; i < Tr; ++i) {
        const int i0 = i * T::Br;
        const int rows = min(T::Br, Nq - i0);
        // Line 8: Qi to shared memory. Nobody reads Qi after the previous
        // step's second barrier, so it is free to overwrite here.
        load_tile<D, T::Br>(Qi, Qh + static_cast<std::int64_t>(i0) * d, rows, d, vec4);
        __syncthreads();  // Qi (and on i = 0, Kj and Vj) fully written

        // Line 8: O_i (from O_acc), l_i, m_i to registers. Loaded after the barrier and used
        // only after the score tile, so their latency hides behind Qi Kj^T.
        float4 O_i[T::kRows][T::kOutVecs];
        float l_i[T::kRows];
        float m_i[T::kRows];
#pragma unroll
        for (int a = 0; a < T::kRows; ++a) {
          const int r = ty + kGridRows * a;
          const std::int64_t q = static_cast<std::int64_t>(i0) + r;
#pragma unroll
          for (int b = 0; b < T::kOutVecs; ++b) {
            const int col = kVec * (tx + kGridCols * b);
            O_i[a][b] = r < rows ? load4(O_acc_h + q * d, col, d, vec4) : zero4();
          }
          l_i[a] = r < rows ? lh[q] : 0.0f;
          m_i[a] = r < rows ? mh[q] : -INFINITY;
        }

        // Line 9: S_ij = scale Qi Kj^T, -inf where the key is padding or masked,
        // tested one by one only in a tile the rows do not all see whole
        // (FlashAttention-2's lesson, common/tile_mask.h; FA1 tests them all).
        float S_ij[T::kRows][T::kCols];
        qk_product<D>(Qi, Kj, tx, ty, S_ij);
        if (mask_every || tile_mask({Nq, Nk, causal}, i0, T::Br, j0, T::Bc) != TileMask::kNone) {
          // Key j0 + c is visible to query i0 + r iff c - r <= diagonal.
          const std::int64_t diagonal = static_cast<std::int64_t>(i0) - j0 + causal_shift;
#pragma unroll
          for (int a = 0; a < T::kRows; ++a) {
            const int r = ty + kGridRows * a;
#pragma unroll
            for (int b = 0; b < T::kCols; ++b) {
              const int c = tx + kGridCols * b;
              const bool visible = c < cols && (!causal || c - r <= diagonal);
              S_ij[a][b] = visible ? S_ij[a][b] * scale : -INFINITY;
            }
          }
        } else {
#pragma unroll
          for (int a = 0; a < T::kRows; ++a) {
#pragma unroll
            for (int b = 0; b < T::kCols; ++b) S_ij[a][b] *= scale;
          }
        }

#pragma unroll
        for (int a = 0; a < T::kRows; ++a) {
          // BEGIN ASSIGNMENT: lines 10-12 for row a: m~_ij and l~_ij (row_reduce over the half-warp), m_new, l_new, P_ij = e^(m~_ij - m_new) / l_new * P~_ij into shared memory, O_i *= l_i e^(m_i - m_new) / l_new; update l_i, m_i
          // Line 10: m~_ij = rowmax(S_ij), P~_ij = exp(S_ij - m~_ij), l~_ij = rowsum(P~_ij).
          // A row with no visible key here has m~_ij = -inf: subtracting 0
          // instead keeps P~_ij = exp(-inf) = 0 rather than exp(NaN).
          float m_tilde_ij = -INFINITY;
#pragma unroll
          for (int b = 0; b < T::kCols; ++b) m_tilde_ij = fmaxf(m_tilde_ij, S_ij[a][b]);
          m_tilde_ij = row_reduce(m_tilde_ij, MaxOp{});
          const float m_tilde_ref = m_tilde_ij == -INFINITY ? 0.0f : m_tilde_ij;
          float l_tilde_ij = 0.0f;
#pragma unroll
          for (int b = 0; b < T::kCols; ++b) {
            S_ij[a][b] = expf(S_ij[a][b] - m_tilde_ref);  // now P~_ij
            l_tilde_ij += S_ij[a][b];
          }
          l_tilde_ij = row_reduce(l_tilde_ij, SumOp{});

          // Line 11: m_new = max(m_i, m~_ij),
          // l_new = e^(m_i - m_new) l_i + e^(m~_ij - m_new) l~_ij.
          // While the row has seen no key, m_new = -inf: exponents are taken
          // against 0 instead, so both factors are 0 (not NaN) and l_new = 0.
          const float m_new = fmaxf(m_i[a], m_tilde_ij);
          const float m_ref = m_new == -INFINITY ? 0.0f : m_new;
          const float l_i_scaled = expf(m_i[a] - m_ref) * l_i[a];
          const float p_factor = expf(m_tilde_ij - m_ref);
          const float l_new = l_i_scaled + p_factor * l_tilde_ij;
          const float inv_l_new = l_new > 0.0f ? 1.0f / l_new : 0.0f;

          // Line 12, with diag(l_new)^-1 distributed over both terms:
          // O_i <- (l_i e^(m_i - m_new) / l_new) O_i + (e^(m~_ij - m_new) / l_new) P~_ij Vj.
          // The first factor scales O_i now; the second goes into P_ij.
          const float o_factor = l_i_scaled * inv_l_new;
          const float p_out_factor = p_factor * inv_l_new;
          const int r = ty + kGridRows * a;
#pragma unroll
          for (int b = 0; b < T::kCols; ++b) {
            P_ij[r * T::kScoreStride + tx + kGridCols * b] = p_out_factor * S_ij[a][b];
          }
#pragma unroll
          for (int b = 0; b < T::kOutVecs; ++b) {
            O_i[a][b].x *= o_factor;
            O_i[a][b].y *= o_factor;
            O_i[a][b].z *= o_factor;
            O_i[a][b].w *= o_factor;
          }
          l_i[a] = l_new;
          m_i[a] = m_new;
          // END ASSIGNMENT
        }
        // P_ij complete; after this barrier nobody reads Qi in this step.
        __syncthreads();

        // Line 12: O_i += P_ij Vj.
        pv_product<D>(P_ij, Vj, tx, ty, O_i);

        // Lines 12-13: write O_i, l_i <- l_new, m_i <- m_new to HBM: O_i to
        // O_acc, and after the last K/V block to O, with L_i = m_i + log(l_i)
        // (-inf + -inf = -inf for a row that saw no key: no guard needed).
#pragma unroll
        for (int a = 0; a < T::kRows; ++a) {
          const int r = ty + kGridRows * a;
          if (r >= rows) continue;
          const std::int64_t q = static_cast<std::int64_t>(i0) + r;
#pragma unroll
          for (int b = 0; b < T::kOutVecs; ++b) {
            const int col = kVec * (tx + kGridCols * b);
            if (j == Tc - 1) store4(Oh + q * d, col, d, vec4, O_i[a][b]);
            else store4(O_acc_h + q * d, col, d, vec4, O_i[a][b]);
          }
          if (tx == 0) {
            lh[q] = l_i[a];
            mh[q] = m_i[a];
            if (j == Tc - 1) Lh[q] = m_i[a] + logf(l_i[a]);
          }
        }
      }
    }
  }
}

template <int D, typename Elem>
void launch(const Problem& p, const ForwardTensors& t, float* O_acc, float* l, float* m,
            bool vec4, CausalMode mode, Stream stream) {
  const auto grid = static_cast<unsigned>(launched_blocks(p));
  launch_with_smem(fa1_kv_outer_kernel<D, Elem>, grid, kThreads, Tiles<D>::kSharedBytes, stream,
                   "stage 03 fa1_kv_outer_kernel", static_cast<const Elem*>(t.Q),
                   static_cast<const Elem*>(t.K), static_cast<const Elem*>(t.V),
                   static_cast<Elem*>(t.O), O_acc, t.L, l, m, p.heads(), static_cast<int>(p.Nq),
                   static_cast<int>(p.Nk), static_cast<int>(p.d),
                   static_cast<float>(p.softmax_scale()), p.causal, vec4,
                   mode == CausalMode::kMaskEvery);
}

}  // namespace

void forward(const Problem& p, const ForwardTensors& t, Stream stream) {
  forward(p, t, stream, CausalMode::kFast);
}

void forward(const Problem& p, const ForwardTensors& t, Stream stream, CausalMode mode) {
  validate(p);
  if (!t.Q || !t.K || !t.V || !t.O || !t.L || !t.workspace) {
    throw Error("stage 03: null tensor pointer");
  }
  // The running O_i [B, H, Nq, d]: O itself in fp32, the workspace's start in 16 bits.
  float* O_acc = p.dtype == DType::kFp32 ? static_cast<float*>(t.O)
                                         : static_cast<float*>(t.workspace);
  char* stats = static_cast<char*>(t.workspace) + stats_offset(p);
  float* l = reinterpret_cast<float*>(stats);  // [B, H, Nq]
  float* m = l + p.lse_elems();                // [B, H, Nq]
  // O_acc's rows are 16-byte aligned whenever O's are: d % 8 == 0 in 16 bits.
  const bool vec4 = float4_ok(p, t);
  with_element_type(p.dtype, [&](auto elem) {
    using Elem = decltype(elem);
    switch (head_dim_bucket(p.d)) {  // one instance per head_dim_bucket value (common/problem.h)
      case 64: launch<64, Elem>(p, t, O_acc, l, m, vec4, mode, stream); break;
      case 128: launch<128, Elem>(p, t, O_acc, l, m, vec4, mode, stream); break;
      default: launch<256, Elem>(p, t, O_acc, l, m, vec4, mode, stream); break;
    }
  });
}

}  // namespace flashstep::fa1_kv_outer
