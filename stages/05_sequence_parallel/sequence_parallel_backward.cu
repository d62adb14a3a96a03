// Stage 05's backward: FlashAttention-2's backward pass (Dao 2023, Algorithm
// 2) with its parallelism over K/V blocks (§3.2), fp32 on CUDA cores.
//
// Nothing N x N is ever stored. S and P are recomputed block by block from Q,
// K and the forward's logsumexp L (line 11: P = exp(S - L), no max and no sum
// needed, which is why the forward keeps L and nothing else). The loops are
// the forward's turned around: K/V blocks outside, Q blocks inside, because
// dK_j and dV_j sum over every query row while dQ_i sums over every key:
//
//   line 3    dQ = 0 in HBM                                  (cudaMemsetAsync)
//   line 4    D = rowsum(dO o O)                             (common/row_dot.cu)
//   line 5    for each K/V block j: ONE THREAD BLOCK (grid x), each head (grid y)
//   line 6-7    Kj, Vj -> shared memory; dK_j = dV_j = 0 in registers
//   line 8      for each Q block i that sees a key of block j
//   line 9        Qi, dOi, Li, Di -> shared memory
//   line 10,13    S_ij = Qi Kj^T,  dP_ij = dOi Vj^T           (registers)
//   line 11,14    P_ij = exp(S_ij - Li),  dS_ij = P_ij o (dP_ij - Di)
//   line 12,16    dV_j += P_ij^T dOi,  dK_j += dS_ij^T Qi    (registers)
//   line 15       dQ_i += dS_ij Kj                           (atomicAdd to HBM)
//   line 18     dK_j, dV_j -> HBM
//
// Why K/V blocks go to thread blocks: dK_j and dV_j then stay on chip for the
// whole inner loop and are written once, without races. The price is dQ: every
// K/V block adds into every dQ_i it sees, so the adds go to HBM (L2, in
// practice) as fp32 atomics, as in FlashAttention-2. Atomic adds land in
// whatever order the thread blocks reach them, so dQ's rounding can differ
// from run to run in its last bits (measured in the README); dK and dV are
// summed in a fixed order and are bit-identical.
//
// The softmax scale: S = scale Q K^T, so dQ = scale dS K and dK = scale dS^T Q.
// The kernel folds scale into dS once per score.
//
// Causal (bottom-right mask): Q blocks whose rows all come before key0 - (Nk -
// Nq) see nothing of block j and are skipped. Every key is seen by the last
// row, so every K/V block has work. Of the Q blocks visited, only those that
// do not see the whole K/V block (the diagonal, the ends Nq and Nk) test each
// score against the mask (FlashAttention-2 §3.1).
//
// Run it: ./build/stages/cli/flashstep --stage 02,05 --backward --N 4096
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "backward_tiles.h"
#include "common/cuda_check.h"
#include "common/launch.cuh"
#include "common/fa2_tiles.h"
#include "common/reduce.cuh"
#include "common/row_dot.h"
#include "common/tile_mask.h"
#include "sequence_parallel.h"

namespace flashstep::sequence_parallel {

namespace {

using bwd::kBr;
using bwd::kThreads;

// Floats in a float4: shared- and global-memory tile accesses are 16 bytes wide.
constexpr int kVec = 4;
// One float4 of padding per shared row: rows whose length is a multiple of 32
// floats would otherwise start in the same bank, and the 8 lanes of a
// quarter-warp reading 8 different rows would conflict.
constexpr int kPad = kVec;
// Dynamic shared memory an sm_80 block may opt into (163 KiB); sm_90 allows 227 KiB.
constexpr std::size_t kSm80MaxSmem = 166912;
// Lanes of a quarter-warp, the unit that a float4 shared-memory access serves
// at once: the thread layouts below give its 8 lanes 8 consecutive column
// groups of one row group, so they read one contiguous 128-byte row segment
// of one operand and the same address (a broadcast) of the other.
constexpr int kQuarterWarp = 8;
constexpr int kQuarters = kWarpSize / kQuarterWarp;

// Shared-memory tiles and thread layouts of one head-dimension bucket.
template <int kHeadDim>
struct Layout {
  static constexpr int kBc = bwd::block_keys(kHeadDim);
  static constexpr int kRowStride = kHeadDim + kPad;  // Kj, Vj, Qi, dOi: [rows][kRowStride]
  static constexpr int kScoreStride = kBc + kPad;     // P_ij, dS_ij: [kBr][kScoreStride]
  static constexpr int kScoreTStride = kBr + kPad;    // dS_ij^T: [kBc][kScoreTStride]
  static constexpr int kKVFloats = kBc * kRowStride;
  static constexpr int kQFloats = kBr * kRowStride;
  static constexpr int kScoreFloats = kBr * kScoreStride;
  static constexpr int kScoreTFloats = kBc * kScoreTStride;
  static constexpr std::size_t kSmemBytes =
      sizeof(float) * (2 * kKVFloats + 2 * kQFloats + 2 * kScoreFloats + kScoreTFloats + 2 * kBr);
  static_assert(kSmemBytes <= kSm80MaxSmem, "tiles must fit sm_80 shared memory");

