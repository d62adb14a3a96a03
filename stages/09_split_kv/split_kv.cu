// Stage 09: split-KV decoding (flash-decoding): Q, K, V and O in fp32 (on the
// CUDA cores, split_kernel) or fp16 and bf16 (on the tensor cores,
// split_mma_kernel further down), every sum in fp32.
//
// What changed since stage 05 (and why a new stage): decoding asks for Nq = 1
// to 16 queries against Nk = thousands to a million keys. Stage 05 spreads Q
// blocks over thread blocks; here there is one Q block per head, so it would
// launch B * H blocks, a few dozen on a GPU that holds hundreds, each walking
// all Nk keys. The time is set by reading K and V once, and that takes every
// SM's share of the memory bandwidth. So the keys are spread instead:
//
//   split kernel   grid x = row tiles x splits, grid y = B * H_kv
//                  block (tile, s, kvh): the group's rows r0 .. r0 + 31 (query
//                  head g, query i; r = g Nq + i) against keys
//                  [s kps, (s + 1) kps), Algorithm 1's loop over K/V tiles of
//                  32 keys; writes O_s = O~ / l and L_s = m + log l per row
//   merge kernel   1 to 8 warps per row (merge_warps), each over its run of
//                  the splits: L = logsumexp over s of L_s, then
//                  O = sum over s of exp(L_s - L) O_s (common/partial_merge.h)
//
// Grouped-query heads: the G = H / H_kv query heads that share K/V head kvh
// are rows of the same block, so a K/V tile loaded into shared memory serves
// all of them (K/V read once per group, not once per query head).
//
// The fp32 kernel's thread layout (256 threads, 8 warps), per K/V tile of 32
// keys: register tiles, as in an SGEMM, so that each value a lane loads from
// shared memory feeds several FFMAs (Fp32Tiles):
//   rows                 warp w owns 4 of the 32 rows: wide (fp32_wide: more
//                        than 8 rows in the group) rows 4 w .. 4 w + 3 as one
//                        register tile; narrow rows w, w + 8, w + 16, w + 24,
//                        one at a time, so that up to 8 rows each has a warp
//   S = Q K^T            lane l: the tile's rows x keys l % 16 and l % 16 + 16
//                        over half l / 16 of the columns; one shuffle adds the
//                        halves and leaves lane l with key l's score
//   softmax              row max and sum by warp shuffles; m, l and alpha in
//                        the owning warp's registers
//   O~ += P~ V           lane: the tile's rows x 4 columns per column quad it
//                        owns (d = 64: 16 lanes a row, the other 16 the
//                        tile's second 16 keys), P~ read key-major from Pt
// The next K/V tile arrives by cp.async while this one is computed (two
// buffers up to d = 128, one at d = 256: stages_for).
//
// Run it: ./build/stages/cli/flashstep --stage 09 --B 1 --H 32 --H-kv 8 --Nq 1 --Nk 32768 --d 128
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/cuda_check.h"
#include "common/element.cuh"
#include "common/error.h"
#include "common/launch.cuh"
#include "common/mma_sm80.cuh"
#include "common/smem_tile_sm80.cuh"
#include "common/partial_merge.h"
#include "common/reduce.cuh"
#include "split_kv.h"
#include "split_kv_device.cuh"

