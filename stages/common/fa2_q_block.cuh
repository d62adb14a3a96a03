/// \file fa2_q_block.cuh
/// \brief The FlashAttention-2 forward body of one Q block (Dao 2023,
/// Algorithm 1, lines 4-15), shared by stage 04 (one thread block walks all Q
/// blocks of a head) and stage 05 (one thread block per Q block). Device code:
/// include it from .cu files only. Each stage keeps its own __global__ kernel
/// and launcher; this header holds the kernel arguments (Params), the
/// shared-memory layout (Layout<kHeadDim>), the tile load/product helpers and
/// attend_q_block.
///
/// Work partitioning inside a thread block: 256 threads tile the 64 x 64
/// scores S_ij and the 64 x d output O~_i:
///
///             S_ij, P~_ij columns (keys):  c = cg + 16 * cc,  cc = 0..3
///             O~_i columns:                4 * (cg + 16 * q) + 0..3
///                 cg 0 .. 7      cg 8 .. 15
///   rows  0-15    warp 0         warp 1        thread (rg, cg) owns rows
///   rows 16-31    warp 2         warp 3        4 rg .. 4 rg + 3 of S_ij,
///   rows 32-47    warp 4         warp 5        P~_ij and O~_i, so it rescales
///   rows 48-63    warp 6         warp 7        its own O~ rows with no traffic.
///   inside a warp: lane = 8 * (rg % 4) + (cg % 8)
///
/// A row's 64 scores are spread over 16 threads in two warps: the row max goes
/// through warp shuffles and then a small shared array between the two warps.
/// Each thread keeps its own share of l_i, scaled by the same e^(m_old - m_new)
/// as every other share of the row, and the shares are added once at the end.
///
/// Everything here is a template or inline, so two .cu files may include it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fa2_tiles.h"
#include "reduce.cuh"
#include "stage.h"
#include "tile_mask.h"