  // Scores S_ij and dP_ij [kBr][kBc]: a 16 x 16 grid of threads, each owning
  // rows g.row + 16 t and columns g.col + 16 u (strided, so that a
  // quarter-warp's 8 column groups are 8 consecutive rows of Kj and Vj).
  static constexpr int kScoreGroups = 16;
  static constexpr int kSTM = kBr / kScoreGroups;
  static constexpr int kSTN = kBc / kScoreGroups;
  // dK_j and dV_j [kBc][kHeadDim]: each thread owns 4 consecutive keys (one
  // float4 of a P_ij or dS_ij row) and kKVVecs float4s of columns.
  static constexpr int kKVKeyGroups = kBc / kVec;
  static constexpr int kKVColGroups = kThreads / kKVKeyGroups;
  static constexpr int kKVVecs = kHeadDim / (kVec * kKVColGroups);
  // dQ_i's update [kBr][kHeadDim]: each thread owns kDqTM consecutive rows (a
  // float2 or float4s of a dS_ij^T row) and one float4 of columns.
  static constexpr int kDqColGroups = kHeadDim / kVec;
  static constexpr int kDqTM = kBr * kDqColGroups / kThreads;
  // Registers: up to d = 128 (64 keys at d = 64, 32 at d = 128: see
  // backward_tiles.h) a thread fits in 128 registers, so two blocks share an
  // SM (their shared memory fits too), at the price of a spill of 8-28 bytes
  // that L1 serves; one spill-free block per SM was slower at d = 64 on the
  // H200. d = 256 runs one block.
  static constexpr int kMinBlocksPerSM = kHeadDim <= 128 ? 2 : 1;

