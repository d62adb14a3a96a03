// Stage 07's kernel: FlashAttention-2's forward on tensor cores, one template
// for every ablation step (tensor_core_tiles.h says what each step adds).
// Included by the step_*.cu files, each instantiating one step.
//
// One thread block per (Q block i, head), as in stage 05; inside it, warps
// split Q as in stage 06 (split-Q): warp w owns rows w * Wr .. w * Wr + Wr - 1
// of Qi, S_ij, P~_ij and O~_i, and every warp reads all of Kj and Vj.
//
//   Qi  [Br x d]        Kj^T [d x Bc]          Vj [Bc x d]
//   +-----------+       +--------------+       +-----------+
//   | warp 0    |       |              |       |           |
//   +-----------+   x   |  all warps   |  then |  all warps|
//   | warp 1    |       |  read all    |       |  read all |
//   +-----------+       +--------------+       +-----------+
//   | ...       |      S_ij, P~_ij [Br x Bc]: warp w's rows stay in w's
//   +-----------+      registers; O~_i [Br x d] likewise, for the whole loop.
//
// Inside a warp, the rows are m16 tiles and the columns n8 tiles of the
// mma.sync.m16n8k16 instruction; common/mma_sm80.cuh draws which lane holds
// which element. A lane holds, for each of its m16 tiles, parts of two rows
// (g and g + 8, g = lane / 4); the other three lanes of its quad hold the
// rest of those rows' columns. So a row max or sum is a lane's own values
// and then two shuffles within the quad.
//
// Algorithm 1 of FlashAttention-2 (Dao 2023), line by line:
//   line 4   load Qi                          load_tile (prologue)
//   line 5   O~ = 0, l = 0, m = -inf          the accumulators below
//   line 6   for j over K/V blocks            the j loop, last block first
//   line 7     load Kj, Vj                    load_tile (pipelined from step 3)
//   line 8     S_ij = Qi Kj^T                 qk_product
//   line 9     m_new, P~_ij = exp(S - m_new)  online_softmax
//              l = e^(m - m_new) l + rowsum P~
//   line 10    O~ = diag(e^(m - m_new)) O~    online_softmax
//                   + P~_ij Vj                pv_product
//   line 12  O_i = diag(l)^-1 O~              write_output
//   line 13  L_i = m + log(l)                 write_output
//
// The K/V blocks run from the last visited one down to the first, as in
// FlashAttention-2's CUDA code: with a causal mask or a ragged end only the
// first few iterations need masking, and the rest skip it.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/mma_sm80.cuh"
#include "common/smem_tile_sm80.cuh"
#include "common/problem.h"
#include "common/reduce.cuh"
#include "tensor_core_tiles.h"

namespace flashstep::tensor_core {

using sm80::kChunkElems;
// The swizzled tiles and ldmatrix lane points (common/smem_tile_sm80.cuh).
using sm80::a_point;
using sm80::k_point;
using sm80::kBlocksPerSpan;
using sm80::kSwizzleSpan;
using sm80::LaneOffsets;
using sm80::LanePoint;
using sm80::load_tile;
using sm80::tile_offset;
using sm80::v_point;

/// Kernel arguments. Elem is __nv_bfloat16 or __half.
template <typename Elem>
struct Params {
  const Elem* Q;  // [heads, Nq, d]
  const Elem* K;  // [B * H_kv, Nk, d]
  const Elem* V;  // [B * H_kv, Nk, d]
  Elem* O;        // [heads, Nq, d]
  float* L;       // [heads, Nq]
  std::int64_t heads;  // B * H
  std::int64_t H, H_kv;  // query heads and K/V heads per batch: head bh reads kv_head_of(bh, H, H_kv)
  int Nq, Nk, d;
  bool causal;
  float scale_log2;  // |softmax scale| * log2(e), > 0 (launch() says why)
  bool negate_q;     // the scale is negative: c Q K^T = |c| (-Q) K^T
  bool vec;          // d % 8 == 0 and 16-byte aligned tensors: whole-chunk copies
};

/// Everything a (d bucket, step) pair fixes at compile time. The tile shape
/// is tensor_core_tiles.h's for the pair; tests/bench/tile_sweep.cu passes
/// others to time the alternatives.
template <int kHeadDim_, Step kStep, int kBr_ = tile_shape(kHeadDim_, kStep).br,
          int kBc_ = tile_shape(kHeadDim_, kStep).bc,
          int kWarps_ = tile_shape(kHeadDim_, kStep).warps>
struct Config {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBr = kBr_;
  static constexpr int kBc = kBc_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kWarpRows = kBr / kWarps;              // rows of Qi per warp
  static constexpr int kMTiles = kWarpRows / kMmaM;           // m16 tiles per warp
  static constexpr int kSTiles = kBc / kMmaN;                 // n8 tiles of a row of S_ij
  static constexpr int kOTiles = kHeadDim / kMmaN;            // n8 tiles of a row of O~_i
  static constexpr int kQKSteps = kHeadDim / kMmaK;           // k16 steps of Qi Kj^T
  static constexpr int kPVSteps = kBc / kMmaK;                // k16 steps of P~ Vj