namespace flashstep::split_kv {

namespace {

// log2(e): scores in log2 units, so each exponential is one exp2.
constexpr double kLog2e = 1.4426950408889634;

// K/V tiles in flight: 2 (the next tile's copies run while this one is
// computed) up to d = 128; at d = 256 two stages would need 165 KiB of shared
// memory, more than an sm_80 block may have (163 KiB), so one.
constexpr int stages_for(int kD) { return kD <= 128 ? 2 : 1; }

// Shared memory of the split kernel for the head-dimension bucket kD (d is
// zero-padded up to it): byte offsets, each a multiple of 16. Q and P~ are
// fp32; the K and V tiles stay in Elem as they arrive by cp.async, widened
// where they are read. The row statistics (m, l, alpha) stay in the
// registers of the warp that owns the rows (Fp32Tiles).
template <int kD, typename Elem>
struct Smem {
  static constexpr int kStages = stages_for(kD);
  static constexpr int kChunk = 16 / sizeof(Elem);  // elements of one 16-byte cp.async
  // K rows padded by one chunk: in the score loop the 8 lanes of each
  // quarter-warp phase of a 16-byte access read 8 consecutive keys at the
  // same column, and the padding moves each key's row to another bank group
  // (in fp32 8 different ones; in 16 bits two lanes of a half-warp share
  // one); rows stay 16-byte aligned for cp.async.
  static constexpr int kKStride = kD + kChunk;
  // P~ transposed (key-major): a row tile's values of one key are
  // consecutive, one load for a warp's rows in P~ V. Rows padded by
  // kFp32TileRows floats, the most any layout pads them (Fp32Tiles::kPStride).
  static constexpr int kPStrideMax = kRows + kFp32TileRows;
  static constexpr std::size_t kQ = 0;                                      // float Qs [kRows][kD]
  static constexpr std::size_t kK = kQ + sizeof(float) * kRows * kD;        // Elem Ks [kStages][kBc][kKStride]
  static constexpr std::size_t kV = kK + sizeof(Elem) * kStages * kBc * kKStride;  // Elem Vs [kStages][kBc][kD]
  static constexpr std::size_t kP = kV + sizeof(Elem) * kStages * kBc * kD;  // float Pt [kBc][kPStride]
  static constexpr std::size_t kBytes = kP + sizeof(float) * kBc * kPStrideMax;
};

// Floats of a float4: one 16-byte shared-memory access (LDS.128, STS.128),
// the widest a thread makes.
constexpr int kVec4 = 4;

// The fp32 kernel's thread layout for register tiles of kTileRows rows:
// kFp32TileRows in the wide layout, 1 in the narrow one (fp32_wide in
// split_kv_plan.h says which a group takes, and why).
template <int kD, int kTileRows>
struct Fp32Tiles {
  // Passes a warp makes over its kRows / kWarps rows, kTileRows at a time:
  // pass k of warp w holds rows (k kWarps + w) kTileRows + 0 .. kTileRows - 1
  // (wide: rows 4 w .. 4 w + 3 in one pass; narrow: rows w, w + 8, w + 16,
  // w + 24 in four).
  static constexpr int kPasses = kRows / (kWarps * kTileRows);
  // S = Q K^T: every score's dot product in two halves of the columns. Lane
  // l sums half l / 16 of keys l % 16 and l % 16 + 16 for the tile's rows,
  // so each K value it loads feeds kTileRows rows and each Q value two keys;
  // lanes l and l ^ 16 then add their halves (one shuffle a row), which
  // leaves lane l with key l's score, as the softmax takes it.
  static constexpr int kHalves = 2;
  static constexpr int kHalfKeys = kBc / kHalves;  // lanes of one half
  static constexpr int kHalfCols = kD / kHalves;
  // O~ += P~ V: a lane holds kTileRows rows x 4 columns (one float4 of a V
  // row) for each column quad it owns. The quads of a row are dealt to a
  // key group's lanes: at d = 128 one a lane; at d = 256 two; at d = 64
  // (16 quads) 16 lanes hold the row, and the warp's other 16 lanes take the
  // tile's second half of the keys (kKeyGroups = 2), their sums added at the
  // end of the split.
  static constexpr int kQuads = kD / kVec4;
  static constexpr int kKeyGroups = kQuads < kWarpSize ? kWarpSize / kQuads : 1;
  static constexpr int kGroupLanes = kWarpSize / kKeyGroups;
  static constexpr int kGroupKeys = kBc / kKeyGroups;
  static constexpr int kLaneQuads = kQuads / kGroupLanes;
  // Pt's row stride: one register tile of padding, so that the stores of P~
  // (lane j writes key j's kTileRows values) fall in different banks: in the
  // narrow layout 32 lanes' 4-byte stores at stride 33 words, in the wide
  // layout each quarter-warp's 16-byte stores at stride 36 (4 banks apart).
  static constexpr int kPStride = kRows + kTileRows;
  static_assert(kHalfKeys * kHalves == kWarpSize, "a lane per key of each half");
  static_assert(kKeyGroups * kGroupLanes == kWarpSize && kLaneQuads >= 1, "P~ V covers the warp");
  static_assert(kPStride <= Smem<kD, float>::kPStrideMax, "Pt fits its shared memory");
};

// At least two blocks per SM up to d = 128 (at most 128 registers a
// thread): while one block waits on its K/V tile loads, the other computes.
// Without the bound the compiler takes 144 (wide) and 137 (narrow)
// registers at d = 128, one block per SM; with it neither spills. At d = 256 the 32 accumulators a thread holds need more: one block.
constexpr int min_blocks_per_sm(int kD) { return kD <= 128 ? 2 : 1; }

// kN consecutive floats of shared memory into registers and back: float4
// accesses where kN is a multiple of 4 (the address is then 16-byte aligned).
template <int kN>
__device__ __forceinline__ void load_floats(const float* src, float (&v)[kN]) {
  if constexpr (kN % kVec4 == 0) {
#pragma unroll
    for (int q = 0; q < kN / kVec4; ++q) {
      const float4 x = reinterpret_cast<const float4*>(src)[q];
      v[kVec4 * q] = x.x;
      v[kVec4 * q + 1] = x.y;
      v[kVec4 * q + 2] = x.z;
      v[kVec4 * q + 3] = x.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kN; ++i) v[i] = src[i];
  }
}

template <int kN>
__device__ __forceinline__ void store_floats(float* dst, const float (&v)[kN]) {
  if constexpr (kN % kVec4 == 0) {
#pragma unroll
    for (int q = 0; q < kN / kVec4; ++q) {
      reinterpret_cast<float4*>(dst)[q] =
          make_float4(v[kVec4 * q], v[kVec4 * q + 1], v[kVec4 * q + 2], v[kVec4 * q + 3]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kN; ++i) dst[i] = v[i];
  }
}

// acc + a . b: four FFMAs.
__device__ __forceinline__ float dot4(float acc, const float4& a, const float4& b) {
  acc += a.x * b.x;
  acc += a.y * b.y;
  acc += a.z * b.z;
  acc += a.w * b.w;
  return acc;
}

// acc += s v, per component: four FFMAs.
__device__ __forceinline__ void axpy4(float4& acc, float s, const float4& v) {
  acc.x += s * v.x;
  acc.y += s * v.y;
  acc.z += s * v.z;
  acc.w += s * v.w;
}

// acc *= s, per component.
__device__ __forceinline__ void scale4(float4& acc, float s) {
  acc.x *= s;
  acc.y *= s;
  acc.z *= s;
  acc.w *= s;
}

// Starts the copies of the K and V tile of keys kt .. kt + kBc - 1 of K/V
// head kvh (K, V: from head_base) into the buffers Ks [kBc][kKStride] and
// Vs [kBc][kD]: 16-byte cp.async chunks with p.vec, else element by element
// through registers. Keys past k_hi and columns past d are zero: a zero V
// row times a zero P~ adds nothing (stale data there could be NaN).
template <int kD, bool kPaged, typename Elem>
__device__ void load_kv_tile(const Params<Elem>& p, const Elem* K, const Elem* V, std::int64_t kvh,
                             int kt, int k_hi, Elem* Ks, Elem* Vs) {
  using S = Smem<kD, Elem>;
  const std::int64_t at = tile_offset<kPaged>(p, kvh, kt, p.d);
  const Elem* Kt = K + at;  // [keys, d]: contiguous
  const Elem* Vt = V + at;
  const int keys = min(kBc, k_hi - kt);
  if (p.vec) {
    constexpr int kChunks = kD / S::kChunk;  // 16-byte chunks a row
    for (int e = threadIdx.x; e < kBc * kChunks; e += kThreads) {
      const int j = e / kChunks, c = (e % kChunks) * S::kChunk;
      const bool in = j < keys && c < p.d;  // d a multiple of kChunk: a chunk is wholly in or out
      sm80::cp_async_16(Ks + j * S::kKStride + c, in ? Kt + j * p.d + c : Kt, in);
      sm80::cp_async_16(Vs + j * kD + c, in ? Vt + j * p.d + c : Vt, in);
    }
  } else {
    for (int e = threadIdx.x; e < kBc * kD; e += kThreads) {
      const int j = e / kD, c = e % kD;
      const bool in = j < keys && c < p.d;
      Ks[j * S::kKStride + c] = in ? Kt[j * p.d + c] : from_float<Elem>(0.0f);
      Vs[j * kD + c] = in ? Vt[j * p.d + c] : from_float<Elem>(0.0f);
    }
  }
}

// The fp32 split kernel on the CUDA cores, with register tiles of kTileRows
// rows (Fp32Tiles): each value a thread loads from shared memory feeds
// several FFMAs, as in an SGEMM. kPaged: the cache is paged (tile_offset).
template <int kD, int kTileRows, bool kPaged, typename Elem>
__global__ void __launch_bounds__(kThreads, min_blocks_per_sm(kD))
    split_kernel(const Params<Elem> p) {
  using S = Smem<kD, Elem>;
  using T = Fp32Tiles<kD, kTileRows>;
  constexpr int kStages = S::kStages;
  constexpr int kPasses = T::kPasses;
  constexpr int kLaneQuads = T::kLaneQuads;
  extern __shared__ float4 smem_vec[];  // float4: 16-byte alignment for cp.async and float4 reads
  char* smem = reinterpret_cast<char*>(smem_vec);
  float* Qs = reinterpret_cast<float*>(smem + S::kQ);  // [kRows][kD]
  Elem* Ks = reinterpret_cast<Elem*>(smem + S::kK);    // [kStages][kBc][kKStride]
  Elem* Vs = reinterpret_cast<Elem*>(smem + S::kV);    // [kStages][kBc][kD]
  float* Pt = reinterpret_cast<float*>(smem + S::kP);  // [kBc][T::kPStride]: P~ transposed
  const int tid = threadIdx.x;
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  const int half = lane / T::kHalfKeys;           // S: the half of the columns this lane sums
  const int key_group = lane / T::kGroupLanes;    // P~ V: keys key_group kGroupKeys + 0 ..
  const int quad = lane % T::kGroupLanes;         // P~ V: columns 4 (quad + kGroupLanes u) + 0..3
  const std::int64_t units = p.row_tiles * p.splits;
  let_next_kernel_launch();
  wait_for_previous_kernel();  // an append's writes to the cache (a no-op otherwise)

  for (std::int64_t kvh = blockIdx.y; kvh < p.kv_heads; kvh += gridDim.y) {
    const int nk = sequence_keys(p, kvh / p.H_kv);
    const Elem* K = p.K + head_base<kPaged>(p, kvh);  // [Nk, d] of this K/V head, or the pool
    const Elem* V = p.V + head_base<kPaged>(p, kvh);
    for (std::int64_t u = blockIdx.x; u < units; u += gridDim.x) {
      const std::int64_t tile = u / p.splits;
      const std::int64_t s = u % p.splits;
      const std::int64_t r0 = tile * kRows;
      const UnitSpan span = unit_span<kBc>(p, r0, kRows, s, nk);
      const int rows = span.rows, k_lo = span.k_lo, k_hi = span.k_hi, tiles = span.tiles;

      __syncthreads();  // the previous unit is done with every shared array
      // The first kStages - 1 K/V tiles start on their way, then the Q rows
      // of the tile, zero past `rows` and past d, are loaded beside them.
      for (int t = 0; t < kStages - 1; ++t) {
        if (t < tiles) {
          load_kv_tile<kD, kPaged, Elem>(p, K, V, kvh, k_lo + t * kBc, k_hi,
                                         Ks + t * kBc * S::kKStride, Vs + t * kBc * kD);
        }
        sm80::cp_async_commit();
      }
      for (int e = tid; e < kRows * kD; e += kThreads) {
        const int r = e / kD, c = e % kD;
        float q = 0.0f;
        if (r < rows && c < p.d) {
          const std::int64_t rr = r0 + r;
          const std::int64_t bh = query_head(kvh, rr / p.Nq, p.H, p.H_kv);
          q = to_float(p.Q[(bh * p.Nq + rr % p.Nq) * p.d + c]);
        }
        Qs[e] = q;
      }
      // The warp's rows, per pass and row of its register tile: m and l
      // (Algorithm 1's m_i, l_i, identical in every lane), the keys each may
      // see in this split, and the lane's part of O~ (unnormalized). A
      // padding row sees no key: its scores are -inf, its P~ 0.
      float m_i[kPasses][kTileRows], l_i[kPasses][kTileRows];
      int end_row[kPasses][kTileRows];
      float4 acc[kPasses][kTileRows][kLaneQuads];
#pragma unroll
      for (int k = 0; k < kPasses; ++k) {
#pragma unroll
        for (int i = 0; i < kTileRows; ++i) {
          const int r = (k * kWarps + warp) * kTileRows + i;
          m_i[k][i] = -INFINITY;
          l_i[k][i] = 0.0f;
          end_row[k][i] = r < rows ? static_cast<int>(min(static_cast<std::int64_t>(k_hi),
                                                          visible_keys((r0 + r) % p.Nq, p.Nq, nk, p.causal)))
                                   : k_lo;
#pragma unroll
          for (int q = 0; q < kLaneQuads; ++q) acc[k][i][q] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
      }

      for (int t = 0; t < tiles; ++t) {
        // Tile t + kStages - 1 starts into the buffer tile t - 1 used (every
        // thread finished with it at the barrier that ended that iteration);
        // then this thread waits for its copies of tile t, and the barrier
        // makes everyone's visible.
        const int ahead = t + kStages - 1;
        if (ahead < tiles) {
          const int buf = ahead % kStages;
          load_kv_tile<kD, kPaged, Elem>(p, K, V, kvh, k_lo + ahead * kBc, k_hi,
                                         Ks + buf * kBc * S::kKStride, Vs + buf * kBc * kD);
        }
        sm80::cp_async_commit();
        sm80::cp_async_wait<kStages - 1>();
        __syncthreads();
        const int kt = k_lo + t * kBc;
        const Elem* Kb = Ks + (t % kStages) * kBc * S::kKStride;  // [kBc][kKStride]
        const Elem* Vb = Vs + (t % kStages) * kBc * kD;           // [kBc][kD]
        // (The arrays stay in registers only if every index is a constant:
        // the loops over passes and tile rows are unrolled, passes of
        // padding rows skipped, not left.)
#pragma unroll
        for (int k = 0; k < kPasses; ++k) {
          const int row0 = (k * kWarps + warp) * kTileRows;
          if (row0 >= rows) continue;  // warp-uniform: padding rows only
          // S = Q K^T on the register tile: the tile's rows against keys
          // lane % 16 and lane % 16 + 16, over this lane's half of the columns.
          // Qh: the tile's rows, [kTileRows][kD]; Kh: the two keys,
          // [kHalves][kHalfKeys][kKStride]; both from the half's first column.
          const float* Qh = Qs + row0 * kD + half * T::kHalfCols;
          const Elem* Kh = Kb + (lane % T::kHalfKeys) * S::kKStride + half * T::kHalfCols;
          float dot[kTileRows][T::kHalves] = {};
#pragma unroll 4
          for (int c = 0; c < T::kHalfCols; c += kVec4) {
            float4 k4[T::kHalves];
#pragma unroll
            for (int h = 0; h < T::kHalves; ++h) {
              k4[h] = load_vec4(Kh + h * T::kHalfKeys * S::kKStride + c);
            }
#pragma unroll
            for (int i = 0; i < kTileRows; ++i) {
              const float4 q4 = *reinterpret_cast<const float4*>(Qh + i * kD + c);
#pragma unroll
              for (int h = 0; h < T::kHalves; ++h) dot[i][h] = dot4(dot[i][h], q4, k4[h]);
            }
          }
          // Lane l keeps key l (its half's sum of key lane % 16 + 16 half)
          // and adds lane l ^ 16's half of it; then the online softmax, row
          // by row, as one score a lane.
          float p_ij[kTileRows], alpha[kTileRows];
#pragma unroll
          for (int i = 0; i < kTileRows; ++i) {
            const float mine = half == 0 ? dot[i][0] : dot[i][1];
            const float theirs = half == 0 ? dot[i][1] : dot[i][0];
            const float full = mine + __shfl_xor_sync(kFullWarpMask, theirs, T::kHalfKeys);
            const float score = kt + lane < end_row[k][i] ? full * p.scale_log2 : -INFINITY;
            const float m_new = fmaxf(m_i[k][i], warp_reduce(score, MaxOp{}));
            // No key seen yet: subtract 0, so exp2(-inf - 0) = 0, not exp2(NaN).
            const float m_use = m_new == -INFINITY ? 0.0f : m_new;
            p_ij[i] = exp2f(score - m_use);
            alpha[i] = exp2f(m_i[k][i] - m_use);
            l_i[k][i] = l_i[k][i] * alpha[i] + warp_reduce(p_ij[i], SumOp{});
            m_i[k][i] = m_new;
          }
          store_floats(Pt + lane * T::kPStride + row0, p_ij);
          __syncwarp();  // the warp's rows of P~, written by its lanes, read by all of them
          // O~ = alpha O~ + P~ V on the register tile: per key, the tile's
          // P~ in one load and each of the lane's V quads in one.
#pragma unroll
          for (int i = 0; i < kTileRows; ++i) {
#pragma unroll
            for (int q = 0; q < kLaneQuads; ++q) scale4(acc[k][i][q], alpha[i]);
          }
#pragma unroll 4
          for (int jj = 0; jj < T::kGroupKeys; ++jj) {
            const int j = key_group * T::kGroupKeys + jj;
            float p_j[kTileRows];
            load_floats(Pt + j * T::kPStride + row0, p_j);
#pragma unroll
            for (int q = 0; q < kLaneQuads; ++q) {
              const float4 v4 = load_vec4(Vb + j * kD + kVec4 * (quad + q * T::kGroupLanes));
#pragma unroll
              for (int i = 0; i < kTileRows; ++i) axpy4(acc[k][i][q], p_j[i], v4);
            }
          }
        }
        __syncthreads();  // this tile's buffer is free again (and Pt, each warp's own rows)
      }

      // The key groups' sums of O~ (d = 64: two halves of every tile's keys).
#pragma unroll
      for (int k = 0; k < kPasses; ++k) {
#pragma unroll
        for (int i = 0; i < kTileRows; ++i) {
#pragma unroll
          for (int q = 0; q < kLaneQuads; ++q) {
#pragma unroll
            for (int offset = T::kGroupLanes; offset < kWarpSize; offset *= 2) {
              float4& a = acc[k][i][q];
              a.x += __shfl_xor_sync(kFullWarpMask, a.x, offset);
              a.y += __shfl_xor_sync(kFullWarpMask, a.y, offset);
              a.z += __shfl_xor_sync(kFullWarpMask, a.z, offset);
              a.w += __shfl_xor_sync(kFullWarpMask, a.w, offset);
            }
          }
        }
      }
      // O_s = O~ / l and L_s = m + log l (natural log): the partial of this
      // split, or with one split the answer, by the lanes of key group 0 and
      // (L) lane 0. A row that saw no key has l = 0: O = 0, L = -inf. (l NaN,
      // from NaN inputs, stays NaN.)
#pragma unroll
      for (int k = 0; k < kPasses; ++k) {
#pragma unroll
        for (int i = 0; i < kTileRows; ++i) {
          const int r = (k * kWarps + warp) * kTileRows + i;
          if (r >= rows) continue;  // warp-uniform
          const std::int64_t rr = r0 + r;
          const std::int64_t row = query_head(kvh, rr / p.Nq, p.H, p.H_kv) * p.Nq + rr % p.Nq;
          const float l = l_i[k][i];
          if (key_group == 0) {
#pragma unroll
            for (int q = 0; q < kLaneQuads; ++q) {
              const int c0 = kVec4 * (quad + q * T::kGroupLanes);
              const float o4[kVec4] = {acc[k][i][q].x, acc[k][i][q].y, acc[k][i][q].z, acc[k][i][q].w};
#pragma unroll
              for (int c = 0; c < kVec4; ++c) {
                if (c0 + c >= p.d) continue;
                const float o = l == 0.0f ? 0.0f : o4[c] / l;
                if (p.splits == 1) p.O[row * p.d + c0 + c] = from_float<Elem>(o);
                else p.O_part[((s * p.heads * p.Nq) + row) * p.d + c0 + c] = o;  // partials stay fp32
              }
            }
          }
          if (lane == 0) {
            const float L = l == 0.0f ? -INFINITY : (m_i[k][i] + log2f(l)) * kLn2;
            if (p.splits == 1) p.L[row] = L;
            else p.L_part[s * p.heads * p.Nq + row] = L;
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// The 16-bit split kernel on the tensor cores.
//
// The CUDA-core kernel above is bound by its instructions in 16 bits (it
// widens every K and V element to fp32 and spends an FFMA on it): reading half
// the bytes of fp32 it takes as long. Here S = Q K^T and O~ += P~ V are
// mma.sync.m16n8k16 products (common/mma_sm80.cuh), as in stage 07's forward,
// with the group's rows as M: the row tile's 32 rows (G Nq of them valid,
// the rest zero) are two m16 tiles. M is small, so the warps split the keys
// of each K/V tile, not the rows (split_kv_plan.h, kMmaWarps):
//
//   K/V tile of mma_tile_keys(kD) keys, mma_stages(kD) - 1 in flight by cp.async
//   +---------+---------+---------+---------+
//   | warp 0  | warp 1  | warp 2  | warp 3  |   d = 64: 16 keys a warp,
//   | keys    | keys    | keys    | keys    |   all 32 rows (2 m16 tiles)
//   | 0..15   | 16..31  | 32..47  | 48..63  |
//   +---------+---------+---------+---------+
//   d = 128, 256: warps 0, 1 take keys 0..15 (rows 0..15 and 16..31), warps
//   2, 3 keys 16..31: a warp's O~ is then 16 x d fp32 (64 or 128 registers
//   a lane), and the tile of 32 keys leaves room for more stages.
//   d = 128 with at most 16 rows (mma_narrow): one barrier a pair of tiles,
//   warp w keys 16 w .. 16 w + 15 of the pair's 64, rows 0..15, as at
//   d = 64 (otherwise warps 1 and 3 would hold padding rows only).
//
// Each warp runs Algorithm 1 on its own slice: its own m, l and O~ for its
// rows, over the keys k_lo + 16 (its slice of a step) + keys_per_step t +
// 0..15. At
// the end of the split the warps' (m, l, O~) are partials over disjoint key
// sets, merged through shared memory with the merge kernel's rule
// (common/partial_merge.h): L_w = m_w + log l_w, O_w = O~_w / l_w, then
// L = logsumexp_w L_w and O = sum_w exp(L_w - L) O_w. The block then writes
// (O, L) as the CUDA-core kernel does: the partial of its split in fp32, or
// with one split the answer. Scores are kept in log2 units (scale log2 e
// folded into the scale, each exponential one MUFU.EX2).

/// The 16-bit kernel's compile-time shape for the head-dimension bucket kD.
template <int kD>
struct MmaTiles {
  static constexpr int kWarpMTiles = mma_warp_m_tiles(kD);  // m16 tiles a warp holds
  static constexpr int kRowGroups = mma_row_groups(kD);     // warps sharing a key slice
  static constexpr int kSlices = kMmaWarps / kRowGroups;    // key slices of a K/V tile
  // The narrow layout (mma_narrow: every warp its own slice of a pair of
  // tiles, for groups of at most 16 rows) and the slices a split's merge
  // then has at most.
  static constexpr bool kCanNarrow = mma_narrow(kD, sm80::kMmaM);
  static constexpr int kMaxSlices = kCanNarrow ? kMmaWarps : kSlices;
  static constexpr int kTileKeys = mma_tile_keys(kD);
  static constexpr int kStages = mma_stages(kD);
  static constexpr int kThreads = kMmaWarps * kWarpSize;
  static constexpr int kSTiles = kWarpKeys / sm80::kMmaN;   // n8 tiles of a warp's S row
  static constexpr int kOTiles = kD / sm80::kMmaN;          // n8 tiles of a row of O~
  static constexpr int kQKSteps = kD / sm80::kMmaK;         // k16 steps of Q K^T
  // Accumulators per n8 tile of S, each summing every kQKChains-th k-step.
  // With one, a warp's product of S was two chains (its two n8 tiles) of
  // kQKSteps dependent mma each, 8 at d = 128: the tile's softmax waited
  // 8 mma latencies for its scores, with nothing else to issue (a decode has
  // one or two such warps per SM sub-partition). Two halve the chain and give
  // the tensor pipe 4 independent mma per m16 tile; they cost 8 registers
  // per m16 tile and 4 adds a lane. More would leave chains of 2 (1 at
  // d = 64) for 8 more registers each.
  static constexpr int kQKChains = 2;
  // Q's A fragments held in registers for the whole split (split_kv_plan.h),
  // as [kQHeldTiles][kQHeldSteps][4]; one unused fragment where they are not.
  static constexpr bool kQInRegisters = mma_q_in_registers(kD);
  static constexpr int kQHeldTiles = kQInRegisters ? kWarpMTiles : 1;
  static constexpr int kQHeldSteps = kQInRegisters ? kQKSteps : 1;
  // The merge's O_w rows in fp32, padded by 8 floats: a warp's 8 row groups
  // g write float2s at columns 2t, and with 8 more words per row the 16 lanes
  // of each half-warp store land in 32 different banks.
  static constexpr int kMergeStride = kD + 8;

  // Shared memory in bytes: Q (16-bit, swizzled), the K and V stages
  // (swizzled), and each warp slice's L_w per row. At the end of the split the
  // K/V stages are free and hold the warps' O_w for the merge.
  static constexpr std::size_t kQ = 0;  // Elem Qs [kRows][kD]
  static constexpr std::size_t kQBytes = sizeof(std::uint16_t) * kRows * kD;
  static constexpr std::size_t kKVTileBytes = sizeof(std::uint16_t) * kTileKeys * kD;
  static constexpr std::size_t kK = kQ + kQBytes;                      // Elem Ks [kStages][kTileKeys][kD]
  static constexpr std::size_t kV = kK + kStages * kKVTileBytes;        // Elem Vs [kStages][kTileKeys][kD]
  static constexpr std::size_t kLw = kV + kStages * kKVTileBytes;       // float [kMaxSlices][kRows]
  static constexpr std::size_t kW = kLw + sizeof(float) * kMaxSlices * kRows;  // float [kMaxSlices][kRows]: weights
  static constexpr std::size_t kLrow = kW + sizeof(float) * kMaxSlices * kRows;  // float [kRows]: merged L
  static constexpr std::size_t kBytes = kLrow + sizeof(float) * kRows;
  static constexpr std::size_t kO = kK;  // float Ow [kMaxSlices][kRows][kMergeStride], over the K/V stages

  static_assert(kRows == kRowGroups * kWarpMTiles * sm80::kMmaM, "the warps cover the row tile");
  static_assert(kSTiles == 2, "one ldmatrix.x4 gives a slice's two n8 tiles of K");
  static_assert(kWarpKeys == sm80::kMmaK, "a slice's P~ is one A fragment");
  static_assert(kOTiles % 2 == 0, "one ldmatrix.x4.trans gives two n8 tiles of V");
  static_assert(kD / sm80::kChunkElems >= 8, "the swizzle permutes 8 chunks of a row");
  static_assert(sizeof(float) * kMaxSlices * kRows * kMergeStride <= 2 * kStages * kKVTileBytes,
                "the merge's O_w fit in the K/V stages");
  static_assert(kK % 16 == 0 && kV % 16 == 0 && kLw % 16 == 0, "16-byte aligned arrays");
};

/// The split kernel for 16-bit Elem (__nv_bfloat16 or __half), bound to the
/// blocks an SM holds that the split rule counts on (resident_blocks, the
/// same for both 16-bit types). kPaged: the cache is paged (tile_offset).
template <int kD, bool kPaged, typename Elem>
__global__ void __launch_bounds__(MmaTiles<kD>::kThreads, resident_blocks(DType::kBf16, kD))
    split_mma_kernel(const Params<Elem> p) {
  using T = MmaTiles<kD>;
  using sm80::kMmaK;
  using sm80::kMmaM;
  using sm80::kMmaN;
  extern __shared__ uint4 smem_chunks[];  // uint4: 16-byte alignment for cp.async and ldmatrix
  char* smem = reinterpret_cast<char*>(smem_chunks);
  Elem* Qs = reinterpret_cast<Elem*>(smem + T::kQ);   // [kRows][kD]
  Elem* Ks = reinterpret_cast<Elem*>(smem + T::kK);   // [kStages][kTileKeys][kD]
  Elem* Vs = reinterpret_cast<Elem*>(smem + T::kV);   // [kStages][kTileKeys][kD]
  float* Ow = reinterpret_cast<float*>(smem + T::kO);  // [kMaxSlices][kRows][kMergeStride], at the end
  float* Lw = reinterpret_cast<float*>(smem + T::kLw);  // [kMaxSlices][kRows]
  float* Ww = reinterpret_cast<float*>(smem + T::kW);   // [kMaxSlices][kRows]
  float* Lrow = reinterpret_cast<float*>(smem + T::kLrow);  // [kRows]
  const int tid = threadIdx.x;
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  const int g = lane / 4, t4 = lane % 4;  // mma fragment coordinates (common/mma_sm80.cuh)
  // The warps' layout: warp w takes the 16 keys from slice_key0 of tile
  // tt + pair_tile of each step (one tile, or a pair in the narrow layout),
  // rows from warp_row0; it is slice `slice` of the split's merge, of
  // `slices`. Narrow: warp w has keys 16 w of the pair's 64, rows 0..15.
  const bool narrow = T::kCanNarrow && p.group_rows <= kMmaM;
  const int slices = narrow ? kMmaWarps : T::kSlices;
  const int slice = narrow ? warp : warp / T::kRowGroups;
  const int pair_tile = narrow ? warp / T::kSlices : 0;
  const int warp_row0 = narrow ? 0 : warp % T::kRowGroups * T::kWarpMTiles * kMmaM;  // first row of the warp
  const int slice_key0 = (narrow ? warp % T::kSlices : slice) * kWarpKeys;  // first key of the slice in its tile
  const sm80::LaneOffsets<kD> q_at(sm80::a_point(lane)), k_at(sm80::k_point(lane)),
      v_at(sm80::v_point(lane));
  const std::int64_t units = p.row_tiles * p.splits;
  let_next_kernel_launch();
  wait_for_previous_kernel();  // an append's writes to the cache (a no-op otherwise)

  for (std::int64_t kvh = blockIdx.y; kvh < p.kv_heads; kvh += gridDim.y) {
    const int nk = sequence_keys(p, kvh / p.H_kv);
    const Elem* K = p.K + head_base<kPaged>(p, kvh);  // [Nk, d] of this K/V head, or the pool
    const Elem* V = p.V + head_base<kPaged>(p, kvh);
    // The group's rows r = g Nq + i are consecutive rows of Q and O: its
    // query heads are consecutive (query_head).
    const std::int64_t row_base = query_head(kvh, 0, p.H, p.H_kv) * p.Nq;
    for (std::int64_t u = blockIdx.x; u < units; u += gridDim.x) {
      const std::int64_t tile = u / p.splits;
      const std::int64_t s = u % p.splits;
      const std::int64_t r0 = tile * kRows;
      const UnitSpan span = unit_span<T::kTileKeys>(p, r0, kRows, s, nk);
      const int rows = span.rows, k_lo = span.k_lo, k_hi = span.k_hi, tiles = span.tiles;
      // K/V tile tt into its stage; keys past k_hi zero. A tile with all its
      // keys inside the split, d the bucket's width and 16-byte rows (every
      // tile of a split but a ragged last one, at d = 64, 128, 256) takes
      // load_full_tile_async: a thread's first chunk address and constant
      // offsets, where load_tile works out each chunk's row, column, bounds
      // and source (in SASS at d = 128, ~75 of the ~410 instructions a warp
      // issued per full tile went to K's copies and as many to V's, ahead of
      // the tile's first ldmatrix; with it, ~48 for both).
      const bool full_width = p.vec && p.d == kD;
      auto load_kv = [&](int tt) {
        const int kt = k_lo + tt * T::kTileKeys;
        Elem* Kt = Ks + tt % T::kStages * T::kTileKeys * kD;  // [kTileKeys][kD]
        Elem* Vt = Vs + tt % T::kStages * T::kTileKeys * kD;  // [kTileKeys][kD]
        if (full_width && k_hi - kt >= T::kTileKeys) {
          const std::int64_t at = tile_offset<kPaged>(p, kvh, kt, kD);
          sm80::load_full_tile_async<Elem, T::kTileKeys, kD, T::kThreads>(Kt, K + at);
          sm80::load_full_tile_async<Elem, T::kTileKeys, kD, T::kThreads>(Vt, V + at);
        } else {
          const std::int64_t at = tile_offset<kPaged>(p, kvh, kt, p.d);
          sm80::load_tile<Elem, T::kTileKeys, kD, true, true, T::kThreads>(Kt, K + at, k_hi - kt,
                                                                          p.d, p.vec);
          sm80::load_tile<Elem, T::kTileKeys, kD, true, true, T::kThreads>(Vt, V + at, k_hi - kt,
                                                                          p.d, p.vec);
        }
      };

      __syncthreads();  // the previous unit is done with every shared array
      // Q's rows (zero past `rows` and past d) travel with K/V tile 0 in the
      // first cp.async group; kStages - 1 tiles start on their way.
      sm80::load_tile<Elem, kRows, kD, true, true, T::kThreads>(
          Qs, p.Q + (row_base + r0) * p.d, rows, p.d, p.vec);
#pragma unroll
      for (int tt = 0; tt < T::kStages - 1; ++tt) {
        if (tt < tiles) load_kv(tt);
        sm80::cp_async_commit();
      }

      // Keys each of the lane's rows (g and g + 8 of each m16 tile) sees in
      // this split: [k_lo, end). Padding rows (past `rows`) get the whole
      // split: their Q is zero, their scores finite, and they are never
      // written, so they need no mask. `unmasked` is the fewest keys any
      // valid row of the warp sees: tiles below it skip the mask.
      int end[T::kWarpMTiles][2];
      int unmasked = k_hi;
#pragma unroll
      for (int mt = 0; mt < T::kWarpMTiles; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = warp_row0 + mt * kMmaM + g + 8 * h;
          end[mt][h] = r < rows ? static_cast<int>(min(static_cast<std::int64_t>(k_hi),
                                                       visible_keys((r0 + r) % p.Nq, p.Nq, nk, p.causal)))
                                : k_hi;
          unmasked = min(unmasked, end[mt][h]);
        }
      }
      unmasked = __reduce_min_sync(kFullWarpMask, unmasked);

      // Algorithm 1's state for the warp's rows and key slice: O~ (fp32
      // accumulator fragments), m (log2 units) and l (this lane's share of
      // the row sum; the quad's four shares are added at the end).
      float O[T::kWarpMTiles][T::kOTiles][4];
      float m[T::kWarpMTiles][2], l[T::kWarpMTiles][2];
#pragma unroll
      for (int mt = 0; mt < T::kWarpMTiles; ++mt) {
#pragma unroll
        for (int ot = 0; ot < T::kOTiles; ++ot) {
#pragma unroll
          for (int e = 0; e < 4; ++e) O[mt][ot][e] = 0.0f;
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          m[mt][h] = -INFINITY;
          l[mt][h] = 0.0f;
        }
      }

      // Q's A fragments of the warp's m16 tiles, where they stay in registers
      // for the split (T::kQInRegisters): loaded once Q has landed, below.
      std::uint32_t Qa[T::kQHeldTiles][T::kQHeldSteps][4];

      // One K/V tile's work (lines 8-10 of Algorithm 1) for the warp's first
      // kLive m16 tiles. A warp whose rows are all padding skips them: with
      // two m16 tiles a warp (d = 64) and a row tile of at most 16 rows
      // (G Nq <= 16: Nq = 1 with up to 16 query heads a K/V head) the second
      // tile, and with one (d = 256, two warps a key slice) the warps of
      // rows 16..31: half the mma of S and of P~ V and half the exponentials
      // (d = 128 takes the narrow layout there, every warp on rows 0..15).
      // Their m, l and O~ stay as set above, and padding rows are never
      // written.
      //
      // The work is two steps, the mma of S (score_mma) and the rest
      // (softmax_pv), and the next K/V tile's copies are issued between them
      // (the tile loop below): the warp's copy instructions then issue while
      // the products run, instead of delaying the tile's first ldmatrix and
      // mma, and the first use of S waits for the products after them.
      //
      // S = Q K^T for the warp's rows and its 16 keys (line 8), summed over
      // the k-steps in kQKChains accumulators per n8 tile (step ks into
      // S_part[ks % kQKChains]), added up in softmax_pv: each mma waits for
      // the previous one on its accumulator, so the products of a tile
      // finish after kQKSteps / kQKChains mma latencies, not kQKSteps.
      using ScoreParts = float[T::kQKChains][T::kWarpMTiles][T::kSTiles][4];
      auto score_mma = [&](auto live_tiles, const Elem* Kb, ScoreParts& S_part) {
        constexpr int kLive = decltype(live_tiles)::value;
#pragma unroll
        for (int ch = 0; ch < T::kQKChains; ++ch) {
#pragma unroll
          for (int mt = 0; mt < kLive; ++mt) {
#pragma unroll
            for (int nt = 0; nt < T::kSTiles; ++nt) {
#pragma unroll
              for (int e = 0; e < 4; ++e) S_part[ch][mt][nt][e] = 0.0f;
            }
          }
        }
#pragma unroll
        for (int ks = 0; ks < T::kQKSteps; ++ks) {
          std::uint32_t kb[4];
          sm80::ldmatrix_x4(kb, Kb + k_at(slice_key0, ks * kMmaK));
          const std::uint32_t b_lo[2] = {kb[0], kb[1]}, b_hi[2] = {kb[2], kb[3]};
#pragma unroll
          for (int mt = 0; mt < kLive; ++mt) {
            std::uint32_t a[4];
            if constexpr (T::kQInRegisters) {
#pragma unroll
              for (int i = 0; i < 4; ++i) a[i] = Qa[mt][ks][i];
            } else {
              sm80::ldmatrix_x4(a, Qs + q_at(warp_row0 + mt * kMmaM, ks * kMmaK));
            }
            sm80::mma_m16n8k16<Elem>(S_part[ks % T::kQKChains][mt][0], a, b_lo);
            sm80::mma_m16n8k16<Elem>(S_part[ks % T::kQKChains][mt][1], a, b_hi);
          }
        }
      };
      auto softmax_pv = [&](auto live_tiles, const Elem* Vb, int kt, const ScoreParts& S_part) {
        constexpr int kLive = decltype(live_tiles)::value;
        float S[kLive][T::kSTiles][4];
#pragma unroll
        for (int mt = 0; mt < kLive; ++mt) {
#pragma unroll
          for (int nt = 0; nt < T::kSTiles; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              S[mt][nt][e] = S_part[0][mt][nt][e];
#pragma unroll
              for (int ch = 1; ch < T::kQKChains; ++ch) S[mt][nt][e] += S_part[ch][mt][nt][e];
            }
          }
        }
        // Scaled scores in log2 units; keys a row may not see are -inf
        // (set after the scale, so a zero or negative scale cannot turn them
        // into NaN or +inf).
        // Keys as offsets into the tile: kt + 63 itself may pass 2^31 - 1
        // when Nk is near it.
        const bool mask = unmasked - kt < slice_key0 + kWarpKeys;  // warp-uniform
#pragma unroll
        for (int mt = 0; mt < kLive; ++mt) {
#pragma unroll
          for (int nt = 0; nt < T::kSTiles; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              S[mt][nt][e] *= p.scale_log2;
              const int col = slice_key0 + nt * kMmaN + 2 * t4 + e % 2;
              if (mask && col >= end[mt][e / 2] - kt) S[mt][nt][e] = -INFINITY;
            }
          }
        }

        // Lines 9-10 up to the product: m_new, P~ = 2^(s - m_new) in place
        // of S, l and O~ rescaled by alpha = 2^(m - m_new). When no row max of
        // the warp moved, the rescale of O~ (d multiplies a row) is skipped.
        float alpha[kLive][2];
        bool moved = false;
#pragma unroll
        for (int mt = 0; mt < kLive; ++mt) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float mx = fmaxf(fmaxf(S[mt][0][2 * h], S[mt][0][2 * h + 1]),
                             fmaxf(S[mt][1][2 * h], S[mt][1][2 * h + 1]));
            // The row's other keys of the slice sit in the quad's other lanes.
            mx = fmaxf(mx, __shfl_xor_sync(kFullWarpMask, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(kFullWarpMask, mx, 2));
            const float m_new = fmaxf(m[mt][h], mx);
            // No key seen yet: subtract 0, so 2^(-inf - 0) = 0, not 2^(NaN).
            const float m_use = m_new == -INFINITY ? 0.0f : m_new;
            alpha[mt][h] = sm80::fast_exp2(m[mt][h] - m_use);
            moved = moved || m_new != m[mt][h];
            m[mt][h] = m_new;
            float sum = 0.0f;
#pragma unroll
            for (int nt = 0; nt < T::kSTiles; ++nt) {
#pragma unroll
              for (int e = 2 * h; e < 2 * h + 2; ++e) {
                S[mt][nt][e] = sm80::fast_exp2(S[mt][nt][e] - m_use);
                sum += S[mt][nt][e];
              }
            }
            l[mt][h] = alpha[mt][h] * l[mt][h] + sum;
          }
        }
        if (__any_sync(kFullWarpMask, moved)) {
#pragma unroll
          for (int mt = 0; mt < kLive; ++mt) {
#pragma unroll
            for (int ot = 0; ot < T::kOTiles; ++ot) {
#pragma unroll
              for (int e = 0; e < 4; ++e) O[mt][ot][e] *= alpha[mt][e / 2];
            }
          }
        }

        // O~ += P~ V (line 10): the two n8 score tiles, rounded to Elem, are
        // the A fragment of the slice's 16 keys (the register trick of
        // common/mma_sm80.cuh); V's B fragments by ldmatrix.trans.
        std::uint32_t pa[kLive][4];
#pragma unroll
        for (int mt = 0; mt < kLive; ++mt) {
          pa[mt][0] = sm80::pack2<Elem>(S[mt][0][0], S[mt][0][1]);
          pa[mt][1] = sm80::pack2<Elem>(S[mt][0][2], S[mt][0][3]);
          pa[mt][2] = sm80::pack2<Elem>(S[mt][1][0], S[mt][1][1]);
          pa[mt][3] = sm80::pack2<Elem>(S[mt][1][2], S[mt][1][3]);
        }
#pragma unroll
        for (int np = 0; np < T::kOTiles / 2; ++np) {
          std::uint32_t vb[4];
          sm80::ldmatrix_x4_trans(vb, Vb + v_at(slice_key0, np * 2 * kMmaN));
          const std::uint32_t b_lo[2] = {vb[0], vb[1]}, b_hi[2] = {vb[2], vb[3]};
#pragma unroll
          for (int mt = 0; mt < kLive; ++mt) {
            sm80::mma_m16n8k16<Elem>(O[mt][2 * np], pa[mt], b_lo);
            sm80::mma_m16n8k16<Elem>(O[mt][2 * np + 1], pa[mt], b_hi);
          }
        }
      };
      // m16 tiles of the warp that hold valid rows (warp-uniform).
      const int live = min(max((rows - warp_row0 + kMmaM - 1) / kMmaM, 0), T::kWarpMTiles);

      // Waits for this thread's copies until at most `wide` younger cp.async
      // groups (narrow: `narrow_left`) are pending, then meets the block, so
      // that every thread's copies are seen.
      auto wait_tiles = [&](auto wide, auto narrow_left) {
        if constexpr (T::kCanNarrow) {
          if (narrow) {
            sm80::cp_async_wait<decltype(narrow_left)::value>();
          } else {
            sm80::cp_async_wait<decltype(wide)::value>();
          }
        } else {
          sm80::cp_async_wait<decltype(wide)::value>();
        }
        __syncthreads();
      };
      // Q and tile 0 (the first group; narrow, tiles 0 and 1) have arrived
      // for this thread (at most kStages - 2 younger groups pending, narrow
      // kStages - 3). The tile loop below ends with the same wait and
      // barrier for its next step: one barrier a step, and Q's fragments can
      // be taken before the loop.
      wait_tiles(std::integral_constant<int, T::kStages - 2>{},
                 std::integral_constant<int, T::kStages - 3>{});
      if constexpr (T::kQInRegisters) {
        if (tiles > 0) {
#pragma unroll
          for (int mt = 0; mt < T::kWarpMTiles; ++mt) {
            if (mt >= live) continue;  // warp-uniform: padding rows are never multiplied
#pragma unroll
            for (int ks = 0; ks < T::kQKSteps; ++ks) {
              sm80::ldmatrix_x4(Qa[mt][ks], Qs + q_at(warp_row0 + mt * kMmaM, ks * kMmaK));
            }
          }
        }
      }

      // Starts the copies of tile t, if the split has it, as one cp.async
      // group: one group per tile index, so that the waits count tiles.
      auto issue_tile = [&](int t) {
        if (t < tiles) load_kv(t);
        sm80::cp_async_commit();
      };
      const int step = narrow ? 2 : 1;  // K/V tiles a barrier
      for (int tt = 0; tt < tiles; tt += step) {
        // The warp's tile of this step, and whether the split has it (the
        // second tile of a narrow pair may be past the split's end).
        const int tw = tt + pair_tile;
        const bool has_tile = tw < tiles;
        const int buf = tw % T::kStages;
        const Elem* Kb = Ks + buf * T::kTileKeys * kD;  // [kTileKeys][kD]
        const Elem* Vb = Vs + buf * T::kTileKeys * kD;  // [kTileKeys][kD]
        const int kt = k_lo + tw * T::kTileKeys;  // the tile's first key
        // Runs run(m_tiles) over the warp's live m16 tiles of this step's
        // tile, as a compile-time count: all of them, or the first alone
        // (warp-uniform; a warp of padding rows, or without a tile, skips).
        auto on_live_tiles = [&](auto run) {
          if (has_tile && live == T::kWarpMTiles) {
            run(std::integral_constant<int, T::kWarpMTiles>{});
          } else if (has_tile && T::kWarpMTiles > 1 && live == 1) {
            run(std::integral_constant<int, 1>{});
          }
        };
        ScoreParts S_part;
        on_live_tiles([&](auto m_tiles) { score_mma(m_tiles, Kb, S_part); });
        // The copies of the tiles up to tt + kStages - 1 go into the stages
        // of the tiles before tt, which every warp was done with at the
        // barrier that ended the previous step (or, at the first, stages
        // not used yet): one tile a step, or narrow from the second step on
        // two. Every warp, padding or not, copies its share and meets the
        // barriers.
        if (narrow && tt > 0) issue_tile(tt + T::kStages - 2);
        issue_tile(tt + T::kStages - 1);
        on_live_tiles([&](auto m_tiles) { softmax_pv(m_tiles, Vb, kt, S_part); });
        // The next step's tiles have arrived for this thread (tile tt + 1,
        // or narrow tt + 2 and tt + 3: groups through tt + kStages - 1 are
        // committed); the barrier also says every warp is done with this
        // step's tiles.
        wait_tiles(std::integral_constant<int, T::kStages - 2>{},
                   std::integral_constant<int, T::kStages - 4>{});
      }

      // The warps' partials: L_w = (m + log2 l) ln 2 and O_w = O~ / l per
      // row, into the K/V stages (every copy landed, every warp done).
      sm80::cp_async_wait<0>();
      __syncthreads();
#pragma unroll
      for (int mt = 0; mt < T::kWarpMTiles; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float sum = l[mt][h];
          sum += __shfl_xor_sync(kFullWarpMask, sum, 1);
          sum += __shfl_xor_sync(kFullWarpMask, sum, 2);
          const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
          const int r = warp_row0 + mt * kMmaM + g + 8 * h;
          float* o_row = Ow + (slice * kRows + r) * T::kMergeStride;
#pragma unroll
          for (int ot = 0; ot < T::kOTiles; ++ot) {
            *reinterpret_cast<float2*>(o_row + ot * kMmaN + 2 * t4) =
                make_float2(O[mt][ot][2 * h] * inv, O[mt][ot][2 * h + 1] * inv);
          }
          if (t4 == 0) Lw[slice * kRows + r] = sum == 0.0f ? -INFINITY : (m[mt][h] + log2f(sum)) * kLn2;
        }
      }
      __syncthreads();
      // The merge kernel's rule over the slices, per row: L, then each
      // slice's weight exp(L_w - L).
      if (tid < rows) {
        float L = -INFINITY;
        for (int w = 0; w < slices; ++w) L = lse_merge(L, Lw[w * kRows + tid]);
        for (int w = 0; w < slices; ++w) Ww[w * kRows + tid] = partial_weight(Lw[w * kRows + tid], L);
        Lrow[tid] = L;
      }
      __syncthreads();
      // O = sum_w weight_w O_w: the partial of this split (fp32) or, with one
      // split, the answer (Elem), written by write_rows (out: [rows, d], the
      // tile's first row; p.splits is uniform, so the branch is taken once).
      auto write_rows = [&](auto* out) {
        // Each thread keeps one group of kVec4 columns and takes every
        // kVecRowStep-th row: the weights are read once a row for 4 columns,
        // O_w rows as float4 (kMergeStride keeps them 16-byte aligned), one
        // vector store, and neither division nor 64-bit index math. One
        // element a pass (scalar LDS, int64 addresses, a scalar store) made
        // this loop the most sampled part of the split kernel at short MQA
        // decodes, where one warp a scheduler waits on each dependent
        // instruction (docs/results/tuning_09/, runs 15 and 16).
        constexpr int kGroups = kD / kVec4;  // float4 groups of a row
        constexpr int kVecRowStep = T::kThreads / kGroups;
        static_assert(T::kThreads % kGroups == 0, "a thread keeps its columns in every row it takes");
        static_assert(T::kMergeStride % kVec4 == 0, "O_w rows stay 16-byte aligned");
        const int c = tid % kGroups * kVec4;
        // Vector stores need d a multiple of 4 (each row then starts aligned
        // when the first does); otherwise (d bucketed, e.g. 100 in 128) one
        // column at a time.
        const bool vec = p.d % kVec4 == 0 &&
                         reinterpret_cast<std::uintptr_t>(out) % (kVec4 * sizeof(*out)) == 0;
        if (vec) {
          if (c >= p.d) return;  // the whole group is past d
          // Two rows a trip: their shared-memory reads are in flight together.
#pragma unroll 2
          for (int r = tid / kGroups; r < rows; r += kVecRowStep) {
            float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int w = 0; w < T::kMaxSlices; ++w) {
              if (w < slices) {
                const float wt = Ww[w * kRows + r];
                const float4 ow = *reinterpret_cast<const float4*>(Ow + (w * kRows + r) * T::kMergeStride + c);
                o.x += wt * ow.x;
                o.y += wt * ow.y;
                o.z += wt * ow.z;
                o.w += wt * ow.w;
              }
            }
            store_vec4(out + r * p.d + c, o);
          }
        } else {
          for (int e = tid; e < rows * kD; e += T::kThreads) {
            const int r = e / kD, col = e % kD;
            if (col >= p.d) continue;
            float o = 0.0f;
#pragma unroll
            for (int w = 0; w < T::kMaxSlices; ++w) {
              if (w < slices) o += Ww[w * kRows + r] * Ow[(w * kRows + r) * T::kMergeStride + col];
            }
            out[r * p.d + col] = from_float<std::remove_pointer_t<decltype(out)>>(o);
          }
        }
      };
      const std::int64_t row0 = row_base + r0;  // the tile's first row of O
      if (p.splits == 1) write_rows(p.O + row0 * p.d);
      else write_rows(p.O_part + (s * p.heads * p.Nq + row0) * p.d);  // partials stay fp32
      if (tid < rows) {
        const std::int64_t row = row_base + r0 + tid;
        if (p.splits == 1) p.L[row] = Lrow[tid];
        else p.L_part[s * p.heads * p.Nq + row] = Lrow[tid];
      }
    }
  }
}

// merge_warps(splits) warps per row of O (a block holds kMergeWarps /
// merge_warps rows): L = logsumexp of the partials' L_s, then
// O = sum_s exp(L_s - L) O_s, rounded to Elem once.
//
// Every warp of a row finds L over all the splits (lane l merges splits l,
// l + 32, ..., read in one batch, then a butterfly). Warp w of the row then
// sums its run of the splits (merge_run), and its lanes keep their columns
// of O in registers (4 consecutive ones per 128 columns where d allows, one
// 16-byte read a split; else c = lane + 32 k): a split's O_s row is one
// coalesced read, merge_splits splits' reads are in flight together, and
// the weight exp(L_s - L) is computed once per split (by one lane, shuffled
// to the others). The row's first warp adds the other warps' sums (through
// shared memory, in warp order) and writes O and L. With one warp a row
// walking every split, MQA on one sequence (32 rows,
// 128 splits) had 32 warps on the whole GPU, each waiting on 8 rounds of
// reads one after another; the L loop, one load per iteration, waited on 4
// more. partial_weight(-inf, L) = 0 also when L = -inf (no split saw a key).
//
// At least two blocks an SM (at most 128 registers a thread; 143 without the
// bound): with many rows, one warp each, 16 warps an SM have rows of O_s in
// flight rather than 8.
template <int kD, typename Elem>
__global__ void __launch_bounds__(kMergeThreads, 2) merge_kernel(const Params<Elem> p) {
  static_assert(kMergeLanes == kWarpSize, "the plan's merge lanes are a warp");
  constexpr int kCols = kD / kWarpSize;  // columns of O per lane
  constexpr int kSplits = merge_splits(kD);  // splits whose O_s rows are read together
  constexpr int kLBatch = static_cast<int>(kMaxSplits / kWarpSize);  // L_s a lane reads at once: every split's in one batch
  // A lane's columns as kVec4 consecutive ones (one 16-byte load per split),
  // where it has a multiple of 4 of them: at d = 128 a split's row was 4
  // scalar loads, each with 64-bit index math and two predicates, half the
  // merge's instructions (docs/results/tuning_09/, run 15).
  constexpr int kVecCols = kCols % kVec4 == 0 ? kVec4 : 1;
  static_assert(kSplits <= kWarpSize, "a lane finds the weight of one split of a batch");
  __shared__ float O_warp[kMergeWarps][kD];  // each warp's sum over its run, for the row's first warp
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int row_warps = merge_warps(p.splits, kD);
  const int rows_per_block = kMergeWarps / row_warps;
  const int run_warp = warp % row_warps;  // which run of the splits this warp sums
  const std::int64_t run = merge_run(p.splits, row_warps);
  const std::int64_t s_lo = run_warp * run;
  const std::int64_t s_hi = min(s_lo + run, p.splits);
  const std::int64_t rows = p.heads * p.Nq;
  const std::int64_t split_stride = rows * p.d;  // floats from O_s to O_{s+1} of a row
  // Vector reads and writes need d a multiple of kVecCols (every row then
  // starts aligned: the workspace is 256-byte aligned) and O aligned as
  // store_vec4 wants; otherwise (d bucketed, e.g. 100 in 128) one column at
  // a time. Uniform over the grid, so every thread takes the same path.
  const bool vec = kVecCols > 1 && p.d % kVecCols == 0 &&
                   reinterpret_cast<std::uintptr_t>(p.O) % (kVecCols * sizeof(Elem)) == 0;
  wait_for_previous_kernel();
  // The merge with the lane's columns in groups of kW: column
  // j kWarpSize kW + lane kW + v of O is o[j kW + v] (kW = 1: lane + 32 j).
  auto merge_rows = [&](auto vec_width) {
    constexpr int kW = decltype(vec_width)::value;
    constexpr int kGroups = kCols / kW;
    int col[kGroups];        // first column of each group
    bool col_ok[kGroups];    // the group is inside d (whole: d % kW == 0)
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
      col[j] = (j * kWarpSize + lane) * kW;
      col_ok[j] = col[j] < p.d;
    }
    // Every thread of the block takes the same trips (row0 is per block), so
    // the barriers below are met by all; warps past the last row only meet them.
    for (std::int64_t row0 = blockIdx.x * static_cast<std::int64_t>(rows_per_block); row0 < rows;
         row0 += static_cast<std::int64_t>(gridDim.x) * rows_per_block) {
      const std::int64_t row = row0 + warp / row_warps;
      const bool valid = row < rows;
      float o[kCols];
#pragma unroll
      for (int k = 0; k < kCols; ++k) o[k] = 0.0f;
      float L = -INFINITY;
      if (valid) {
        const float* Ls = p.L_part + row;  // [splits], stride rows
        // L: each lane merges every 32nd split, read in batches of kLBatch,
        // then the lanes merge theirs in a butterfly (associative:
        // partial_merge.h). A lane merges only the splits there are: with a
        // few splits, merging -inf for the rest (no change to L, but an exp
        // and a log1p each) cost the merge a chain of idle lse_merges.
        for (std::int64_t s0 = lane; s0 < p.splits; s0 += kWarpSize * kLBatch) {
          float Lb[kLBatch];
#pragma unroll
          for (int u = 0; u < kLBatch; ++u) {
            const std::int64_t s = s0 + u * kWarpSize;
            Lb[u] = s < p.splits ? Ls[s * rows] : -INFINITY;
          }
#pragma unroll
          for (int u = 0; u < kLBatch; ++u) {
            if (s0 + u * kWarpSize < p.splits) L = lse_merge(L, Lb[u]);
          }
        }
#pragma unroll
        for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
          L = lse_merge(L, __shfl_xor_sync(kFullWarpMask, L, offset));
        }
        // The warp's run, kSplits splits at a time: all their reads first,
        // then the sums (in split order), so that the reads are in flight
        // together. No read is predicated: a lane's columns past d read
        // column 0 (never written back), and the splits past the run in the
        // last batch read its last split again with weight 0 (O_s is finite).
        // Pointers step from split to split instead of a 64-bit product a read.
        // Lane u finds split s0 + u's weight and shuffles it to the others:
        // when every lane read all kSplits L_s and took their exps, those were
        // ~20 instructions a split, a third of the batch.
        int col_read[kGroups];
#pragma unroll
        for (int j = 0; j < kGroups; ++j) col_read[j] = col_ok[j] ? col[j] : 0;
        const float* Os = p.O_part + (s_lo * rows + row) * p.d;  // [d]: this split's O_s of the row
        const float* L_lane = Ls + (s_lo + lane) * rows;          // split s0 + lane's L_s of the row
        for (std::int64_t s0 = s_lo; s0 < s_hi; s0 += kSplits) {
          const int live = static_cast<int>(min(static_cast<std::int64_t>(kSplits), s_hi - s0));
          const float L_own = lane < live ? *L_lane : -INFINITY;  // weight 0 past the run
          float Ou[kSplits][kCols];
#pragma unroll
          for (int u = 0; u < kSplits; ++u) {
#pragma unroll
            for (int j = 0; j < kGroups; ++j) {
              float v[kW];
              load_floats(Os + col_read[j], v);
#pragma unroll
              for (int i = 0; i < kW; ++i) Ou[u][j * kW + i] = v[i];
            }
            if (u + 1 < live) Os += split_stride;
          }
          Os += split_stride;
          L_lane += kSplits * rows;
          const float w_own = partial_weight(L_own, L);
#pragma unroll
          for (int u = 0; u < kSplits; ++u) {
            const float w = __shfl_sync(kFullWarpMask, w_own, u);
#pragma unroll
            for (int k = 0; k < kCols; ++k) o[k] += w * Ou[u][k];
          }
        }
      }
      if (row_warps > 1) {  // block-uniform
        if (valid && run_warp > 0) {
#pragma unroll
          for (int k = 0; k < kCols; ++k) O_warp[warp][lane + k * kWarpSize] = o[k];
        }
        __syncthreads();
        if (valid && run_warp == 0) {
          for (int v = 1; v < row_warps; ++v) {
#pragma unroll
            for (int k = 0; k < kCols; ++k) o[k] += O_warp[warp + v][lane + k * kWarpSize];
          }
        }
        __syncthreads();  // O_warp is free for the next rows
      }
      if (valid && run_warp == 0) {
        Elem* O = p.O + row * p.d;  // [d]
#pragma unroll
        for (int j = 0; j < kGroups; ++j) {
          if (!col_ok[j]) continue;
          if constexpr (kW == kVec4) {
            store_vec4(O + col[j], make_float4(o[j * kW], o[j * kW + 1], o[j * kW + 2], o[j * kW + 3]));
          } else {
            O[col[j]] = from_float<Elem>(o[j]);
          }
        }
        if (lane == 0) p.L[row] = L;
      }
    }
  };
  if (vec) merge_rows(std::integral_constant<int, kVecCols>{});
  else merge_rows(std::integral_constant<int, 1>{});
}

// The fp32 kernel for a group of group_rows rows: the wide or the narrow
// layout (fp32_wide).
template <int kD, typename Elem, bool kPaged = false>
auto fp32_kernel(std::int64_t group_rows) {
  return fp32_wide(group_rows) ? split_kernel<kD, kFp32TileRows, kPaged, Elem>
                               : split_kernel<kD, 1, kPaged, Elem>;
}

template <int kD, typename Elem>
void launch_split(const Params<Elem>& prm, Stream stream) {
  const dim3 grid(static_cast<unsigned>(std::min(prm.row_tiles * prm.splits, kMaxGridX)),
                  static_cast<unsigned>(std::min(prm.kv_heads, kMaxGridY)));
  const auto kernel = prm.cache.block_table ? fp32_kernel<kD, Elem, true>(prm.group_rows)
                                            : fp32_kernel<kD, Elem, false>(prm.group_rows);
  launch_dependent(kernel, grid, kThreads, Smem<kD, Elem>::kBytes, stream, "stage 09 split_kernel",
                   prm, prm.new_keys > 0);
}

template <int kD, typename Elem>
void launch_split_mma(const Params<Elem>& prm, Stream stream) {
  const dim3 grid(static_cast<unsigned>(std::min(prm.row_tiles * prm.splits, kMaxGridX)),
                  static_cast<unsigned>(std::min(prm.kv_heads, kMaxGridY)));
  const auto kernel = prm.cache.block_table ? split_mma_kernel<kD, true, Elem>
                                            : split_mma_kernel<kD, false, Elem>;
  launch_dependent(kernel, grid, MmaTiles<kD>::kThreads, MmaTiles<kD>::kBytes, stream,
                   "stage 09 split_mma_kernel", prm, prm.new_keys > 0);
}

// The merge kernel, on sm_90 with programmatic stream serialization: it may
// start while the split kernel's last blocks run (let_next_kernel_launch,
// wait_for_previous_kernel), so that its launch does not wait for their end.
template <int kD, typename Elem>
void launch_merge(const Params<Elem>& prm, Stream stream) {
  const std::int64_t rows_per_block = kMergeWarps / merge_warps(prm.splits, kD);
  const std::int64_t blocks = (prm.heads * prm.Nq - 1) / rows_per_block + 1;
  launch_dependent(merge_kernel<kD, Elem>, dim3(static_cast<unsigned>(std::min(blocks, kMaxGridX))),
                   kMergeThreads, 0, stream, "stage 09 merge_kernel", prm, true);
}

// fp32 on the CUDA cores (split_kernel), bf16 and fp16 on the tensor cores
// (split_mma_kernel), for the head-dimension bucket kD.
template <int kD, typename Elem>
void launch_bucket(const Params<Elem>& prm, Stream stream) {
  if constexpr (std::is_same_v<Elem, float>) {
    launch_split<kD>(prm, stream);
  } else {
    launch_split_mma<kD>(prm, stream);
  }
}

// Blocks of the split kernel for bucket kD one SM of the current device
// holds, by the occupancy API (after the same opt-in to its shared memory as
// its launch).
template <typename Kernel>
int occupancy(Kernel kernel, int threads, std::size_t smem_bytes) {
  const int smem = static_cast<int>(smem_bytes);
  cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
             "stage 09: cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  int blocks = 0;
  cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem),
             "stage 09: cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  return blocks;
}

template <int kD, typename Elem>
int occupancy(std::int64_t group_rows) {
  if constexpr (std::is_same_v<Elem, float>) {
    return occupancy(fp32_kernel<kD, Elem>(group_rows), kThreads, Smem<kD, Elem>::kBytes);
  } else {
    return occupancy(split_mma_kernel<kD, false, Elem>, MmaTiles<kD>::kThreads,
                     MmaTiles<kD>::kBytes);
  }
}

// Rows of the append kernel's block: one warp a new token's row of K and V.
constexpr int kAppendRowsPerBlock = 8;
constexpr int kAppendThreads = kAppendRowsPerBlock * kWarpSize;

// The new tokens' keys and values into the cache: row (kvh, i) of K_new and
// V_new to key seqlens[b] + i of K/V head kvh, in the cache's layout; keys
// past the capacity are left out (split_kv.h: the caller leaves room). One
// warp a row, its lanes over the d columns; a separate kernel before the
// split kernel, so that every split reads the cache alone. The split kernel
// is launched early behind it (launch_dependent) and waits for its writes.
template <typename Elem>
__global__ void append_kernel(const Params<Elem> p,
                              Elem* K_cache,      // the cache's K, in p.cache's layout
                              Elem* V_cache,      // the cache's V, the same layout
                              const Elem* K_new,  // [B, H_kv, Nq, d]
                              const Elem* V_new)  // [B, H_kv, Nq, d]
{
  let_next_kernel_launch();  // the split kernel's blocks may be placed now; they wait for our end
  const std::int64_t rows = p.kv_heads * p.Nq;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * kAppendRowsPerBlock;
  for (std::int64_t row = blockIdx.x * static_cast<std::int64_t>(kAppendRowsPerBlock) +
                          threadIdx.x / kWarpSize;
       row < rows; row += step) {
    const std::int64_t kvh = row / p.Nq;
    const std::int64_t key = p.seqlens[kvh / p.H_kv] + row % p.Nq;
    if (key < 0 || key >= p.Nk) continue;
    const std::int64_t to = cache_row(p.cache, kvh, p.H_kv, p.Nk, key) * p.d;
    for (int c = static_cast<int>(threadIdx.x % kWarpSize); c < p.d; c += kWarpSize) {
      K_cache[to + c] = K_new[row * p.d + c];
      V_cache[to + c] = V_new[row * p.d + c];
    }
  }
}

// What the split kernels read: the cache (K, V in `layout`), each sequence's
// keys before the call (seqlens null: Nk each) and the keys appended since
// (0 or Nq).
struct Source {
  const void* K;
  const void* V;
  const std::int32_t* seqlens;
  CacheLayout layout;
  int new_keys;
};

template <typename Elem>
void launch(const Problem& p, const ForwardTensors& t, const Plan& plan, const Source& src,
            Stream stream) {
  Params<Elem> prm{};
  prm.Q = static_cast<const Elem*>(t.Q);
  prm.K = static_cast<const Elem*>(t.K);
  prm.V = static_cast<const Elem*>(t.V);
  prm.O = static_cast<Elem*>(t.O);
  prm.L = t.L;
  prm.O_part = static_cast<float*>(t.workspace);
  prm.L_part = plan.splits > 1 ? prm.O_part + plan.splits * p.q_elems() : nullptr;
  prm.seqlens = src.seqlens;
  prm.cache = src.layout;
  prm.new_keys = src.new_keys;
  prm.H = p.H;
  prm.H_kv = p.kv_heads();
  prm.kv_heads = p.B * p.kv_heads();
  prm.heads = p.heads();
  prm.Nq = static_cast<int>(p.Nq);
  prm.Nk = static_cast<int>(p.Nk);
  prm.d = static_cast<int>(p.d);
  prm.group_rows = plan.group_rows;
  prm.row_tiles = plan.row_tiles;
  prm.splits = plan.splits;
  prm.keys_per_split = plan.keys_per_split;
  prm.scale_log2 = static_cast<float>(p.softmax_scale() * kLog2e);
  prm.causal = p.causal;
  prm.vec = float4_ok(p, t);
  if (plan.tile_rows == kWideRows) {  // the Hopper kernel (wide_layout): 16 bits, d = 128
#if FLASHSTEP_SM90A_BUILT
    if constexpr (!std::is_same_v<Elem, float>) launch_split_wgmma<Elem>(prm, stream);
#endif
  } else {
    switch (head_dim_bucket(p.d)) {  // d is zero-padded up to the bucket inside the tiles
      case 64: launch_bucket<64>(prm, stream); break;
      case 128: launch_bucket<128>(prm, stream); break;
      default: launch_bucket<256>(prm, stream); break;
    }
  }
  if (plan.splits > 1) {
    switch (head_dim_bucket(p.d)) {
      case 64: launch_merge<64>(prm, stream); break;
      case 128: launch_merge<128>(prm, stream); break;
      default: launch_merge<256>(prm, stream); break;
    }
  }
}

// Whether p, with the tensors of t, runs on the Hopper kernel: a wide group
// (wide_group: 16 bits, d = 128, more than kRows rows), 16-byte rows and
// aligned tensors (its copies are 16-byte cp.async only), and a device that
// runs the sm_90a code this build has.
bool wide_layout(const Problem& p, const ForwardTensors& t) {
#if FLASHSTEP_SM90A_BUILT
  return wide_group(p.dtype, head_dim_bucket(p.d), p.group() * p.Nq) && float4_ok(p, t) &&
         device_takes_wgmma();
#else
  (void)p;
  (void)t;
  return false;
#endif
}

// The split kernel, and the merge with more than one split, on Q, O, L and
// the workspace of t and the keys and values of src.
void run(const Problem& p, const ForwardTensors& t, const Source& src, Stream stream, bool split) {
  validate(p);
  ForwardTensors read = t;  // float4_ok checks the alignment of the K and V read
  read.K = src.K;
  read.V = src.V;
  if (!read.Q || !read.K || !read.V || !read.O || !read.L) {
    throw Error("stage 09: null tensor pointer");
  }
  const Plan plan = make_plan(p, device_sm_count(), split, src.layout.block_table != nullptr,
                              wide_layout(p, read));
  if (plan.splits > 1 && !t.workspace) throw Error("stage 09: null workspace with several splits");
  with_element_type(p.dtype, [&](auto elem) {
    launch<decltype(elem)>(p, read, plan, src, stream);
  });
}

// The append kernel for cache's new tokens (cache.K_new, cache.V_new).
void launch_append(const Problem& p, const KvCache& cache, Stream stream) {
  const std::int64_t rows = p.B * p.kv_heads() * p.Nq;
  const std::int64_t blocks = std::min((rows - 1) / kAppendRowsPerBlock + 1, kMaxGridX);
  with_element_type(p.dtype, [&](auto elem) {
    using Elem = decltype(elem);
    Params<Elem> prm{};
    prm.seqlens = cache.seqlens;
    prm.cache = cache.layout;
    prm.H_kv = p.kv_heads();
    prm.kv_heads = p.B * p.kv_heads();
    prm.Nq = static_cast<int>(p.Nq);
    prm.Nk = static_cast<int>(p.Nk);
    prm.d = static_cast<int>(p.d);
    append_kernel<Elem><<<static_cast<unsigned>(blocks), kAppendThreads, 0, stream>>>(
        prm, static_cast<Elem*>(cache.K), static_cast<Elem*>(cache.V),
        static_cast<const Elem*>(cache.K_new), static_cast<const Elem*>(cache.V_new));
  });
  check_launch("stage 09 append_kernel");
}

}  // namespace