  static_assert(kScoreGroups * kScoreGroups == kThreads, "one score piece per thread");
  static_assert(kBr % kScoreGroups == 0 && kBc % kScoreGroups == 0, "scores split evenly");
  static_assert(kKVVecs >= 1 && kKVVecs * kVec * kKVColGroups == kHeadDim, "dK, dV split evenly");
  static_assert(kDqTM == 2 || kDqTM % kVec == 0, "dS^T rows load as a float2 or float4s");
  static_assert(kKVColGroups % kQuarterWarp == 0 && kDqColGroups % kQuarterWarp == 0 &&
                    kScoreGroups % kQuarterWarp == 0,
                "quarter-warps hold whole column groups");
};

// Kernel arguments.
struct Params {
  const float* Q;   // [B, H, Nq, d]
  const float* K;   // [B, H, Nk, d]
  const float* V;   // [B, H, Nk, d]
  const float* L;   // [B, H, Nq], the forward's logsumexp
  const float* dO;  // [B, H, Nq, d]
  const float* D;   // [B, H, Nq], rowsum(dO o O)
  float* dQ;        // [B, H, Nq, d], zeroed, accumulated with atomics
  float* dK;        // [B, H, Nk, d]
  float* dV;        // [B, H, Nk, d]
  std::int64_t heads;  // B * H
  int Nq, Nk, d;
  float scale;       // softmax scale
  float scale_log2;  // softmax scale * log2(e)
  bool causal;
  bool vec;  // float4 global tile accesses: d % 4 == 0 and 16-byte aligned tensors
};

// Where a thread sits in a grid of column groups x row groups whose column
// groups come in runs of kQuarterWarp lanes (see kQuarterWarp).
template <int kColGroups>
struct GridPlace {
  int col, row;
  __device__ GridPlace() {
    constexpr int kWarpsAcross = kColGroups / kQuarterWarp;
    const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
    const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
    col = lane % kQuarterWarp + kQuarterWarp * (warp % kWarpsAcross);
    row = lane / kQuarterWarp + kQuarters * (warp / kWarpsAcross);
  }
};

template <int kN>
__device__ void load_n(const float* src, float (&dst)[kN]) {
  if constexpr (kN % kVec == 0) {
#pragma unroll
    for (int n = 0; n < kN; n += kVec) {
      const float4 v = *reinterpret_cast<const float4*>(src + n);
      dst[n] = v.x;
      dst[n + 1] = v.y;
      dst[n + 2] = v.z;
      dst[n + 3] = v.w;
    }
  } else {
    static_assert(kN == 2, "float2 or float4s");
    const float2 v = *reinterpret_cast<const float2*>(src);
    dst[0] = v.x;
    dst[1] = v.y;
  }
}

// Global -> shared: the first `rows` rows and `d` columns of src [rows, d]
// into dst [kRows][kHeadDim + kPad]; the padding rows and columns get zeros,
// so they add nothing to any product.
template <int kRows, int kHeadDim>
__device__ void load_rows(const float* src, int rows, int d, bool vec, float* dst) {
  constexpr int kVecsPerRow = kHeadDim / kVec;
  constexpr int kStride = kHeadDim + kPad;
  static_assert(kRows * kVecsPerRow % kThreads == 0, "every thread loads the same count");
#pragma unroll
  for (int e = static_cast<int>(threadIdx.x); e < kRows * kVecsPerRow; e += kThreads) {
    const int r = e / kVecsPerRow;
    const int k = kVec * (e % kVecsPerRow);
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r < rows) {
      const float* from = src + r * d + k;
      if (vec) {
        if (k < d) v = *reinterpret_cast<const float4*>(from);
      } else {
        v.x = k < d ? from[0] : 0.0f;
        v.y = k + 1 < d ? from[1] : 0.0f;
        v.z = k + 2 < d ? from[2] : 0.0f;
        v.w = k + 3 < d ? from[3] : 0.0f;
      }
    }
    *reinterpret_cast<float4*>(dst + r * kStride + k) = v;
  }
}

// Keys of the block starting at key0 that query row r sees (<= 0: none).
// 64-bit: r + Nk can pass 2^31.
__device__ int visible_in_block(const Params& p, std::int64_t r, int key0) {
  std::int64_t limit = p.Nk;
  if (p.causal) limit = min(limit, max(std::int64_t{0}, r + p.Nk - p.Nq + 1));
  return static_cast<int>(limit - key0);
}

// The first Q block with a row that sees key0 (the bottom-right mask: row r
// sees key0 iff r >= key0 - (Nk - Nq), and the last row, Nq - 1, sees every key).
__device__ int first_q_block(const Params& p, int key0) {
  if (!p.causal) return 0;
  return static_cast<int>(max(std::int64_t{0}, std::int64_t{key0} - p.Nk + p.Nq) / kBr);
}

// Lines 10 and 13: S_ij = Qi Kj^T and dP_ij = dOi Vj^T for the thread's
// kSTM x kSTN piece, in one pass over k (the two products share no operand,
// but interleaving them keeps twice the independent FMAs in flight).
template <int kHeadDim>
__device__ void multiply_scores(const float* Qi, const float* dOi, const float* Kj,
                                const float* Vj, const GridPlace<Layout<kHeadDim>::kScoreGroups>& g,
                                float (&S)[Layout<kHeadDim>::kSTM][Layout<kHeadDim>::kSTN],
                                float (&dP)[Layout<kHeadDim>::kSTM][Layout<kHeadDim>::kSTN]) {
  using Lay = Layout<kHeadDim>;
#pragma unroll
  for (int t = 0; t < Lay::kSTM; ++t) {
#pragma unroll
    for (int u = 0; u < Lay::kSTN; ++u) S[t][u] = dP[t][u] = 0.0f;
  }
#pragma unroll 2
  for (int k = 0; k < kHeadDim; k += kVec) {
    float q[Lay::kSTM][kVec], o[Lay::kSTM][kVec];
#pragma unroll
    for (int t = 0; t < Lay::kSTM; ++t) {
      load_n(Qi + (g.row + Lay::kScoreGroups * t) * Lay::kRowStride + k, q[t]);
      load_n(dOi + (g.row + Lay::kScoreGroups * t) * Lay::kRowStride + k, o[t]);
    }
#pragma unroll
    for (int u = 0; u < Lay::kSTN; ++u) {
      float kk[kVec], vv[kVec];
      load_n(Kj + (g.col + Lay::kScoreGroups * u) * Lay::kRowStride + k, kk);
      load_n(Vj + (g.col + Lay::kScoreGroups * u) * Lay::kRowStride + k, vv);
#pragma unroll
      for (int t = 0; t < Lay::kSTM; ++t) {
#pragma unroll
        for (int x = 0; x < kVec; ++x) {
          S[t][u] = fmaf(q[t][x], kk[x], S[t][u]);
          dP[t][u] = fmaf(o[t][x], vv[x], dP[t][u]);
        }
      }
    }
  }
}

// Score (r, c) of the tile to shared memory: P_rc to P [kBr][kScoreStride],
// dS_rc to dS [kBr][kScoreStride] and to its transpose dST [kBc][kScoreTStride].
template <int kHeadDim>
__device__ void store_scores(float* P, float* dS, float* dST, int r, int c, float P_rc,
                             float dS_rc) {
  using Lay = Layout<kHeadDim>;
  P[r * Lay::kScoreStride + c] = P_rc;
  dS[r * Lay::kScoreStride + c] = dS_rc;
  dST[c * Lay::kScoreTStride + r] = dS_rc;
}

// Lines 12 and 16: dV_j += P_ij^T dOi and dK_j += dS_ij^T Qi for the thread's
// 4 keys x kKVVecs float4s of columns: per query row r, one float4 of P_ij
// (dS_ij) times the row's float4s of dOi (Qi).
template <int kHeadDim>
__device__ void accumulate_kv(const float* P, const float* dS, const float* Qi, const float* dOi,
                              int key, int col,
                              float (&dV_j)[kVec][Layout<kHeadDim>::kKVVecs * kVec],
                              float (&dK_j)[kVec][Layout<kHeadDim>::kKVVecs * kVec]) {
  using Lay = Layout<kHeadDim>;
#pragma unroll 2
  for (int r = 0; r < kBr; ++r) {
    float pr[kVec], sr[kVec];
    load_n(P + r * Lay::kScoreStride + key, pr);
    load_n(dS + r * Lay::kScoreStride + key, sr);
#pragma unroll
    for (int q = 0; q < Lay::kKVVecs; ++q) {
      const int k = kVec * (col + Lay::kKVColGroups * q);
      float o[kVec], x_q[kVec];
      load_n(dOi + r * Lay::kRowStride + k, o);
      load_n(Qi + r * Lay::kRowStride + k, x_q);
#pragma unroll
      for (int a = 0; a < kVec; ++a) {
#pragma unroll
        for (int x = 0; x < kVec; ++x) {
          dV_j[a][q * kVec + x] = fmaf(pr[a], o[x], dV_j[a][q * kVec + x]);
          dK_j[a][q * kVec + x] = fmaf(sr[a], x_q[x], dK_j[a][q * kVec + x]);
        }
      }
    }
  }
}

// Line 15: dQ_i += dS_ij Kj for the thread's kDqTM rows x one float4 of
// columns, summed on chip over the block's keys and then added to HBM with
// one atomic per element.
template <int kHeadDim>
__device__ void update_dq(const float* dST, const float* Kj, float* dQi, int rows, int d) {
  using Lay = Layout<kHeadDim>;
  const GridPlace<Lay::kDqColGroups> g;
  const int r0 = Lay::kDqTM * g.row;
  const int k0 = kVec * g.col;
  float acc[Lay::kDqTM][kVec] = {};
#pragma unroll 4
  for (int c = 0; c < Lay::kBc; ++c) {
    float s[Lay::kDqTM], kk[kVec];
    load_n(dST + c * Lay::kScoreTStride + r0, s);
    load_n(Kj + c * Lay::kRowStride + k0, kk);
#pragma unroll
    for (int t = 0; t < Lay::kDqTM; ++t) {
#pragma unroll
      for (int x = 0; x < kVec; ++x) acc[t][x] = fmaf(s[t], kk[x], acc[t][x]);
    }
  }
#pragma unroll
  for (int t = 0; t < Lay::kDqTM; ++t) {
    if (r0 + t >= rows) continue;
#pragma unroll
    for (int x = 0; x < kVec; ++x) {
      if (k0 + x < d) atomicAdd(dQi + (r0 + t) * d + k0 + x, acc[t][x]);
    }
  }
}

// Line 18: the thread's 4 keys x kKVVecs float4s of dK_j (or dV_j) to HBM.
template <int kHeadDim>
__device__ void store_kv(const float (&acc)[kVec][Layout<kHeadDim>::kKVVecs * kVec], int key,
                         int col, float* dst, int keys, int d, bool vec) {
  using Lay = Layout<kHeadDim>;
#pragma unroll
  for (int a = 0; a < kVec; ++a) {
    if (key + a >= keys) continue;
#pragma unroll
    for (int q = 0; q < Lay::kKVVecs; ++q) {
      const int k = kVec * (col + Lay::kKVColGroups * q);
      const float* v = &acc[a][q * kVec];
      float* to = dst + (key + a) * d + k;
      if (vec) {
        if (k < d) *reinterpret_cast<float4*>(to) = make_float4(v[0], v[1], v[2], v[3]);
      } else {
#pragma unroll
        for (int x = 0; x < kVec; ++x) {
          if (k + x < d) to[x] = v[x];
        }
      }
    }
  }
}

// Lines 6-18 for K/V block j of head bh: the whole life of one K/V block.
// Contains barriers (uniform control flow).
template <int kHeadDim>
__device__ void attend_kv_block(const Params& p, std::int64_t bh, int j, float* smem) {
  using Lay = Layout<kHeadDim>;
  float* Kj = smem;                        // [kBc][kRowStride]
  float* Vj = Kj + Lay::kKVFloats;         // [kBc][kRowStride]
  float* Qi = Vj + Lay::kKVFloats;         // [kBr][kRowStride]
  float* dOi = Qi + Lay::kQFloats;         // [kBr][kRowStride]
  float* P = dOi + Lay::kQFloats;          // [kBr][kScoreStride]: P_ij
  float* dS = P + Lay::kScoreFloats;       // [kBr][kScoreStride]: scale * dS_ij
  float* dST = dS + Lay::kScoreFloats;     // [kBc][kScoreTStride]: its transpose
  float* L_log2 = dST + Lay::kScoreTFloats;  // [kBr]: Li in log2 units
  float* Di = L_log2 + kBr;                // [kBr]

  const int key0 = j * Lay::kBc;
  const int keys = min(Lay::kBc, p.Nk - key0);
  const int Tr = (p.Nq - 1) / kBr + 1;  // not (Nq + Br - 1) / Br: Nq may be near 2^31
  const int i_first = first_q_block(p, key0);
  const std::int64_t kv_offset = (bh * p.Nk + key0) * p.d;
  const GridPlace<Lay::kKVColGroups> kv_place;
  const int key = kVec * kv_place.row;  // first of the thread's 4 keys of dK_j, dV_j

  // Line 6.
  load_rows<Lay::kBc, kHeadDim>(p.K + kv_offset, keys, p.d, p.vec, Kj);
  load_rows<Lay::kBc, kHeadDim>(p.V + kv_offset, keys, p.d, p.vec, Vj);
  // Line 7, in registers.
  float dK_j[kVec][Lay::kKVVecs * kVec] = {};
  float dV_j[kVec][Lay::kKVVecs * kVec] = {};
  const GridPlace<Lay::kScoreGroups> g;
  for (int i = i_first; i < Tr; ++i) {  // line 8
    const int row0 = i * kBr;
    const int rows = min(kBr, p.Nq - row0);
    const std::int64_t q_offset = (bh * p.Nq + row0) * p.d;
    // Line 9 (Oi is not needed: D already holds rowsum(dO o O)).
    load_rows<kBr, kHeadDim>(p.Q + q_offset, rows, p.d, p.vec, Qi);
    load_rows<kBr, kHeadDim>(p.dO + q_offset, rows, p.d, p.vec, dOi);
    for (int r = static_cast<int>(threadIdx.x); r < rows; r += kThreads) {
      L_log2[r] = p.L[bh * p.Nq + row0 + r] * static_cast<float>(fa2::kLog2e);
      Di[r] = p.D[bh * p.Nq + row0 + r];
    }
    __syncthreads();

    // Lines 10 and 13.
    float S[Lay::kSTM][Lay::kSTN], dP[Lay::kSTM][Lay::kSTN];
    multiply_scores<kHeadDim>(Qi, dOi, Kj, Vj, g, S, dP);
    // Lines 11 and 14, scale folded into dS. Masked scores, padding rows
    // and padding keys get P = 0 and so dS = 0 (a row that sees no key at
    // all has L = -inf, and is masked everywhere). Only a tile whose rows do
    // not all see its keys whole tests each score (common/tile_mask.h): the
    // tiles on the diagonal and at the ends Nq, Nk.
    const bool whole =
        tile_mask({p.Nq, p.Nk, p.causal}, row0, kBr, key0, Lay::kBc) == TileMask::kNone;
    // BEGIN ASSIGNMENT(backward): lines 11 and 14 for the thread's scores S[t][u], dP[t][u] (row r = g.row + 16 t, key c = g.col + 16 u): P_rc = exp2f(S scale_log2 - L_log2[r]) where c < visible_in_block(p, row0 + r, key0) and r < rows, else 0 (the test may be left out in a `whole` tile); dS_rc = P_rc (dP - Di[r]) scale (Di only for r < rows); store_scores P_rc and dS_rc
    if (whole) {
#pragma unroll
      for (int t = 0; t < Lay::kSTM; ++t) {
        const int r = g.row + Lay::kScoreGroups * t;
#pragma unroll
        for (int u = 0; u < Lay::kSTN; ++u) {
          const int c = g.col + Lay::kScoreGroups * u;
          const float P_rc = exp2f(S[t][u] * p.scale_log2 - L_log2[r]);
          store_scores<kHeadDim>(P, dS, dST, r, c, P_rc, P_rc * (dP[t][u] - Di[r]) * p.scale);
        }
      }
    } else {
#pragma unroll
      for (int t = 0; t < Lay::kSTM; ++t) {
        const int r = g.row + Lay::kScoreGroups * t;
        const int visible = r < rows ? visible_in_block(p, std::int64_t{row0} + r, key0) : 0;
#pragma unroll
        for (int u = 0; u < Lay::kSTN; ++u) {
          const int c = g.col + Lay::kScoreGroups * u;
          const float P_rc = c < visible ? exp2f(S[t][u] * p.scale_log2 - L_log2[r]) : 0.0f;
          const float dS_rc = P_rc * (dP[t][u] - (r < rows ? Di[r] : 0.0f)) * p.scale;
          store_scores<kHeadDim>(P, dS, dST, r, c, P_rc, dS_rc);
        }
      }
    }
    // END ASSIGNMENT
    __syncthreads();  // P_ij, dS_ij and dS_ij^T complete

    // Lines 12 and 16.
    accumulate_kv<kHeadDim>(P, dS, Qi, dOi, key, kv_place.col, dV_j, dK_j);
    // Line 15.
    update_dq<kHeadDim>(dST, Kj, p.dQ + q_offset, rows, p.d);
    __syncthreads();  // every read of Qi, dOi, P_ij, dS_ij done before the next i
  }
  // Line 18.
  store_kv<kHeadDim>(dK_j, key, kv_place.col, p.dK + kv_offset, keys, p.d, p.vec);
  store_kv<kHeadDim>(dV_j, key, kv_place.col, p.dV + kv_offset, keys, p.d, p.vec);
}

// One thread block per (K/V block, head): line 5's loop over j is the grid's x.
template <int kHeadDim>
__global__ void __launch_bounds__(kThreads, Layout<kHeadDim>::kMinBlocksPerSM)
    backward_kernel(const Params p) {
  extern __shared__ float4 smem_vec[];  // float4: 16-byte alignment for float4 tile accesses
  float* smem = reinterpret_cast<float*>(smem_vec);
  for (std::int64_t bh = blockIdx.y; bh < p.heads; bh += gridDim.y) {
    attend_kv_block<kHeadDim>(p, bh, static_cast<int>(blockIdx.x), smem);
    __syncthreads();  // the next head's Kj, Vj overwrite this one's
  }
}

template <int kHeadDim>
void launch(const Params& prm, Stream stream) {
  // Grid x: Tc <= ceil((2^31 - 1) / 32) K/V blocks, inside x's 2^31 - 1.
  const std::int64_t Tc = (prm.Nk - 1) / Layout<kHeadDim>::kBc + 1;
  const dim3 grid(static_cast<unsigned>(Tc),
                  static_cast<unsigned>(std::min(prm.heads, bwd::kMaxGridY)));
  launch_with_smem(backward_kernel<kHeadDim>, grid, kThreads, Layout<kHeadDim>::kSmemBytes,
                   stream, "stage 05 backward_kernel", prm);
}

bool aligned16(const void* ptr) {
  constexpr std::uintptr_t kFloat4Bytes = 16;
  return reinterpret_cast<std::uintptr_t>(ptr) % kFloat4Bytes == 0;
}

}  // namespace