  static constexpr bool kLdmatrix = kStep >= Step::kLdmatrix;
  static constexpr bool kSwizzle = kLdmatrix;  // the layout ldmatrix reads without conflicts
  static constexpr bool kAsync = kStep >= Step::kCpAsync;
  static constexpr bool kPInRegisters = kStep >= Step::kPInRegisters;

  // Shared memory, in elements: Qi (reused for O_i at the end), Kj, Vj, and
  // until step 4 the rounded P~_ij.
  static constexpr int kQElems = kBr * kHeadDim;
  static constexpr int kKVElems = kBc * kHeadDim;
  static constexpr int kPElems = kPInRegisters ? 0 : kBr * kBc;
  static constexpr int kSmemElems = kQElems + 2 * kKVElems + kPElems;

  static_assert(kWarpRows % kMmaM == 0, "a warp owns whole m16 tiles");
  static_assert(kSTiles % 2 == 0 && kOTiles % 2 == 0,
                "one ldmatrix.x4 feeds two n8 tiles at a time");
  static_assert(kHeadDim / kChunkElems >= 8 && (kPInRegisters || kBc / kChunkElems >= 8),
                "the swizzle permutes 8 chunks of a row (of Qi, Kj, Vj and P~)");
};

/// Flips the sign of every element this thread copied into the tile with
/// load_tile (the same chunks), once they have arrived: the caller has
/// waited for its own cp.async groups, and a barrier afterwards shows the
/// result to the other threads. Sign bit 15 of bf16 and fp16 alike.
template <typename Elem, int kRows, int kCols, bool kSwizzle, int kThreads>
__device__ inline void negate_own_chunks(Elem* tile) {
  constexpr int kChunksPerRow = kCols / kChunkElems;
  constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  constexpr unsigned kSignBits = 0x80008000u;  // both halves of a 32-bit word
  const int row0 = threadIdx.x / kChunksPerRow;
  const int col = threadIdx.x % kChunksPerRow * kChunkElems;
#pragma unroll 1
  for (int pass = 0; pass < kRows / kRowsPerPass; ++pass) {
    uint4* chunk = reinterpret_cast<uint4*>(
        tile + tile_offset<kCols, kSwizzle>(row0 + pass * kRowsPerPass, col));
    uint4 v = *chunk;
    v.x ^= kSignBits;
    v.y ^= kSignBits;
    v.z ^= kSignBits;
    v.w ^= kSignBits;
    *chunk = v;
  }
}

/// The inverse of load_tile for the output: rows [0, rows_valid) x columns
/// [0, d) of the tile to global memory, whole 16-byte chunks with `vec`.
template <typename Elem, int kRows, int kCols, int kThreads>
__device__ inline void store_tile(Elem* dst, const Elem* tile, int rows_valid, int d, bool vec) {
  constexpr int kChunksPerRow = kCols / kChunkElems;
  static_assert(kRows * kChunksPerRow % kThreads == 0, "every thread copies as many chunks");
#pragma unroll 1
  for (int k = 0; k < kRows * kChunksPerRow / kThreads; ++k) {
    const int c = k * kThreads + threadIdx.x;
    const int row = c / kChunksPerRow;
    const int col = c % kChunksPerRow * kChunkElems;
    if (row >= rows_valid || col >= d) continue;
    const Elem* from = tile + tile_offset<kCols, true>(row, col);
    Elem* to = dst + static_cast<std::int64_t>(row) * d + col;
    if (vec) {
      *reinterpret_cast<uint4*>(to) = *reinterpret_cast<const uint4*>(from);
    } else {
      for (int e = 0; e < kChunkElems && col + e < d; ++e) to[e] = from[e];
    }
  }
}

/// The 32-bit word holding elements (row, col) and (row, col + 1) of a tile.
template <typename Elem, int kCols, bool kSwizzle>
__device__ inline std::uint32_t tile_word(const Elem* tile, int row, int col) {
  return *reinterpret_cast<const std::uint32_t*>(tile + tile_offset<kCols, kSwizzle>(row, col));
}

/// The A fragment of the 16 x 16 block at (row0, col0) of a row-major tile.
template <typename Elem, int kCols, bool kLdmatrix>
__device__ inline void load_a(std::uint32_t (&a)[4], const Elem* tile,
                              const LaneOffsets<kCols>& lane_at, int row0, int col0) {
  if constexpr (kLdmatrix) {
    sm80::ldmatrix_x4(a, tile + lane_at(row0, col0));
  } else {
    const int lane = threadIdx.x % kWarpSize;
    const int g = lane / 4, t = lane % 4;
    a[0] = tile_word<Elem, kCols, false>(tile, row0 + g, col0 + 2 * t);
    a[1] = tile_word<Elem, kCols, false>(tile, row0 + g + 8, col0 + 2 * t);
    a[2] = tile_word<Elem, kCols, false>(tile, row0 + g, col0 + 8 + 2 * t);
    a[3] = tile_word<Elem, kCols, false>(tile, row0 + g + 8, col0 + 8 + 2 * t);
  }
}

/// B fragments of two n8 tiles of S = Q K^T: keys key0 .. key0 + 15 (the n
/// columns, rows of Kj) at head-dimension columns col0 .. col0 + 15 (the k
/// depth). b[0], b[1] feed keys key0 .. key0 + 7; b[2], b[3] the next 8.
template <typename Elem, int kCols, bool kLdmatrix>
__device__ inline void load_b_k(std::uint32_t (&b)[4], const Elem* Kj,
                                const LaneOffsets<kCols>& lane_at, int key0, int col0) {
  if constexpr (kLdmatrix) {
    sm80::ldmatrix_x4(b, Kj + lane_at(key0, col0));
  } else {
    const int lane = threadIdx.x % kWarpSize;
    const int g = lane / 4, t = lane % 4;
    b[0] = tile_word<Elem, kCols, false>(Kj, key0 + g, col0 + 2 * t);
    b[1] = tile_word<Elem, kCols, false>(Kj, key0 + g, col0 + 8 + 2 * t);
    b[2] = tile_word<Elem, kCols, false>(Kj, key0 + 8 + g, col0 + 2 * t);
    b[3] = tile_word<Elem, kCols, false>(Kj, key0 + 8 + g, col0 + 8 + 2 * t);
  }
}

/// B fragments of two n8 tiles of O = P V: keys key0 .. key0 + 15 (the k
/// depth, rows of Vj) at head-dimension columns col0 .. col0 + 15 (n).
/// b[0], b[1] feed columns col0 .. col0 + 7; b[2], b[3] the next 8.
template <typename Elem, int kCols, bool kLdmatrix>
__device__ inline void load_b_v(std::uint32_t (&b)[4], const Elem* Vj,
                                const LaneOffsets<kCols>& lane_at, int key0, int col0) {
  if constexpr (kLdmatrix) {
    sm80::ldmatrix_x4_trans(b, Vj + lane_at(key0, col0));
  } else {
    // A B-fragment register pairs two keys (two rows of Vj) of one column:
    // two 16-bit loads.
    const int lane = threadIdx.x % kWarpSize;
    const int g = lane / 4, t = lane % 4;
    const auto* bits = reinterpret_cast<const std::uint16_t*>(Vj);
    auto pair = [&](int key, int col) {
      return static_cast<std::uint32_t>(bits[tile_offset<kCols, false>(key, col)]) |
             static_cast<std::uint32_t>(bits[tile_offset<kCols, false>(key + 1, col)]) << 16;
    };
    b[0] = pair(key0 + 2 * t, col0 + g);
    b[1] = pair(key0 + 8 + 2 * t, col0 + g);
    b[2] = pair(key0 + 2 * t, col0 + 8 + g);
    b[3] = pair(key0 + 8 + 2 * t, col0 + 8 + g);
  }
}

/// A lane's offsets into every tile it loads fragments from.
template <typename C>
struct FragmentOffsets {
  LaneOffsets<C::kHeadDim> q, k, v;
  LaneOffsets<C::kBc> p;  // steps 2-3 only
  __device__ explicit FragmentOffsets(int lane)
      : q(a_point(lane)), k(k_point(lane)), v(v_point(lane)), p(a_point(lane)) {}
};

// ---------------------------------------------------------------------------
// The two products and the softmax between them, for one warp's rows.

/// S_ij = Qi Kj^T for the warp's rows (line 8), in fp32 accumulators. The
/// softmax scale is applied inside the exponential (online_softmax).
template <typename Elem, typename C>
__device__ inline void qk_product(float (&S)[C::kMTiles][C::kSTiles][4], const Elem* Qw,
                                  const Elem* Kj, const FragmentOffsets<C>& at) {
#pragma unroll
  for (int mt = 0; mt < C::kMTiles; ++mt) {
#pragma unroll
    for (int nt = 0; nt < C::kSTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) S[mt][nt][e] = 0.0f;
    }
  }
#pragma unroll
  for (int ks = 0; ks < C::kQKSteps; ++ks) {
    std::uint32_t a[C::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < C::kMTiles; ++mt) {
      load_a<Elem, C::kHeadDim, C::kLdmatrix>(a[mt], Qw, at.q, mt * kMmaM, ks * kMmaK);
    }
#pragma unroll
    for (int np = 0; np < C::kSTiles / 2; ++np) {
      std::uint32_t b[4];
      load_b_k<Elem, C::kHeadDim, C::kLdmatrix>(b, Kj, at.k, np * 2 * kMmaN, ks * kMmaK);
      const std::uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
#pragma unroll
      for (int mt = 0; mt < C::kMTiles; ++mt) {
        sm80::mma_m16n8k16<Elem>(S[mt][2 * np], a[mt], b_lo);
        sm80::mma_m16n8k16<Elem>(S[mt][2 * np + 1], a[mt], b_hi);
      }
    }
  }
}