namespace flashstep::fa2 {

// Floats in a float4: shared- and global-memory accesses are 16 bytes wide.
inline constexpr int kVec = 4;
// Thread layout over the Br x Bc scores (drawn above).
inline constexpr int kRowGroups = 16;
inline constexpr int kColGroups = kThreads / kRowGroups;
inline constexpr int kTM = kBr / kRowGroups;  // rows of S_ij, P~_ij and O~_i per thread
inline constexpr int kTN = kBc / kColGroups;  // columns of S_ij per thread
// A warp holds 4 row groups x 8 column groups: a warp-wide float4 read then
// asks for 4 distinct Qi (or P~) float4s or 8 distinct Kj (or Vj) float4s,
// one 128-byte shared-memory wavefront either way (the rest are broadcasts),
// which leaves the FMA pipe as the limit.
inline constexpr int kWarpColGroups = 8;
inline constexpr int kWarpRowGroups = kWarpSize / kWarpColGroups;
inline constexpr int kRowSplit = kColGroups / kWarpColGroups;  // warps sharing one row
static_assert(kRowGroups * kColGroups == kThreads, "every thread owns one tile piece");
static_assert(kBr % kRowGroups == 0 && kBc % kColGroups == 0, "tiles split evenly");
static_assert(kTM == kVec, "a thread reads its rows of P~_ij^T as one float4");
static_assert(kRowGroups % kWarpRowGroups == 0 && kColGroups % kWarpColGroups == 0,
              "warps tile the thread grid");
static_assert(kBr == kBc, "Qi and Kj/Vj share the register staging");
// One float4 of padding per shared row: consecutive rows start in consecutive
// 16-byte bank groups, so a warp's float4 reads of 8 rows are conflict-free,
// and rows stay 16-byte aligned.
inline constexpr int kPad = kVec;
// Dynamic shared memory an sm_80 block may opt into (163 KiB); sm_90 allows 227 KiB.
inline constexpr std::size_t kSm80MaxSmem = 166912;

// ln(2) in the kernel's precision.
inline constexpr float kLn2F = static_cast<float>(kLn2);

// Shared-memory tiles of one head-dimension bucket. The head dimension d is
// zero-padded up to kHeadDim inside the tiles.
template <int kHeadDim>
struct Layout {
  static_assert(kHeadDim % (kVec * kColGroups) == 0, "each thread owns whole float4s of O~");
  static constexpr int kQStride = kBr + kPad;        // QiT  [kHeadDim][kQStride], Qi transposed
  static constexpr int kKVStride = kHeadDim + kPad;  // KVj  [kBc][kKVStride], Kj then Vj
  static constexpr int kPStride = kBr + kPad;        // PT   [kBc][kPStride], P~_ij transposed
  static constexpr int kQFloats = kHeadDim * kQStride;
  static constexpr int kKVFloats = kBc * kKVStride;
  static constexpr int kPFloats = kBc * kPStride;
  static constexpr int kExchangeFloats = kRowSplit * kBr;  // [kRowSplit][kBr] row partials
  static constexpr std::size_t kSmemBytes =
      sizeof(float) * (kQFloats + kKVFloats + kPFloats + kExchangeFloats);
  // Kj and Vj share one buffer (Vj is stored once S_ij no longer needs Kj):
  // with separate buffers kHeadDim = 256 would not fit an sm_80 block.
  static_assert(kSmemBytes <= kSm80MaxSmem, "tiles must fit sm_80 shared memory");
  static constexpr int kOVecs = kHeadDim / (kVec * kColGroups);  // float4s of an O~ row per thread
  static constexpr int kOCols = kOVecs * kVec;
  // Floats of one 64 x kHeadDim tile each thread stages in registers on the
  // way from HBM to shared memory.
  static constexpr int kStaged = kBc * kHeadDim / kThreads;
  static_assert(kStaged % kVec == 0, "the staging holds whole float4s");
  // Registers: the next tile's loads stay in flight during the current tile's
  // products when a thread can hold the staged tile beside O~_i. At
  // kHeadDim = 256 (64 + 64 floats, plus S_ij and operands) that passes the
  // 255-register limit and spills, so there each tile is loaded just before
  // it is stored, without overlap.
  static constexpr bool kPrefetch = kHeadDim <= 128;
  // Registers again: at kHeadDim = 64 a thread fits in 128 of them, so two
  // blocks share an SM (2 x 256 x 128 = the SM's 64K registers), which matters
  // when there are more thread blocks than SMs (stage 04: B * H of them;
  // stage 05: Tr * B * H). Larger buckets hold twice the O~ and run one block
  // per SM.
  static constexpr int kMinBlocksPerSM = kHeadDim <= 64 ? 2 : 1;
};

// Kernel arguments.
struct Params {
  const float* Q;  // [B, H, Nq, d]
  const float* K;  // [B, H_kv, Nk, d]
  const float* V;  // [B, H_kv, Nk, d]
  float* O;        // [B, H, Nq, d]
  float* L;        // [B, H, Nq]
  std::int64_t heads;  // B * H
  std::int64_t H, H_kv;  // query heads and K/V heads per batch: head bh reads kv_head_of(bh, H, H_kv)
  int Nq, Nk, d;
  float scale_log2;  // softmax scale * log2(e)
  bool causal;
  bool vec;  // float4 global accesses: d % 4 == 0 and 16-byte aligned tensors
  CausalMode mode;  // kFast, or a benchmark's ablation (common/tile_mask.h)
};

// The kernel parameters of problem p on tensors t (host side; stages 04, 05
// and 06). These stages run in fp32 only (Stage::dtypes): Q, K, V, O are float.
inline Params make_params(const Problem& p, const ForwardTensors& t,
                          CausalMode mode = CausalMode::kFast) {
  Params prm{};
  prm.Q = static_cast<const float*>(t.Q);
  prm.K = static_cast<const float*>(t.K);
  prm.V = static_cast<const float*>(t.V);
  prm.O = static_cast<float*>(t.O);
  prm.L = t.L;
  prm.heads = p.heads();
  prm.H = p.H;
  prm.H_kv = p.kv_heads();
  prm.Nq = static_cast<int>(p.Nq);
  prm.Nk = static_cast<int>(p.Nk);
  prm.d = static_cast<int>(p.d);
  prm.scale_log2 = static_cast<float>(p.softmax_scale() * kLog2e);
  prm.causal = p.causal;
  prm.vec = float4_ok(p, t);
  prm.mode = mode;
  return prm;
}

// The piece of the Br x Bc scores and of O~_i that the calling thread owns.
struct Owner {
  int row;      // first of its kTM rows in the Q block
  int col;      // its column group cg
  int half;     // which of the kRowSplit warps sharing its rows it sits in
  bool leader;  // the lane that publishes its warp's per-row values
};

inline __device__ Owner owner() {
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int half = warp % kRowSplit;
  const int rg = (warp / kRowSplit) * kWarpRowGroups + lane / kWarpColGroups;
  const int cg = half * kWarpColGroups + lane % kWarpColGroups;
  return {kTM * rg, cg, half, lane % kWarpColGroups == 0};
}

inline __device__ void load4(const float* src, float (&dst)[kVec]) {
  const float4 v = *reinterpret_cast<const float4*>(src);
  dst[0] = v.x;
  dst[1] = v.y;
  dst[2] = v.z;
  dst[3] = v.w;
}

// Keys of the K/V block starting at key0 that query row r sees: the mask is
// "local column < this". It is <= 0 for a row that sees none of the block.
// 64-bit: r (a padding row past Nq included) plus Nk can pass 2^31.
inline __device__ int visible_in_block(const Params& p, std::int64_t r, int key0) {
  std::int64_t limit = p.Nk;
  if (p.causal) limit = min(limit, max(std::int64_t{0}, r + p.Nk - p.Nq + 1));
  return static_cast<int>(limit - key0);
}

// K/V blocks a Q block whose last row is last_row visits: those holding a key
// that row sees (with the bottom-right mask the last row sees the most); every
// K/V block when skipping is off (CausalMode::kNoSkip).
inline __device__ int kv_blocks_seen_by(const Params& p, int last_row) {
  if (p.mode == CausalMode::kNoSkip) return (p.Nk - 1) / kBc + 1;
  const int keys = visible_in_block(p, last_row, 0);
  return keys <= 0 ? 0 : (keys - 1) / kBc + 1;
}

// K/V blocks of bc keys, from the first, that every row of the br rows from
// row0 sees whole (tile_mask kNone, common/tile_mask.h; a row past Nq sees
// nothing): their scores need no mask test. The blocks after them cross the
// diagonal or the end Nk, or lie above the diagonal (visited only with
// kNoSkip). None when every visited block is to be tested (kMaskEvery).
inline __device__ int kv_blocks_unmasked(const Params& p, int row0, int br, int bc) {
  if (p.mode == CausalMode::kMaskEvery) return 0;
  return static_cast<int>(unmasked_kv_tiles({p.Nq, p.Nk, p.causal}, row0, br, bc));
}

// Which elements of a 64 x kHeadDim tile a thread stages, kWidth floats at a
// time (a float4, or one float when d is not a multiple of 4): columns k0 ..
// k0 + kWidth - 1 of rows r0, r0 + kStep, r0 + 2 kStep, ... Consecutive
// threads take consecutive columns, so a warp's global loads are contiguous.
template <int kHeadDim, int kWidth>
struct StagePlace {
  static constexpr int kPerRow = kHeadDim / kWidth;  // threads across one row
  static_assert(kThreads % kPerRow == 0, "a thread keeps the same columns in every row");
  static constexpr int kStep = kThreads / kPerRow;
  static constexpr int kCount = Layout<kHeadDim>::kStaged / kWidth;
  int k0 = kWidth * (static_cast<int>(threadIdx.x) % kPerRow);
  int r0 = static_cast<int>(threadIdx.x) / kPerRow;
};

// Global -> registers: this thread's share of a 64 x kHeadDim tile whose first
// `rows` rows and `d` columns are src [rows, d]; the rest is zero.
template <int kHeadDim>
__device__ void load_tile(const float* src, int rows, int d, bool vec,
                          float (&staged)[Layout<kHeadDim>::kStaged]) {
  if (vec) {
    using At = StagePlace<kHeadDim, kVec>;
    const At at;
    const float* from = src + at.r0 * d + at.k0;
#pragma unroll
    for (int n = 0; n < At::kCount; ++n, from += At::kStep * d) {
      float v[kVec] = {};
      if (at.r0 + n * At::kStep < rows && at.k0 < d) load4(from, v);
#pragma unroll
      for (int x = 0; x < kVec; ++x) staged[n * kVec + x] = v[x];
    }
  } else {
    using At = StagePlace<kHeadDim, 1>;
    const At at;
    const float* from = src + at.r0 * d + at.k0;
#pragma unroll
    for (int n = 0; n < At::kCount; ++n, from += At::kStep * d) {
      staged[n] = at.r0 + n * At::kStep < rows && at.k0 < d ? *from : 0.0f;
    }
  }
}

// Registers -> shared, row-major: dst [64][kHeadDim + kPad] (Kj or Vj).
template <int kHeadDim>
__device__ void store_tile(const float (&staged)[Layout<kHeadDim>::kStaged], bool vec,
                           float* dst) {
  constexpr int kStride = Layout<kHeadDim>::kKVStride;
  if (vec) {
    using At = StagePlace<kHeadDim, kVec>;
    const At at;
    float* to = dst + at.r0 * kStride + at.k0;
#pragma unroll
    for (int n = 0; n < At::kCount; ++n) {
      *reinterpret_cast<float4*>(to + n * At::kStep * kStride) =
          make_float4(staged[n * kVec], staged[n * kVec + 1], staged[n * kVec + 2],
                      staged[n * kVec + 3]);
    }
  } else {
    using At = StagePlace<kHeadDim, 1>;
    const At at;
    float* to = dst + at.r0 * kStride + at.k0;
#pragma unroll
    for (int n = 0; n < At::kCount; ++n) to[n * At::kStep * kStride] = staged[n];
  }
}

// Registers -> shared, transposed: dst [kHeadDim][64 + kPad] (Qi^T), so that a
// thread reads its 4 rows at one k as one float4. Done once per Q block; the
// bank conflicts of this scatter are paid once against Tc tiles of work.
template <int kHeadDim>
__device__ void store_tile_transposed(const float (&staged)[Layout<kHeadDim>::kStaged],
                                      bool vec, float* dst) {
  constexpr int kStride = Layout<kHeadDim>::kQStride;
  if (vec) {
    using At = StagePlace<kHeadDim, kVec>;
    const At at;
    float* to = dst + at.k0 * kStride + at.r0;
#pragma unroll
    for (int n = 0; n < At::kCount; ++n) {
#pragma unroll
      for (int x = 0; x < kVec; ++x) to[x * kStride + n * At::kStep] = staged[n * kVec + x];
    }
  } else {
    using At = StagePlace<kHeadDim, 1>;
    const At at;
    float* to = dst + at.k0 * kStride + at.r0;
#pragma unroll
    for (int n = 0; n < At::kCount; ++n) to[n * At::kStep] = staged[n];
  }
}

// Line 8: S_ij = Qi Kj^T for the thread's kTM x kTN piece (unscaled), over the
// zero-padded head dimension. Per 4 k: 8 float4 reads feed 64 FMAs. Unrolled
// 8 steps deep: enough loads in flight, and (nvcc 13) a full unroll at
// kHeadDim = 256 splits the float4 reads into 4x as many scalar ones.
template <int kHeadDim>
__device__ void multiply_qk(const float* QiT, const float* Kj, const Owner& me,
                            float (&S_ij)[kTM][kTN]) {
  using Lay = Layout<kHeadDim>;
#pragma unroll
  for (int rr = 0; rr < kTM; ++rr) {
#pragma unroll
    for (int cc = 0; cc < kTN; ++cc) S_ij[rr][cc] = 0.0f;
  }
#pragma unroll 8
  for (int k = 0; k < kHeadDim; k += kVec) {
    float kv[kTN][kVec];
#pragma unroll
    for (int cc = 0; cc < kTN; ++cc) {
      load4(Kj + (me.col + kColGroups * cc) * Lay::kKVStride + k, kv[cc]);
    }
#pragma unroll
    for (int kk = 0; kk < kVec; ++kk) {
      float q[kTM];
      load4(QiT + (k + kk) * Lay::kQStride + me.row, q);
#pragma unroll
      for (int rr = 0; rr < kTM; ++rr) {
#pragma unroll
        for (int cc = 0; cc < kTN; ++cc) S_ij[rr][cc] = fmaf(q[rr], kv[cc][kk], S_ij[rr][cc]);
      }
    }
  }
}

// The P~_ij V_j half of line 10 for the thread's kTM rows and kOCols columns.
// Per key: one float4 of P~ and kOVecs float4s of Vj feed 16 * kOVecs FMAs.
template <int kHeadDim>
__device__ void accumulate_pv(const float* PT, const float* Vj, const Owner& me,
                              float (&O_tilde)[kTM][Layout<kHeadDim>::kOCols]) {
  using Lay = Layout<kHeadDim>;
#pragma unroll 8
  for (int c = 0; c < kBc; ++c) {
    float p[kTM];
    load4(PT + c * Lay::kPStride + me.row, p);
#pragma unroll
    for (int q = 0; q < Lay::kOVecs; ++q) {
      float v[kVec];
      load4(Vj + c * Lay::kKVStride + kVec * (me.col + kColGroups * q), v);
#pragma unroll
      for (int rr = 0; rr < kTM; ++rr) {
#pragma unroll
        for (int x = 0; x < kVec; ++x) {
          O_tilde[rr][q * kVec + x] = fmaf(p[rr], v[x], O_tilde[rr][q * kVec + x]);
        }
      }
    }
  }
}

// Combines, for each of the thread's kTM rows, the values of the 16 threads
// that share the row: shuffles over the warp's 8 column lanes, then the
// kRowSplit warps meet in `exchange` [kRowSplit][kBr]. Every thread gets the
// result. Contains a barrier, so every thread of the block must call it.
template <typename Op>
__device__ void reduce_rows(float (&v)[kTM], Op op, float* exchange, const Owner& me) {
#pragma unroll
  for (int rr = 0; rr < kTM; ++rr) {
    for (int offset = kWarpColGroups / 2; offset > 0; offset /= 2) {
      v[rr] = op(v[rr], __shfl_xor_sync(kFullWarpMask, v[rr], offset));
    }
  }
  if (me.leader) {
    *reinterpret_cast<float4*>(exchange + me.half * kBr + me.row) =
        make_float4(v[0], v[1], v[2], v[3]);
  }
  __syncthreads();
#pragma unroll
  for (int rr = 0; rr < kTM; ++rr) {
    v[rr] = exchange[me.row + rr];
    for (int h = 1; h < kRowSplit; ++h) v[rr] = op(v[rr], exchange[h * kBr + me.row + rr]);
  }
}

// A Q block whose rows all see no key: O = 0 and L = -inf.
inline __device__ void write_empty_rows(float* Oi, float* Li, int rows, int d) {
  for (int e = static_cast<int>(threadIdx.x); e < rows * d; e += kThreads) Oi[e] = 0.0f;
  for (int r = static_cast<int>(threadIdx.x); r < rows; r += kThreads) Li[r] = -INFINITY;
}

// Lines 14-15 (O half): the thread's rows and columns of O_i to HBM.
template <int kHeadDim>
__device__ void store_o(const float (&O_i)[kTM][Layout<kHeadDim>::kOCols], const Owner& me,
                        float* Oi, int rows, int d, bool vec) {
#pragma unroll
  for (int rr = 0; rr < kTM; ++rr) {
    const int r = me.row + rr;
    if (r >= rows) continue;
#pragma unroll
    for (int q = 0; q < Layout<kHeadDim>::kOVecs; ++q) {
      const int k = kVec * (me.col + kColGroups * q);
      const float* o = &O_i[rr][q * kVec];
      if (vec) {
        if (k < d) {
          *reinterpret_cast<float4*>(Oi + r * d + k) = make_float4(o[0], o[1], o[2], o[3]);
        }
      } else {
#pragma unroll
        for (int x = 0; x < kVec; ++x) {
          if (k + x < d) Oi[r * d + k + x] = o[x];
        }
      }
    }
  }
}

// Lines 4-15 of Algorithm 1 for Q block i of head bh: the whole life of one
// Q block. Stage 05 calls the same body with one Q block per thread block.
// smem: Layout<kHeadDim>::kSmemBytes. Contains barriers (uniform control flow).
template <int kHeadDim>
__device__ void attend_q_block(const Params& p, std::int64_t bh, int i, float* smem) {
  using Lay = Layout<kHeadDim>;
  float* QiT = smem;                     // [kHeadDim][kQStride]: Qi transposed
  float* KVj = QiT + Lay::kQFloats;      // [kBc][kKVStride]: Kj, then Vj
  float* PT = KVj + Lay::kKVFloats;      // [kBc][kPStride]: P~_ij transposed
  float* exchange = PT + Lay::kPFloats;  // [kRowSplit][kBr]: row partials of the two warps
  const Owner me = owner();

  const int row0 = i * kBr;
  const int rows = min(kBr, p.Nq - row0);
  const int Tc_i = kv_blocks_seen_by(p, row0 + rows - 1);  // the rest is skipped (causal)
  const int Tc_unmasked = kv_blocks_unmasked(p, row0, kBr, kBc);  // no mask test in these
  const std::int64_t q_offset = (bh * p.Nq + row0) * p.d;
  float* Oi = p.O + q_offset;             // [rows, d]
  float* Li = p.L + bh * p.Nq + row0;     // [rows]
  if (Tc_i == 0) {  // every row of the block sees no key: nothing to load
    write_empty_rows(Oi, Li, rows, p.d);
    return;
  }
  const float* Qi = p.Q + q_offset;          // [rows, d]
  const std::int64_t kv = kv_head_of(bh, p.H, p.H_kv);  // the K/V head of bh's group
  const float* K = p.K + kv * p.Nk * p.d;    // [Nk, d] of this head's group
  const float* V = p.V + kv * p.Nk * p.d;    // [Nk, d] of this head's group

  // Line 4 (and line 7's first Kj, ahead of the loop). The previous Q block's
  // last reads of these buffers were before its final barriers.
  float staged[Lay::kStaged];
  load_tile<kHeadDim>(Qi, rows, p.d, p.vec, staged);
  store_tile_transposed<kHeadDim>(staged, p.vec, QiT);
  load_tile<kHeadDim>(K, min(kBc, p.Nk), p.d, p.vec, staged);
  store_tile<kHeadDim>(staged, p.vec, KVj);
  __syncthreads();

  // Line 5. l_i holds this thread's share of each row sum (see the header).
  float O_tilde[kTM][Lay::kOCols] = {};
  float l_i[kTM] = {};
  float m_i[kTM];  // running row max, in log2 units
#pragma unroll
  for (int rr = 0; rr < kTM; ++rr) m_i[rr] = -INFINITY;

  for (int j = 0; j < Tc_i; ++j) {  // line 6
    const int key0 = j * kBc;
    const int keys = min(kBc, p.Nk - key0);
    const float* Vj_src = V + static_cast<std::int64_t>(key0) * p.d;  // [keys, d]
    // Line 7 (Vj): its loads are in flight while S_ij is computed.
    if constexpr (Lay::kPrefetch) load_tile<kHeadDim>(Vj_src, keys, p.d, p.vec, staged);

    // Line 8, scaled into log2 units; keys past Nk or above the diagonal -> -inf,
    // tested one by one only in the blocks the rows do not all see whole.
    float S_ij[kTM][kTN];
    multiply_qk<kHeadDim>(QiT, KVj, me, S_ij);
    float m_new[kTM];
    if (j < Tc_unmasked) {
#pragma unroll
      for (int rr = 0; rr < kTM; ++rr) {
        m_new[rr] = m_i[rr];
#pragma unroll
        for (int cc = 0; cc < kTN; ++cc) {
          S_ij[rr][cc] *= p.scale_log2;
          m_new[rr] = fmaxf(m_new[rr], S_ij[rr][cc]);
        }
      }
    } else {
#pragma unroll
      for (int rr = 0; rr < kTM; ++rr) {
        const int visible =
            visible_in_block(p, static_cast<std::int64_t>(row0) + me.row + rr, key0);
        m_new[rr] = m_i[rr];
#pragma unroll
        for (int cc = 0; cc < kTN; ++cc) {
          const bool seen = me.col + kColGroups * cc < visible;
          S_ij[rr][cc] = seen ? S_ij[rr][cc] * p.scale_log2 : -INFINITY;
          m_new[rr] = fmaxf(m_new[rr], S_ij[rr][cc]);
        }
      }
    }
    // Line 9: m_new = max(m_i, rowmax(S_ij)). Its barrier also ends every read of Kj.
    reduce_rows(m_new, MaxOp{}, exchange, me);

    // Line 9: P~_ij = exp(S_ij - m_new), l_i = e^(m_i - m_new) l_i + rowsum(P~_ij);
    // line 10's rescale of O~_i by the same factor. A row that has seen no key
    // yet has m_new = -inf: subtracting 0 instead keeps exp(-inf - -inf) from
    // giving NaN, and leaves P~ = 0, l_i = 0, O~_i = 0.
#pragma unroll
    for (int rr = 0; rr < kTM; ++rr) {
      const float m_safe = m_new[rr] == -INFINITY ? 0.0f : m_new[rr];
      const float alpha = exp2f(m_i[rr] - m_safe);
      m_i[rr] = m_new[rr];
      float rowsum = 0.0f;
#pragma unroll
      for (int cc = 0; cc < kTN; ++cc) {
        S_ij[rr][cc] = exp2f(S_ij[rr][cc] - m_safe);  // now P~_ij
        rowsum += S_ij[rr][cc];
      }
      l_i[rr] = alpha * l_i[rr] + rowsum;
#pragma unroll
      for (int c = 0; c < Lay::kOCols; ++c) O_tilde[rr][c] *= alpha;
    }
#pragma unroll
    for (int cc = 0; cc < kTN; ++cc) {
      *reinterpret_cast<float4*>(PT + (me.col + kColGroups * cc) * Lay::kPStride + me.row) =
          make_float4(S_ij[0][cc], S_ij[1][cc], S_ij[2][cc], S_ij[3][cc]);
    }
    if constexpr (!Lay::kPrefetch) load_tile<kHeadDim>(Vj_src, keys, p.d, p.vec, staged);
    store_tile<kHeadDim>(staged, p.vec, KVj);  // Vj over Kj
    __syncthreads();  // P~_ij and Vj complete

    // Line 7 (next Kj): in flight during the P~_ij Vj product.
    const bool more = j + 1 < Tc_i;
    const float* Kj_src = K + static_cast<std::int64_t>(key0 + kBc) * p.d;  // the next Kj
    if constexpr (Lay::kPrefetch) {
      if (more) load_tile<kHeadDim>(Kj_src, min(kBc, p.Nk - key0 - kBc), p.d, p.vec, staged);
    }
    // Line 10: O~_i += P~_ij Vj.
    accumulate_pv<kHeadDim>(PT, KVj, me, O_tilde);
    __syncthreads();  // every read of Vj and P~_ij done before they are overwritten
    if (more) {
      if constexpr (!Lay::kPrefetch) {
        load_tile<kHeadDim>(Kj_src, min(kBc, p.Nk - key0 - kBc), p.d, p.vec, staged);
      }
      store_tile<kHeadDim>(staged, p.vec, KVj);
      __syncthreads();
    }
  }

  // Line 12: O_i = diag(l_i)^-1 O~_i, one reciprocal per row. Line 13:
  // L_i = m_i + log(l_i), m_i converted back from log2 units. A row that saw no
  // key has l_i = 0: O_i = 0 and L_i = -inf.
  reduce_rows(l_i, SumOp{}, exchange, me);
  float L_i[kTM];
#pragma unroll
  for (int rr = 0; rr < kTM; ++rr) {
    const float inv_l = l_i[rr] > 0.0f ? 1.0f / l_i[rr] : 0.0f;
    L_i[rr] = l_i[rr] > 0.0f ? m_i[rr] * kLn2F + logf(l_i[rr]) : -INFINITY;
#pragma unroll
    for (int c = 0; c < Lay::kOCols; ++c) O_tilde[rr][c] *= inv_l;
  }
  // Lines 14-15. Threads cg = 0..3 each write one of their 4 rows' L, so that
  // a warp writes 16 consecutive floats of L at once.
  store_o<kHeadDim>(O_tilde, me, Oi, rows, p.d, p.vec);
  if (me.col < kTM && me.row + me.col < rows) {
    float mine = L_i[0];
#pragma unroll
    for (int rr = 1; rr < kTM; ++rr) mine = me.col == rr ? L_i[rr] : mine;
    Li[me.row + me.col] = mine;
  }
}


}  // namespace flashstep::fa2