void backward(const Problem& p, const BackwardTensors& t, Stream stream) {
  validate(p);
  if (!t.Q || !t.K || !t.V || !t.O || !t.L || !t.dO || !t.dQ || !t.dK || !t.dV || !t.workspace) {
    throw Error("stage 05 backward: null tensor pointer");
  }
  float* D = static_cast<float*>(t.workspace);  // [B, H, Nq]
  // fp32 only (backward_dtypes): every tensor is float.
  const auto* dO = static_cast<const float*>(t.dO);  // [B, H, Nq, d]
  cuda_check(cudaMemsetAsync(t.dQ, 0, static_cast<std::size_t>(p.q_elems() * kFloatBytes), stream),
             "stage 05 backward: zero dQ");                        // line 3
  launch_row_dot(p, dO, static_cast<const float*>(t.O), D, stream);  // line 4
  Params prm{};
  prm.Q = static_cast<const float*>(t.Q);
  prm.K = static_cast<const float*>(t.K);
  prm.V = static_cast<const float*>(t.V);
  prm.L = t.L;
  prm.dO = dO;
  prm.D = D;
  prm.dQ = static_cast<float*>(t.dQ);
  prm.dK = static_cast<float*>(t.dK);
  prm.dV = static_cast<float*>(t.dV);
  prm.heads = p.heads();
  prm.Nq = static_cast<int>(p.Nq);
  prm.Nk = static_cast<int>(p.Nk);
  prm.d = static_cast<int>(p.d);
  prm.scale = static_cast<float>(p.softmax_scale());
  prm.scale_log2 = static_cast<float>(p.softmax_scale() * fa2::kLog2e);
  prm.causal = p.causal;
  prm.vec = p.d % kVec == 0 && aligned16(t.Q) && aligned16(t.K) && aligned16(t.V) &&
            aligned16(t.dO) && aligned16(t.dK) && aligned16(t.dV);
  switch (head_dim_bucket(p.d)) {
    case 64: launch<64>(prm, stream); break;
    case 128: launch<128>(prm, stream); break;
    default: launch<256>(prm, stream); break;
  }
}

}  // namespace flashstep::sequence_parallel