/// Sets S to -inf where the key is past Nk or, causal, past the row's last
/// visible key. keys_seen[mt][h]: keys visible to row g + 8h of m16 tile mt.
template <typename C>
__device__ inline void mask_scores(float (&S)[C::kMTiles][C::kSTiles][4], int key0,
                                   const int (&keys_seen)[C::kMTiles][2]) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int mt = 0; mt < C::kMTiles; ++mt) {
#pragma unroll
    for (int nt = 0; nt < C::kSTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        // Key key0 + col against the row's count, as offsets into the tile:
        // key0 + col itself may pass 2^31 - 1 when Nk is near it.
        const int col = nt * kMmaN + 2 * t + e % 2;
        if (col >= keys_seen[mt][e / 2] - key0) S[mt][nt][e] = -INFINITY;
      }
    }
  }
}

/// The largest of a lane's scores in row h of m16 tile mt, by a tree (short
/// dependency chains instead of one chain of kSTiles maxima).
template <typename C>
__device__ inline float row_max(const float (&S)[C::kMTiles][C::kSTiles][4], int mt, int h) {
  float v[C::kSTiles];
#pragma unroll
  for (int nt = 0; nt < C::kSTiles; ++nt) v[nt] = fmaxf(S[mt][nt][2 * h], S[mt][nt][2 * h + 1]);
#pragma unroll
  for (int stride = 1; stride < C::kSTiles; stride *= 2) {
#pragma unroll
    for (int nt = 0; nt + stride < C::kSTiles; nt += 2 * stride) v[nt] = fmaxf(v[nt], v[nt + stride]);
  }
  return v[0];
}