int device_resident_blocks(const Problem& p) {
  const std::int64_t group_rows = p.group() * p.Nq;
#if FLASHSTEP_SM90A_BUILT
  if (wide_group(p.dtype, head_dim_bucket(p.d), group_rows) && device_takes_wgmma()) {
    return wgmma_occupancy();
  }
#endif
  int blocks = 0;
  with_element_type(p.dtype, [&](auto elem) {
    using Elem = decltype(elem);
    switch (head_dim_bucket(p.d)) {
      case 64: blocks = occupancy<64, Elem>(group_rows); break;
      case 128: blocks = occupancy<128, Elem>(group_rows); break;
      default: blocks = occupancy<256, Elem>(group_rows); break;
    }
  });
  return blocks;
}

void forward(const Problem& p, const ForwardTensors& t, Stream stream) {
  run(p, t, {t.K, t.V, nullptr, {}, 0}, stream, true);
}

void forward_one_block(const Problem& p, const ForwardTensors& t, Stream stream) {
  run(p, t, {t.K, t.V, nullptr, {}, 0}, stream, false);
}

void forward_kvcache(const Problem& p, const ForwardTensors& t, const std::int32_t* cache_seqlens,
                     Stream stream, bool split) {
  if (!cache_seqlens) throw Error("stage 09: null cache_seqlens");
  run(p, t, {t.K, t.V, cache_seqlens, {}, 0}, stream, split);
}

void forward_kvcache(const Problem& p, const ForwardTensors& t, const KvCache& cache,
                     Stream stream, bool split) {
  validate(p);
  validate_kvcache(p, t.K, t.V, cache.K, cache.V, cache.seqlens, cache.layout, cache.K_new,
                   cache.V_new);
  const bool appends = cache.K_new != nullptr;
  if (appends) launch_append(p, cache, stream);
  run(p, t, {cache.K, cache.V, cache.seqlens, cache.layout, appends ? static_cast<int>(p.Nq) : 0},
      stream, split);
}

}  // namespace flashstep::split_kv