/// Lines 9-10 up to the product: the new row max m, P~ = 2^(s - m) in place
/// of the raw scores S (s = S * scale * log2 e, the scaled score in log2
/// units), l rescaled and increased by P~'s row sums, O~ rescaled by
/// 2^(m_old - m_new). m is kept in the scaled units; l holds this lane's
/// share of the row only, summed over the quad at the end (FlashAttention-2
/// does the same: it saves two shuffles per tile). h = 0: row g, h = 1: row g + 8.
///
/// As in FlashAttention-2 the max is taken over the raw scores and scaled
/// once per row, so each score costs one FFMA (S * scale - m) and one
/// MUFU.EX2. That needs a positive scale: launch() makes it one.
///
/// When no row max of the warp moved (alpha = 1 for every row, the common case
/// once the first tiles have set the maxima), the d multiplies of O~'s rescale
/// are skipped: a warp-wide vote, exact, and a tenth of the loop's instructions.
template <typename C>
__device__ inline void online_softmax(float (&S)[C::kMTiles][C::kSTiles][4],
                                      float (&O)[C::kMTiles][C::kOTiles][4],
                                      float (&m)[C::kMTiles][2], float (&l)[C::kMTiles][2],
                                      float scale_log2) {
  float alpha[C::kMTiles][2];
  bool moved = false;
#pragma unroll
  for (int mt = 0; mt < C::kMTiles; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float raw = row_max<C>(S, mt, h);
      // The row's other columns live in the quad's other three lanes.
      raw = fmaxf(raw, __shfl_xor_sync(kFullWarpMask, raw, 1));
      raw = fmaxf(raw, __shfl_xor_sync(kFullWarpMask, raw, 2));
      const float m_new = fmaxf(m[mt][h], raw * scale_log2);  // a masked row: -inf
      // A row that has seen only masked keys keeps m = -inf; subtracting 0
      // instead gives 2^(-inf) = 0 rather than 2^(-inf + inf) = NaN.
      const float m_sub = m_new == -INFINITY ? 0.0f : m_new;
      alpha[mt][h] = sm80::fast_exp2(m[mt][h] - m_sub);  // e^(m_old - m_new); 0 on the first tile
      moved = moved || m_new != m[mt][h];
      m[mt][h] = m_new;
      float sum[C::kSTiles];
#pragma unroll
      for (int nt = 0; nt < C::kSTiles; ++nt) {
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) {
          S[mt][nt][e] = sm80::fast_exp2(fmaf(S[mt][nt][e], scale_log2, -m_sub));
        }
        sum[nt] = S[mt][nt][2 * h] + S[mt][nt][2 * h + 1];
      }
#pragma unroll
      for (int stride = 1; stride < C::kSTiles; stride *= 2) {
#pragma unroll
        for (int nt = 0; nt + stride < C::kSTiles; nt += 2 * stride) sum[nt] += sum[nt + stride];
      }
      l[mt][h] = alpha[mt][h] * l[mt][h] + sum[0];
    }
  }
  if (__any_sync(kFullWarpMask, moved)) {
#pragma unroll
    for (int mt = 0; mt < C::kMTiles; ++mt) {
#pragma unroll
      for (int ot = 0; ot < C::kOTiles; ++ot) {
#pragma unroll
        for (int e = 0; e < 4; ++e) O[mt][ot][e] *= alpha[mt][e / 2];
      }
    }
  }
}

/// The A fragment of P~ for keys 16 kk .. 16 kk + 15 of m16 tile mt, from the
/// score accumulators of n8 tiles 2 kk and 2 kk + 1, rounded to Elem.
template <typename Elem, typename C>
__device__ inline void p_fragment(std::uint32_t (&a)[4], const float (&S)[C::kMTiles][C::kSTiles][4],
                                  int mt, int kk) {
  a[0] = sm80::pack2<Elem>(S[mt][2 * kk][0], S[mt][2 * kk][1]);
  a[1] = sm80::pack2<Elem>(S[mt][2 * kk][2], S[mt][2 * kk][3]);
  a[2] = sm80::pack2<Elem>(S[mt][2 * kk + 1][0], S[mt][2 * kk + 1][1]);
  a[3] = sm80::pack2<Elem>(S[mt][2 * kk + 1][2], S[mt][2 * kk + 1][3]);
}

/// Steps 1-3: P~ rounded to Elem into the warp's own rows of a shared tile,
/// to be read back as A fragments. Only this warp touches these rows.
template <typename Elem, typename C>
__device__ inline void store_p(Elem* P, const float (&S)[C::kMTiles][C::kSTiles][4],
                               int warp_row0) {
  const int lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mt = 0; mt < C::kMTiles; ++mt) {
#pragma unroll
    for (int nt = 0; nt < C::kSTiles; ++nt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = warp_row0 + mt * kMmaM + g + 8 * h;
        const int col = nt * kMmaN + 2 * t;
        *reinterpret_cast<std::uint32_t*>(P + tile_offset<C::kBc, C::kSwizzle>(row, col)) =
            sm80::pack2<Elem>(S[mt][nt][2 * h], S[mt][nt][2 * h + 1]);
      }
    }
  }
  __syncwarp();  // the lanes read each other's P~ next
}

/// O~ += P~_ij Vj for the warp's rows (line 10).
template <typename Elem, typename C>
__device__ inline void pv_product(float (&O)[C::kMTiles][C::kOTiles][4],
                                  const float (&S)[C::kMTiles][C::kSTiles][4], const Elem* Pw,
                                  const Elem* Vj, const FragmentOffsets<C>& at) {
#pragma unroll
  for (int kk = 0; kk < C::kPVSteps; ++kk) {
    std::uint32_t a[C::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < C::kMTiles; ++mt) {
      if constexpr (C::kPInRegisters) {
        p_fragment<Elem, C>(a[mt], S, mt, kk);
      } else {
        load_a<Elem, C::kBc, C::kLdmatrix>(a[mt], Pw, at.p, mt * kMmaM, kk * kMmaK);
      }
    }
#pragma unroll
    for (int np = 0; np < C::kOTiles / 2; ++np) {
      std::uint32_t b[4];
      load_b_v<Elem, C::kHeadDim, C::kLdmatrix>(b, Vj, at.v, kk * kMmaK, np * 2 * kMmaN);
      const std::uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
#pragma unroll
      for (int mt = 0; mt < C::kMTiles; ++mt) {
        sm80::mma_m16n8k16<Elem>(O[mt][2 * np], a[mt], b_lo);
        sm80::mma_m16n8k16<Elem>(O[mt][2 * np + 1], a[mt], b_hi);
      }
    }
  }
}

/// Lines 12-13: O_i = O~ / l through the (now free) Qi tile to global memory
/// in 16-byte chunks, and L_i = (m + log2 l) ln 2. A row that saw no key has
/// l = 0: O = 0 and L = -inf. A NaN row stays NaN (l is NaN, not 0).
template <typename Elem, typename C>
__device__ inline void write_output(const Params<Elem>& p, std::int64_t bh, int q_row0,
                                    const float (&O)[C::kMTiles][C::kOTiles][4],
                                    const float (&m)[C::kMTiles][2], float (&l)[C::kMTiles][2],
                                    Elem* Otile, int warp_row0) {
  const int lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  __syncthreads();  // every warp is done reading Qi
#pragma unroll
  for (int mt = 0; mt < C::kMTiles; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = l[mt][h];
      sum += __shfl_xor_sync(kFullWarpMask, sum, 1);
      sum += __shfl_xor_sync(kFullWarpMask, sum, 2);
      const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
      const int row = warp_row0 + mt * kMmaM + g + 8 * h;
#pragma unroll
      for (int ot = 0; ot < C::kOTiles; ++ot) {
        *reinterpret_cast<std::uint32_t*>(
            Otile + tile_offset<C::kHeadDim, true>(row, ot * kMmaN + 2 * t)) =
            sm80::pack2<Elem>(O[mt][ot][2 * h] * inv, O[mt][ot][2 * h + 1] * inv);
      }
      if (t == 0 && row < p.Nq - q_row0) {
        const float L = sum == 0.0f ? -INFINITY
                                    : (m[mt][h] + log2f(sum)) * static_cast<float>(kLn2);
        p.L[bh * p.Nq + q_row0 + row] = L;
      }
    }
  }
  __syncthreads();  // the whole O_i tile is in shared memory
  store_tile<Elem, C::kBr, C::kHeadDim, C::kThreads>(
      p.O + (bh * p.Nq + q_row0) * p.d, Otile, p.Nq - q_row0, p.d, p.vec);
}

/// One Q block i of head bh: Algorithm 1, lines 4-13.
template <typename Elem, typename C>
__device__ inline void attend_q_block(const Params<Elem>& p, std::int64_t bh, int i, Elem* smem) {
  Elem* Qi = smem;                 // [Br][kHeadDim]; O_i at the end
  Elem* Kj = Qi + C::kQElems;      // [Bc][kHeadDim]
  Elem* Vj = Kj + C::kKVElems;     // [Bc][kHeadDim]
  Elem* P = Vj + C::kKVElems;      // [Br][Bc], steps 1-3 only
  const int warp_row0 = threadIdx.x / kWarpSize * C::kWarpRows;
  const int lane = threadIdx.x % kWarpSize;
  const Elem* Qw = Qi + warp_row0 * C::kHeadDim;  // this warp's rows of Qi
  const Elem* Pw = P + warp_row0 * C::kBc;        // and of P~
  const FragmentOffsets<C> at(lane);
  const int q_row0 = i * C::kBr;
  const int rows = min(C::kBr, p.Nq - q_row0);
  const Elem* Qh = p.Q + bh * p.Nq * p.d;  // [Nq, d] of this head
  const std::int64_t kv = kv_head_of(bh, p.H, p.H_kv);  // the K/V head of bh's group
  const Elem* Kh = p.K + kv * p.Nk * p.d;  // [Nk, d]
  const Elem* Vh = p.V + kv * p.Nk * p.d;  // [Nk, d]

  // Keys each of this lane's rows sees (bottom-right causal: query r sees
  // keys j <= r + Nk - Nq), and how many K/V blocks the block visits: those
  // its last valid row sees; the rest lie above the diagonal and are skipped.
  // Rows in 64 bits: the padding rows of the last Q block may pass 2^31 - 1.
  auto keys_seen_by = [&](std::int64_t row) -> int {
    if (!p.causal) return p.Nk;
    const std::int64_t seen = row + 1 + p.Nk - p.Nq;
    return static_cast<int>(seen < 0 ? 0 : seen > p.Nk ? p.Nk : seen);
  };
  int keys_seen[C::kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < C::kMTiles; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      keys_seen[mt][h] = keys_seen_by(static_cast<std::int64_t>(q_row0) + warp_row0 +
                                      mt * kMmaM + lane / 4 + 8 * h);
    }
  }
  const int block_keys = keys_seen_by(q_row0 + rows - 1);  // the most any row sees
  const int unmasked_keys = keys_seen_by(q_row0);          // the fewest
  const int n_blocks = block_keys == 0 ? 0 : (block_keys - 1) / C::kBc + 1;

  float O[C::kMTiles][C::kOTiles][4];
  float m[C::kMTiles][2], l[C::kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < C::kMTiles; ++mt) {
#pragma unroll
    for (int ot = 0; ot < C::kOTiles; ++ot) {
#pragma unroll
      for (int e = 0; e < 4; ++e) O[mt][ot][e] = 0.0f;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m[mt][h] = -INFINITY;
      l[mt][h] = 0.0f;
    }
  }

  using sm80::cp_async_commit;
  using sm80::cp_async_wait;
  auto load_rows = [&](Elem* tile, const Elem* head, int row0, int n_rows, int tile_rows) {
    if (tile_rows == C::kBr) {
      load_tile<Elem, C::kBr, C::kHeadDim, C::kSwizzle, C::kAsync, C::kThreads>(
          tile, head + static_cast<std::int64_t>(row0) * p.d, n_rows - row0, p.d, p.vec);
    } else {
      load_tile<Elem, C::kBc, C::kHeadDim, C::kSwizzle, C::kAsync, C::kThreads>(
          tile, head + static_cast<std::int64_t>(row0) * p.d, n_rows - row0, p.d, p.vec);
    }
  };

  load_rows(Qi, Qh, q_row0, p.Nq, C::kBr);                                   // line 4
  auto negate_qi = [&] {  // a negative scale c: c Qi Kj^T = |c| (-Qi) Kj^T
    negate_own_chunks<Elem, C::kBr, C::kHeadDim, C::kSwizzle, C::kThreads>(Qi);
  };
  if (!C::kAsync && p.negate_q) negate_qi();  // this thread's stores are already visible to it
  if constexpr (C::kAsync) {
    if (n_blocks > 0) load_rows(Kj, Kh, (n_blocks - 1) * C::kBc, p.Nk, C::kBc);
    cp_async_commit();
  }
  for (int j = n_blocks - 1; j >= 0; --j) {                                  // line 6
    const int key0 = j * C::kBc;
    if constexpr (C::kAsync) {
      cp_async_wait<0>();
      if (p.negate_q && j == n_blocks - 1) negate_qi();  // Qi arrived with the first Kj
      __syncthreads();  // Kj (and Qi) arrived for every warp; all are done with V_{j+1}
      load_rows(Vj, Vh, key0, p.Nk, C::kBc);                                 // line 7: V under Q K^T
      cp_async_commit();
    } else {
      __syncthreads();  // every warp is done with K_{j+1} and V_{j+1}
      load_rows(Kj, Kh, key0, p.Nk, C::kBc);                                 // line 7
      load_rows(Vj, Vh, key0, p.Nk, C::kBc);
      __syncthreads();
    }

    float S[C::kMTiles][C::kSTiles][4];
    qk_product<Elem, C>(S, Qw, Kj, at);                                       // line 8
    if (unmasked_keys - key0 < C::kBc) mask_scores<C>(S, key0, keys_seen);

    if constexpr (C::kAsync) {
      cp_async_wait<0>();
      __syncthreads();  // Vj arrived; every warp is done with Kj
      if (j > 0) load_rows(Kj, Kh, key0 - C::kBc, p.Nk, C::kBc);             // K_{j-1} under P V
      cp_async_commit();
    }
    online_softmax<C>(S, O, m, l, p.scale_log2);                              // lines 9-10
    if constexpr (!C::kPInRegisters) store_p<Elem, C>(P, S, warp_row0);
    pv_product<Elem, C>(O, S, Pw, Vj, at);                                    // line 10
  }
  // A block that visits no K/V block (all its rows precede the first key,
  // causal) never waited for its Qi copy; O_i is about to reuse that tile.
  if constexpr (C::kAsync) cp_async_wait<0>();
  write_output<Elem, C>(p, bh, q_row0, O, m, l, Qi, warp_row0);              // lines 12-13
  __syncthreads();  // the next head's loads may overwrite the tiles
}

/// One thread block per (Q block, head); heaviest Q blocks first (stage 05
/// explains the order), heads past grid y's limit by a grid-stride loop.
template <typename Elem, typename C>
__global__ void __launch_bounds__(C::kThreads) tensor_core_kernel(const Params<Elem> p) {
  extern __shared__ uint4 smem_chunks[];  // uint4: 16-byte alignment for the chunk copies
  Elem* smem = reinterpret_cast<Elem*>(smem_chunks);
  const int Tr = (p.Nq - 1) / C::kBr + 1;
  const int i = Tr - 1 - static_cast<int>(blockIdx.x);
  for (std::int64_t bh = blockIdx.y; bh < p.heads; bh += gridDim.y) {
    attend_q_block<Elem, C>(p, bh, i, smem);
  }
}

}  // namespace flashstep::tensor_core
