// Stage 08's kernels: FlashAttention-2's forward (Dao 2023, Algorithm 1) on
// Hopper's asynchronous tensor cores, with FlashAttention-3's ideas (Shah et
// al. 2024, §3) one ablation step at a time (hopper_tiles.h): wgmma, TMA
// copies completing on mbarriers (hopper_kernel, steps 1-2), then a producer
// warpgroup beside two or three consumers, ping-pong between them and the softmax
// under the next products (hopper_ws_kernel, steps 3-5, further down).
//
// Steps 1-2: one thread block per (Q block i of 64 rows, head), one
// warpgroup of 4 warps per block. A warpgroup issues each product as one
// chain of wgmma instructions that reads Qi, Kj and Vj straight from shared
// memory through matrix descriptors (no ldmatrix, no fragments loaded by the
// threads):
//
//   S_ij [64 x Bc]  = Qi [64 x d] Kj^T          d/16 x wgmma m64nBck16, A and B in smem
//   O~_i [64 x d]  += P~_ij [64 x Bc] Vj         d/No chains x Bc/16 x wgmma m64nNok16
//                                                (No = min(d, 128)), A (P~) in
//                                                registers, B (Vj) in smem, transposed
//
// Bc = key_tile(d bucket) keys per K/V tile: 128 at d = 64 and 128 (one
// m64n128k16 chain for S, 8 k16 steps for P~ Vj), 64 at d = 256; No =
// out_tile(d bucket) columns of O~ per wgmma (hopper_tiles.h says why).
//
// Warp w of the warpgroup holds rows 16w .. 16w + 15 of S and O~ (common/
// sm90_layout.h draws which thread holds which element): within a warp the
// layout is mma.sync's, so the online softmax is stage 07's with one m16
// tile per warp, and P~ feeds the next product from the S registers.
//
// Algorithm 1, line by line:
//   line 4   load Qi                          load_tile / TMA (prologue)
//   line 5   O~ = 0, l = 0, m = -inf          the accumulators
//   line 6   for j over K/V blocks            last visited block first
//   line 7     load Kj, Vj                    load_tile / TMA, kStages deep
//   line 8     S_ij = Qi Kj^T                 qk_product
//   line 9-10  online softmax                 online_softmax
//   line 10    O~ += P~_ij Vj                 pv_product
//   line 12-13 O_i = O~ / l, L_i              write_output (write_output_tma from step 3)
#pragma once

#include <cuda.h>  // CUtensorMap (the type only: no driver call is linked)
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/mma_sm80.cuh"
#include "common/reduce.cuh"
#include "common/sm90_layout.h"
#include "common/wgmma_sm90.cuh"
#include "hopper_tiles.h"

namespace flashstep::hopper {

/// Kernel arguments. Elem is __nv_bfloat16 or __half.
template <typename Elem>
struct Params {
  const Elem* Q;  // [heads, Nq, d]
  const Elem* K;  // [heads / group, Nk, d]
  const Elem* V;  // [heads / group, Nk, d]
  Elem* O;        // [heads, Nq, d]
  float* L;       // [heads, Nq]
  std::int64_t heads;  // B * H
  // Query heads per K/V head (H / H_kv; 1 without grouped heads): query head
  // h reads K/V head h / group, which is kv_head_of(h, H, H_kv) since a
  // group's heads are consecutive and never straddle two batches. A 32-bit
  // division: the producer's 32 registers hold no 64-bit one.
  int group;
  int Nq, Nk, d;
  bool causal;
  // Steps 3-5's units of work (WsCursor; ws_schedule fills them): units
  // per head in the first paired_units, then one a head; units in all.
  int units_per_head = 0, paired_units = 0, units = 0;
  float scale_log2;  // |softmax scale| * log2(e), > 0
  bool negate_q;     // the scale is negative: wgmma's imm-scale-a = -1 on Qi
  bool vec;          // d % 8 == 0 and 16-byte aligned tensors: 16-byte copies
  bool pairs;        // d even: O written two elements at a time
  // Steps 3-5's causal kernel at d = 64 (WsLptConfig, LptCursor): heads per
  // section of the order, and the counter the blocks take items from (0 at
  // launch; the block that takes the last item sets it back to 0).
  int section_heads = 0;
  int* item_counter = nullptr;
};

/// What a (d bucket, TMA or not) pair fixes at compile time.
template <int kHeadDim_, bool kTma_>
struct Config {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kTma = kTma_;
  static constexpr int kBc = key_tile(kHeadDim);                        // keys per K/V tile
  static constexpr int kSRegs = kBc / 2;  // S's fp32 accumulators per thread (m64 x kBc)
  static constexpr int kColBlocks = kHeadDim / sm90::kSwizzleRowElems;  // 64-wide blocks of d
  static constexpr int kQKSteps = kHeadDim / sm90::kWgmmaK;            // k16 steps of Qi Kj^T
  static constexpr int kPVSteps = kBc / sm90::kWgmmaK;                  // k16 steps of P~ Vj
  static constexpr int kOutN = out_tile(kHeadDim);        // columns of O~ per P~ Vj wgmma
  static constexpr int kOutChains = kHeadDim / kOutN;     // P~ Vj chains, one per kOutN columns
  static constexpr int kORegs = kOutN / 2;                // O~'s fp32 per thread per chain
  static constexpr int kKVBuffers = kTma ? kStages : 1;
  // Shared memory in bytes: Qi, then kKVBuffers of (Kj, Vj), each a
  // multiple of the 1024-byte swizzle atom; then the mbarriers.
  static constexpr int kQBytes = kBr * kHeadDim * 2;
  static constexpr int kKVBytes = kBc * kHeadDim * 2;
  static constexpr int kBarrierBytes = 8 * (1 + kStages);
  // + 1024: the dynamic shared memory is aligned up to a swizzle atom inside.
  static constexpr int kSmemBytes =
      sm90::kSwizzleAtomBytes + kQBytes + 2 * kKVBuffers * kKVBytes + kBarrierBytes;
  static_assert(kHeadDim % sm90::kSwizzleRowElems == 0, "d is padded to whole column blocks");
  static_assert(kSmemBytes <= sm90::kMaxSmemBytesPerBlock, "Qi and the K/V buffers fit one block");
  static_assert(kBr == sm90::kWgmmaM && kThreads == sm90::kWarpgroupThreads,
                "one warpgroup, one m64 wgmma tall");
};

/// Copies rows [0, rows_valid) x columns [0, d) of a row-major global array
/// with d columns into a [kRows] x kHeadDim tile in the 128-byte swizzled
/// layout (sm90_layout.h's swizzle128_offset), zeros elsewhere: step 1's
/// copy, and step 2's where TMA cannot (d % 8 != 0 or a misaligned tensor).
/// Thread k copies 16-byte chunks k, k + 128, ...: consecutive threads read
/// consecutive chunks of a row. The caller fences and synchronizes.
template <typename Elem, int kRows, int kHeadDim>
__device__ inline void load_tile(unsigned char* tile, const Elem* src, int rows_valid, int d,
                                 bool vec) {
  constexpr int kChunksPerRow = kHeadDim / 8;
#pragma unroll 4
  for (int c = threadIdx.x; c < kRows * kChunksPerRow; c += kThreads) {
    const int row = c / kChunksPerRow;
    const int col = c % kChunksPerRow * 8;
    unsigned char* dst = tile + sm90::swizzle128_offset(row, col, kRows);
    const Elem* from = src + static_cast<std::int64_t>(row) * d + col;
    if (vec) {
      *reinterpret_cast<uint4*>(dst) =
          row < rows_valid && col < d ? *reinterpret_cast<const uint4*>(from) : uint4{};
    } else {
      Elem* to = reinterpret_cast<Elem*>(dst);
      for (int e = 0; e < 8; ++e) {
        to[e] = row < rows_valid && col + e < d ? from[e] : static_cast<Elem>(0.0f);
      }
    }
  }
}

/// Issues line 8, S = Qi Kj^T (times -1 when the scale is negative), as
/// one wgmma-group without waiting: a chain of kQKSteps m64nBck16 wgmma
/// reading both operands through K-major descriptors; step kk starts in
/// column block kk / 4, 32 bytes per k16 step into its rows. The caller
/// fences first.
template <typename Elem, typename C, int kScaleA>
__device__ inline void issue_qk(float (&S)[C::kSRegs], std::uint32_t q_addr,
                                std::uint32_t k_addr) {
  // LBO 16 bytes (unused by a K-major 128-byte swizzle), SBO one atom; each
  // step's descriptor is the first one advanced by a constant.
  const std::uint64_t a0 =
      sm90::make_descriptor(q_addr, 16, sm90::kSwizzleAtomBytes, sm90::Swizzle::k128B);
  const std::uint64_t b0 =
      sm90::make_descriptor(k_addr, 16, sm90::kSwizzleAtomBytes, sm90::Swizzle::k128B);
#pragma unroll
  for (int kk = 0; kk < C::kQKSteps; ++kk) {
    const std::uint32_t step = kk / 4, in_row = kk % 4 * 2 * sm90::kWgmmaK;
    const std::uint64_t a =
        sm90::advance_descriptor(a0, step * kBr * sm90::kSwizzleRowBytes + in_row);
    const std::uint64_t b =
        sm90::advance_descriptor(b0, step * C::kBc * sm90::kSwizzleRowBytes + in_row);
    sm90::wgmma_m64nNk16_ss<Elem, C::kBc, kScaleA, 0>(S, a, b, kk > 0);
  }
  sm90::wgmma_commit();
}

/// Line 8, waited for (steps 1-4).
template <typename Elem, typename C, int kScaleA>
__device__ inline void qk_product(float (&S)[C::kSRegs], std::uint32_t q_addr,
                                  std::uint32_t k_addr) {
  sm90::wgmma_fence();  // S was last written by the softmax
  issue_qk<Elem, C, kScaleA>(S, q_addr, k_addr);
  sm90::wgmma_wait<0>();
  sm90::fence_accumulators(S);
}

/// The same with the scale's sign known at run time. The branch lies
/// outside the fence and the chain: a branch between two wgmma of a chain
/// makes ptxas wait for the earlier ones (C7519).
template <typename Elem, typename C>
__device__ inline void qk_product(float (&S)[C::kSRegs], std::uint32_t q_addr,
                                  std::uint32_t k_addr, bool negate_q) {
  if (negate_q) {
    qk_product<Elem, C, -1>(S, q_addr, k_addr);
  } else {
    qk_product<Elem, C, 1>(S, q_addr, k_addr);
  }
}

/// P~ as the A operand of O~ += P~ Vj: the S registers rounded to Elem and
/// packed in pairs, k16 step kk in a[kk] (sm90_layout.h's
/// p_source_register says which register goes where).
template <typename Elem, typename C>
__device__ inline void pack_p(std::uint32_t (&a)[C::kPVSteps][4], const float (&S)[C::kSRegs]) {
#pragma unroll
  for (int kk = 0; kk < C::kPVSteps; ++kk) {
#pragma unroll
    for (int reg = 0; reg < 4; ++reg) {
      a[kk][reg] = sm90::pack2<Elem>(S[sm90::p_source_register(kk, reg, 0)],
                                     S[sm90::p_source_register(kk, reg, 1)]);
    }
  }
}

/// Issues line 10's product, O~ += P~ Vj, as one wgmma-group, without
/// waiting: for each chain c of kOutN columns of d, kPVSteps (Bc / 16)
/// m64nNok16 wgmma over the keys, B being Vj's columns read MN-major with
/// the transpose bit: keys along k, 16 keys = 2 swizzle atoms = 2048 bytes
/// per step (SBO 1024 between 8-key atoms), the next 64 columns one column
/// block ([Bc] rows of 128 bytes) further on (LBO). The caller fences first.
template <typename Elem, typename C>
__device__ inline void issue_pv(float (&O)[C::kOutChains][C::kORegs],
                                const std::uint32_t (&a)[C::kPVSteps][4], std::uint32_t v_addr) {
  constexpr std::uint32_t kColBlockBytes = C::kBc * sm90::kSwizzleRowBytes;
  const std::uint64_t b0 =
      sm90::make_descriptor(v_addr, kColBlockBytes, sm90::kSwizzleAtomBytes, sm90::Swizzle::k128B);
#pragma unroll
  for (int c = 0; c < C::kOutChains; ++c) {
#pragma unroll
    for (int kk = 0; kk < C::kPVSteps; ++kk) {
      const std::uint64_t b = sm90::advance_descriptor(
          b0, c * (C::kOutN / sm90::kSwizzleRowElems) * kColBlockBytes +
                  kk * sm90::kWgmmaK * sm90::kSwizzleRowBytes);
      sm90::wgmma_m64nNk16_rs<Elem, C::kOutN, 1>(O[c], a[kk], b, 1);
    }
  }
  sm90::wgmma_commit();
}

/// Line 10's product, waited for. All of P~ is packed before the fence: a
/// register written between two wgmma makes ptxas wait for the earlier ones
/// (it says so: "warpgroup.arrive is injected", C7519).
template <typename Elem, typename C>
__device__ inline void pv_product(float (&O)[C::kOutChains][C::kORegs],
                                  const float (&S)[C::kSRegs], std::uint32_t v_addr) {
  std::uint32_t a[C::kPVSteps][4];
  pack_p<Elem, C>(a, S);
  sm90::wgmma_fence();  // O~ was rescaled and a[] written by ordinary instructions
  issue_pv<Elem, C>(O, a, v_addr);
  sm90::wgmma_wait<0>();
#pragma unroll
  for (int c = 0; c < C::kOutChains; ++c) sm90::fence_accumulators(O[c]);
}

/// Keys past Nk or, causal, past the row's last visible key -> -inf, in a
/// tile of kSRegs * 2 keys from key0 on. keys_seen[h]: keys visible to this
/// thread's row h (0: row g, 1: g + 8).
template <int kSRegs>
__device__ inline void mask_scores(float (&S)[kSRegs], int key0, const int (&keys_seen)[2]) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int r = 0; r < kSRegs; ++r) {
    const int col = 8 * (r / 4) + 2 * t + r % 2;  // sm90::accumulator_coord's column
    if (col >= keys_seen[r % 4 / 2] - key0) S[r] = -INFINITY;
  }
}

/// Line 9 on one tile, as stage 07's online_softmax with one m16 tile per
/// warp: m in log2 units over the raw scores scaled once, P~ = 2^(S scale -
/// m) in place of S, l rescaled and increased by this thread's share of the
/// row (the quad's four shares are summed at the end). Returns in alpha the
/// factors 2^(m_old - m_new) O~ must be rescaled by, and whether any row of
/// the warp moved its max (when none did, every factor is exactly 1).
template <int kSRegs>
__device__ inline bool softmax_scores(float (&S)[kSRegs], float (&m)[2], float (&l)[2],
                                      float (&alpha)[2], float scale_log2) {
  bool moved = false;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float raw = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < kSRegs / 4; ++nt) {
      raw = fmaxf(raw, fmaxf(S[4 * nt + 2 * h], S[4 * nt + 2 * h + 1]));
    }
    raw = fmaxf(raw, __shfl_xor_sync(kFullWarpMask, raw, 1));
    raw = fmaxf(raw, __shfl_xor_sync(kFullWarpMask, raw, 2));
    const float m_new = fmaxf(m[h], raw * scale_log2);
    const float m_sub = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet: no NaN
    alpha[h] = sm80::fast_exp2(m[h] - m_sub);  // e^(m_old - m_new); 0 on the first tile
    moved = moved || m_new != m[h];
    m[h] = m_new;
    float sum = 0.0f;
#pragma unroll
    for (int nt = 0; nt < kSRegs / 4; ++nt) {
#pragma unroll
      for (int e = 2 * h; e < 2 * h + 2; ++e) {
        S[4 * nt + e] = sm80::fast_exp2(fmaf(S[4 * nt + e], scale_log2, -m_sub));
        sum += S[4 * nt + e];
      }
    }
    l[h] = alpha[h] * l[h] + sum;
  }
  return __any_sync(kFullWarpMask, moved);
}

/// Line 10's first half: O~ = diag(alpha) O~.
template <typename C>
__device__ inline void rescale_output(float (&O)[C::kOutChains][C::kORegs],
                                      const float (&alpha)[2]) {
#pragma unroll
  for (int c = 0; c < C::kOutChains; ++c) {
#pragma unroll
    for (int r = 0; r < C::kORegs; ++r) O[c][r] *= alpha[r % 4 / 2];
  }
}

/// Lines 9-10 up to the product: the scores' softmax, then O~'s rescale
/// unless no row of the warp moved its max.
template <typename C>
__device__ inline void online_softmax(float (&S)[C::kSRegs], float (&O)[C::kOutChains][C::kORegs],
                                      float (&m)[2], float (&l)[2], float scale_log2) {
  float alpha[2];
  if (softmax_scores(S, m, l, alpha, scale_log2)) rescale_output<C>(O, alpha);
}

/// Line 13 and the factor of line 12 for this thread's two rows (h = 0: row
/// 16 warp + g of the warpgroup's 64 from q_row0 on, h = 1: 8 further): l
/// summed over the quad, L_i = (m + log2 l) ln 2 written by one thread of
/// the quad, and inv[h] = 1 / l. A row that saw no key has l = 0: O = 0 and
/// L = -inf. Rows past Nq are left alone.
template <typename Elem>
__device__ inline void write_lse(const Params<Elem>& p, std::int64_t bh, int q_row0,
                                 const float (&m)[2], const float (&l)[2], float (&inv)[2]) {
  const int warp = threadIdx.x % kThreads / kWarpSize, lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = l[h];
    sum += __shfl_xor_sync(kFullWarpMask, sum, 1);
    sum += __shfl_xor_sync(kFullWarpMask, sum, 2);
    inv[h] = sum == 0.0f ? 0.0f : 1.0f / sum;
    const int row = 16 * warp + lane / 4 + 8 * h;
    if (lane % 4 == 0 && row < p.Nq - q_row0) {
      p.L[bh * p.Nq + q_row0 + row] =
          sum == 0.0f ? -INFINITY : (m[h] + log2f(sum)) * static_cast<float>(kLn2);
    }
  }
}

/// Lines 12-13 for the warpgroup's 64 rows from q_row0 on: O_i = O~ / l
/// straight from the registers to global memory (pairs of columns per 32-bit
/// store when d is even), and L_i (write_lse).
template <typename Elem, typename C>
__device__ inline void write_output(const Params<Elem>& p, std::int64_t bh, int q_row0,
                                    const float (&O)[C::kOutChains][C::kORegs], const float (&m)[2],
                                    const float (&l)[2]) {
  const int warp = threadIdx.x % kThreads / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  float inv[2];
  write_lse(p, bh, q_row0, m, l, inv);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = 16 * warp + g + 8 * h;
    if (row >= p.Nq - q_row0) continue;
    Elem* Orow = p.O + (bh * p.Nq + q_row0 + row) * p.d;  // [d]
#pragma unroll
    for (int c = 0; c < C::kOutChains; ++c) {
#pragma unroll
      for (int nt = 0; nt < C::kORegs / 4; ++nt) {
        const int col = C::kOutN * c + 8 * nt + 2 * t;
        const float o0 = O[c][4 * nt + 2 * h] * inv[h], o1 = O[c][4 * nt + 2 * h + 1] * inv[h];
        if (p.pairs && col < p.d) {
          *reinterpret_cast<std::uint32_t*>(Orow + col) = sm90::pack2<Elem>(o0, o1);
        } else {
          if (col < p.d) Orow[col] = static_cast<Elem>(o0);
          if (col + 1 < p.d) Orow[col + 1] = static_cast<Elem>(o1);
        }
      }
    }
  }
}

/// The tensor maps of Q, K and V for TMA (step 2): 3-D, (d, rows, heads),
/// boxes of 64 columns x 1 head x kBr rows (Q) or Bc rows (K, V), 128-byte
/// swizzle, zeros outside; and of O for steps 3-5's stores (boxes as Q's,
/// nothing written outside).
struct TensorMaps {
  CUtensorMap q, k, v, o;
};

/// The shared-memory tiles and barriers of one block, carved from the
/// dynamic shared memory aligned up to a swizzle atom (the swizzle is
/// computed from address bits). Buffers are found by arithmetic, not by an
/// array of pointers, which a run-time index would put on the stack.
template <typename C>
struct Smem {
  unsigned char* base;  // Qi [kBr] x d, then kKVBuffers x (Kj [Bc] x d, Vj [Bc] x d)

  __device__ explicit Smem(unsigned char* raw)
      : base(raw + (sm90::kSwizzleAtomBytes - sm90::smem_address(raw) % sm90::kSwizzleAtomBytes) %
                       sm90::kSwizzleAtomBytes) {}
  __device__ unsigned char* Qi() const { return base; }
  __device__ unsigned char* Kj(int b) const { return base + C::kQBytes + 2 * b * C::kKVBytes; }
  __device__ unsigned char* Vj(int b) const { return Kj(b) + C::kKVBytes; }
  /// Qi has landed (TMA).
  __device__ std::uint64_t* q_full() const {
    return reinterpret_cast<std::uint64_t*>(base + C::kQBytes + 2 * C::kKVBuffers * C::kKVBytes);
  }
  /// Kj and Vj of buffer b have landed (TMA).
  __device__ std::uint64_t* kv_full(int b) const { return q_full() + 1 + b; }
};

/// One Q block i of head bh: Algorithm 1, lines 4-13. `tiles_done` counts
/// the K/V tiles this block has consumed over its earlier heads and
/// `heads_done` its earlier heads: the mbarrier phases follow from them.
template <typename Elem, typename C>
__device__ inline void attend_q_block(const Params<Elem>& p, const TensorMaps& maps,
                                      std::int64_t bh, int i, const Smem<C>& s,
                                      unsigned& tiles_done, unsigned heads_done) {
  const int warp = threadIdx.x % kThreads / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int q_row0 = i * kBr;
  const int rows = min(kBr, p.Nq - q_row0);
  auto keys_seen_by = [&](std::int64_t row) -> int {
    if (!p.causal) return p.Nk;
    const std::int64_t seen = row + 1 + p.Nk - p.Nq;
    return static_cast<int>(seen < 0 ? 0 : seen > p.Nk ? p.Nk : seen);
  };
  int keys_seen[2];
  for (int h = 0; h < 2; ++h) {
    keys_seen[h] = keys_seen_by(static_cast<std::int64_t>(q_row0) + 16 * warp + lane / 4 + 8 * h);
  }
  const int block_keys = keys_seen_by(q_row0 + rows - 1);  // the most any row sees
  const int unmasked_keys = keys_seen_by(q_row0);          // the fewest
  const int n_blocks = block_keys == 0 ? 0 : (block_keys - 1) / C::kBc + 1;

  float O[C::kOutChains][C::kORegs];
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
  for (int c = 0; c < C::kOutChains; ++c) {
#pragma unroll
    for (int r = 0; r < C::kORegs; ++r) O[c][r] = 0.0f;
  }

  const int head = static_cast<int>(bh);
  const int kv_head = head / p.group;  // the K/V head of bh's group
  // Step 2: thread 0 issues tile j's copies into buffer b.
  auto issue_kv = [&](int j, int b) {
    sm90::mbarrier_arrive_expect_tx(s.kv_full(b), 2 * C::kKVBytes);
#pragma unroll
    for (int cb = 0; cb < C::kColBlocks; ++cb) {
      sm90::tma_load_3d(s.Kj(b) + cb * C::kBc * sm90::kSwizzleRowBytes, &maps.k, s.kv_full(b),
                        64 * cb, j * C::kBc, kv_head);
      sm90::tma_load_3d(s.Vj(b) + cb * C::kBc * sm90::kSwizzleRowBytes, &maps.v, s.kv_full(b),
                        64 * cb, j * C::kBc, kv_head);
    }
  };

  if constexpr (C::kTma) {                                                  // line 4
    if (threadIdx.x == 0) {
      sm90::mbarrier_arrive_expect_tx(s.q_full(), C::kQBytes);
#pragma unroll
      for (int cb = 0; cb < C::kColBlocks; ++cb) {
        sm90::tma_load_3d(s.Qi() + cb * kBr * sm90::kSwizzleRowBytes, &maps.q, s.q_full(), 64 * cb,
                          q_row0, head);
      }
      for (int k = 0; k < kStages && k < n_blocks; ++k) {
        issue_kv(n_blocks - 1 - k, (tiles_done + k) % kStages);
      }
    }
    sm90::mbarrier_wait(s.q_full(), heads_done % 2);
  } else {
    const Elem* Qi = p.Q + (bh * p.Nq + q_row0) * p.d;  // [rows, d]
    load_tile<Elem, kBr, C::kHeadDim>(s.Qi(), Qi, rows, p.d, p.vec);
  }
  const std::uint32_t q_addr = sm90::smem_address(s.Qi());

  for (int j = n_blocks - 1; j >= 0; --j) {                                // line 6
    const int key0 = j * C::kBc;
    const int b = C::kTma ? tiles_done % kStages : 0;
    if constexpr (C::kTma) {
      sm90::mbarrier_wait(s.kv_full(b), tiles_done / kStages % 2);         // line 7
    } else {
      const std::int64_t kv_row0 = static_cast<std::int64_t>(kv_head) * p.Nk + key0;
      const Elem* Kj = p.K + kv_row0 * p.d;  // [min(Bc, Nk - key0), d]
      const Elem* Vj = p.V + kv_row0 * p.d;  // [min(Bc, Nk - key0), d]
      load_tile<Elem, C::kBc, C::kHeadDim>(s.Kj(0), Kj, p.Nk - key0, p.d, p.vec);
      load_tile<Elem, C::kBc, C::kHeadDim>(s.Vj(0), Vj, p.Nk - key0, p.d, p.vec);
      sm90::fence_proxy_async_shared();  // ordinary stores, then wgmma reads them
      __syncthreads();
    }
    float S[C::kSRegs];
    qk_product<Elem, C>(S, q_addr, sm90::smem_address(s.Kj(b)), p.negate_q);  // line 8
    if (unmasked_keys - key0 < C::kBc) mask_scores(S, key0, keys_seen);
    online_softmax<C>(S, O, m, l, p.scale_log2);                            // lines 9-10
    pv_product<Elem, C>(O, S, sm90::smem_address(s.Vj(b)));                 // line 10
    __syncthreads();  // every warp's wgmmas are done with buffer b
    if constexpr (C::kTma) {
      if (threadIdx.x == 0 && j - kStages >= 0) issue_kv(j - kStages, b);  // refill it
      ++tiles_done;
    }
  }
  write_output<Elem, C>(p, bh, q_row0, O, m, l);                           // lines 12-13
  __syncthreads();  // the next head's copies may overwrite Qi
}

/// One block per (Q block, head), heaviest Q blocks first; heads past grid
/// y's limit by a grid-stride loop. Compiled for sm_90a only (CMakeLists.txt):
/// built without it, the body is empty and the stage says it is unavailable.
template <typename Elem, typename C>
__global__ void __launch_bounds__(kThreads, 1)
    hopper_kernel(const Params<Elem> p, const __grid_constant__ TensorMaps maps) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  const Smem<C> s(smem_raw);
  if constexpr (C::kTma) {
    if (threadIdx.x == 0) {
      sm90::mbarrier_init(s.q_full(), 1);
      for (int b = 0; b < kStages; ++b) sm90::mbarrier_init(s.kv_full(b), 1);
      sm90::fence_proxy_async_shared();  // the copy engine sees the initialized barriers
    }
    __syncthreads();
  }
  const int Tr = (p.Nq - 1) / kBr + 1;
  const int i = Tr - 1 - static_cast<int>(blockIdx.x);
  unsigned tiles_done = 0, heads_done = 0;
  for (std::int64_t bh = blockIdx.y; bh < p.heads; bh += gridDim.y, ++heads_done) {
    attend_q_block<Elem, C>(p, maps, bh, i, s, tiles_done, heads_done);
  }
#endif
}

// ---------------------------------------------------------------------------
// Step 3: warp specialization (FlashAttention-3 §3.1).
//
//   warpgroup 0, producer  setmaxnreg.dec 40 (32); thread 0 alone: for each
//                          item (Q block, head) of the block, wait q_empty,
//                          TMA each consumer's 64 rows of
//                          Qi -> q_full; for each K/V tile, wait k_empty[b],
//                          TMA Kj -> k_full[b], wait v_empty[b], TMA Vj -> v_full[b]
//   warpgroups 1, 2 (, 3)  setmaxnreg.inc 232 (160); rows 64 (w - 1) .. of the
//   consumers              block: wait q_full; for each tile wait k_full[b],
//                          S = Qi Kj^T, arrive on k_empty[b] (and, after the
//                          item's last S, on q_empty), softmax, wait v_full[b],
//                          O~ += P~ Vj, arrive on v_empty[b]; write L, and O
//                          into its buffer for one TMA store (d <= 128)
//
// Two consumers, or three at d = 64 (consumer_warpgroups: blocks of 128 or
// 192 rows; the registers in brackets). After the split no thread passes a
// block barrier: the producer's other threads have returned, and every
// hand-over is an mbarrier. Kj and Vj have barriers of their own, as
// FlashAttention-3's two pipelines: Kj's buffer is free once S is in, while
// Vj's is held until O~ += P~ Vj is; in step 5, which holds Vj one tile
// longer, a shared barrier would keep both buffers busy and the producer
// could not copy ahead at all.

/// What step 3 fixes at compile time: the names qk_product, pv_product and
/// online_softmax read, for one consumer warpgroup's 64 rows. kLpt_: the
/// causal kernel with FlashAttention-3's dynamic order (WsLptConfig); every
/// other kernel is WsConfig's, main's.
template <int kHeadDim_, Step kStep, bool kLpt_>
struct WsConfigBase {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kPingPong = kStep >= Step::kPingPong;
  static constexpr bool kOverlap = kStep >= Step::kIntraOverlap;
  // Whether the consumers take turns on the tensor cores: from step 4 on,
  // but for step 5's three consumers at d = 64, whose turns cost more than
  // they hid in step 4 (a ring of three waits for its slowest member): they
  // issue their products freely, as in step 3, each with its own softmax
  // under its own P~ V.
  static constexpr bool kTurns = kPingPong && !(kOverlap && kHeadDim <= 64);
  // d = 64 only, as timed (hopper_tiles.h): consumers skip the tiles above
  // their own rows' diagonal (skip_tiles); the producer copies Kj ahead of
  // Vj (produce). At d = 128 and 256 either cost 2-3 %, so main's code.
  static constexpr bool kSkipTiles = consumers_skip_tiles(kStep, kHeadDim);
  static constexpr bool kKAhead = producer_copies_k_ahead(kStep, kHeadDim);
  // Causal problems at d = 64 only (hopper_tiles.h, lpt_schedule; the
  // launcher picks WsLptConfig): items handed out one at a time, heaviest
  // first, from a counter (LptCursor). Every other problem keeps the fixed
  // share of equal units (WsCursor), main's kernel.
  static constexpr bool kLpt = kLpt_;
  static_assert(!kLpt || lpt_schedule(kStep, kHeadDim), "the dynamic order: d = 64, from step 3");
  static constexpr int kBc = key_tile(kHeadDim);  // keys per K/V tile
  static constexpr int kSRegs = kBc / 2;          // S's fp32 accumulators per thread
  static constexpr int kColBlocks = kHeadDim / sm90::kSwizzleRowElems;
  static constexpr int kQKSteps = kHeadDim / sm90::kWgmmaK;
  static constexpr int kPVSteps = kBc / sm90::kWgmmaK;
  static constexpr int kOutN = out_tile(kHeadDim);
  static constexpr int kOutChains = kHeadDim / kOutN;
  static constexpr int kORegs = kOutN / 2;
  static constexpr int kConsumers = consumer_warpgroups(kStep, kHeadDim);
  static constexpr int kBlockThreads = ws_threads(kConsumers);
  static constexpr int kProducerRegs = producer_regs(kConsumers);
  static constexpr int kConsumerRegs = consumer_regs(kConsumers);
  static constexpr int kBlockRows = kConsumers * kBr;  // rows of Q per block
  static constexpr int kQBytes = kBr * kHeadDim * 2;   // one consumer's 64 rows of Qi
  static constexpr int kKVBytes = kBc * kHeadDim * 2;
  // Barriers: q_full, q_empty, k_full[kStages], k_empty[kStages],
  // v_full[kStages], v_empty[kStages]; with kLpt, 8 bytes more for the
  // number of the item the producer hands over with Qi (WsSmem::item_slot).
  static constexpr int kBarrierBytes = 8 * (2 + 4 * kStages) + (kLpt ? 8 : 0);
  static constexpr int kInputBytes = sm90::kSwizzleAtomBytes + kConsumers * kQBytes +
                                     2 * kStages * kKVBytes + kBarrierBytes;
  static_assert(kInputBytes <= sm90::kMaxSmemBytesPerBlock,
                "Qi's halves and the K/V buffers fit one block");
  // O_i through shared memory and a TMA store (write_output_tma), in a
  // buffer of kQBytes per consumer, or from the registers (write_output).
  static constexpr bool kOutByTma = output_through_smem(kStep, kHeadDim);
  static constexpr int kSmemBytes = kInputBytes + (kOutByTma ? kConsumers * kQBytes : 0);
  static_assert(kSmemBytes <= sm90::kMaxSmemBytesPerBlock, "O_i's buffers fit beside the inputs");
  // Arrivals that free a buffer: every thread of every consumer, each after
  // its own wgmma_wait<0> (which covers its whole warpgroup's products).
  static constexpr int kConsumerThreads = kConsumers * kThreads;
  static_assert(kProducerRegs * kThreads + kConsumers * kConsumerRegs * kThreads <= 65536,
                "the registers setmaxnreg hands out fit the SM's 64K");
};
/// Main's kernels (the fixed share of units, WsCursor), and the causal one
/// at d = 64 (the counter, LptCursor): separate types rather than a third
/// template argument, so that the former keep main's names and code.
template <int kHeadDim, Step kStep>
struct WsConfig : WsConfigBase<kHeadDim, kStep, false> {};
template <int kHeadDim, Step kStep>
struct WsLptConfig : WsConfigBase<kHeadDim, kStep, true> {};

template <typename C>
struct WsSmem {
  unsigned char* base;  // Qi parts, kStages x (Kj, Vj), O_i parts (kOutByTma), the barriers

  __device__ explicit WsSmem(unsigned char* raw)
      : base(raw + (sm90::kSwizzleAtomBytes - sm90::smem_address(raw) % sm90::kSwizzleAtomBytes) %
                       sm90::kSwizzleAtomBytes) {}
  /// Consumer w's 64 rows of Qi.
  __device__ unsigned char* Qi(int w) const { return base + w * C::kQBytes; }
  __device__ unsigned char* Kj(int b) const {
    return base + C::kConsumers * C::kQBytes + 2 * b * C::kKVBytes;
  }
  __device__ unsigned char* Vj(int b) const { return Kj(b) + C::kKVBytes; }
  /// Consumer w's 64 rows of O_i on their way out, laid out as Qi's.
  __device__ unsigned char* Oi(int w) const { return Kj(kStages) + w * C::kQBytes; }
  __device__ std::uint64_t* barriers() const {
    return reinterpret_cast<std::uint64_t*>(Oi(C::kOutByTma ? C::kConsumers : 0));
  }
  __device__ std::uint64_t* q_full() const { return barriers(); }      // Qi landed
  __device__ std::uint64_t* q_empty() const { return barriers() + 1; } // consumers done with Qi
  __device__ std::uint64_t* k_full(int b) const { return barriers() + 2 + b; }   // Kj landed
  __device__ std::uint64_t* k_empty(int b) const {  // consumers done with Kj
    return barriers() + 2 + kStages + b;
  }
  __device__ std::uint64_t* v_full(int b) const {  // Vj landed
    return barriers() + 2 + 2 * kStages + b;
  }
  __device__ std::uint64_t* v_empty(int b) const {  // consumers done with Vj
    return barriers() + 2 + 3 * kStages + b;
  }
  /// kLpt: the item whose Qi q_full's current phase brings (LptCursor).
  __device__ int* item_slot() const { return reinterpret_cast<int*>(barriers() + 2 + 4 * kStages); }
};

/// The work of steps 3-5 (ws_schedule in hopper_tiles.h says why so): a
/// persistent grid, one block per SM, whose block b takes units b,
/// b + gridDim.x, ...; a unit is one item (a Q block of kBlockRows rows of
/// one head) or, under a causal mask, the pair of items rank r and Tr - 1 - r
/// of one head (rank counts Q blocks from the last, the heaviest), so that
/// every unit is the same work. Units are numbered head by head (unit
/// head * per_head + r), so the blocks running at once share a few heads'
/// Kj and Vj in L2; a causal problem of odd Tr has one middle item per head
/// left, numbered last (unit paired_units + head): the lightest half-units
/// fill the tail. The cursor holds the unit and which half of it runs; one
/// 32-bit division per unit finds the head (a 64-bit one spilled the
/// producer's 32 registers), the counts come from the kernel's parameters.
struct WsCursor {
  int unit;
  bool second;  // the light item of a causal pair

  __device__ static WsCursor first() { return {static_cast<int>(blockIdx.x), false}; }
  template <typename Elem>
  __device__ bool valid(const Params<Elem>& p) const {
    return unit < p.units;
  }
  template <typename Elem>
  __device__ void next(const Params<Elem>& p) {
    if (p.causal && !second && unit < p.paired_units) {
      second = true;
    } else {
      second = false;
      unit += static_cast<int>(gridDim.x);
    }
  }
  /// The item's head and rank.
  template <typename Elem>
  __device__ int head(const Params<Elem>& p) const {
    return unit < p.paired_units ? unit / p.units_per_head : unit - p.paired_units;
  }
  template <typename Elem>
  __device__ int rank(const Params<Elem>& p, int Tr, int head) const {
    if (unit >= p.paired_units) return Tr / 2;  // a causal middle item
    const int r = unit - head * p.units_per_head;
    return second ? Tr - 1 - r : r;
  }
};

/// Item (rank, head)'s first row of Q, and the K/V blocks its last row sees
/// (the rest lie above the causal diagonal and are skipped).
struct WsItem {
  int head;
  int row0;
  int n_blocks;
};
template <typename C, typename Elem>
__device__ inline WsItem ws_item(const Params<Elem>& p, int Tr, int head, int rank) {
  const int row0 = (Tr - 1 - rank) * C::kBlockRows;
  const std::int64_t last = static_cast<std::int64_t>(row0) + min(C::kBlockRows, p.Nq - row0) - 1;
  const std::int64_t seen = p.causal ? last + 1 + p.Nk - p.Nq : p.Nk;
  const int keys = static_cast<int>(seen < 0 ? 0 : seen > p.Nk ? p.Nk : seen);
  return {head, row0, keys == 0 ? 0 : (keys - 1) / C::kBc + 1};
}
template <typename C, typename Elem>
__device__ inline WsItem ws_item(const Params<Elem>& p, int Tr, const WsCursor& cursor) {
  const int head = cursor.head(p);
  return ws_item<C>(p, Tr, head, cursor.rank(p, Tr, head));
}

/// The work of steps 3-5 with kLpt, causal problems at d = 64 only
/// (WsLptConfig; lpt_schedule in hopper_tiles.h says why):
/// FlashAttention-3's order and hand-out (its
/// DynamicPersistentTileScheduler). Items (a Q block of one head) are
/// numbered a section of p.section_heads heads after another (the last may
/// hold fewer), within a section rank by rank from the heaviest (the last
/// Q block), head by head within a rank. Block b starts with item b; when
/// the producer starts an item it takes the block's next one from
/// p.item_counter, so that blocks whose items were light take more, the
/// atomic's latency under the item's copies. The consumers learn each
/// number with the item's Qi (LptSlot). A problem without a mask (every
/// item the same work) runs main's kernel (WsConfig, WsCursor): the
/// hand-over cost it 1-3 % (tuning_08, lead's A/B).
template <typename C, typename Elem>
__device__ inline WsItem lpt_item(const Params<Elem>& p, int Tr, int unit) {
  const LptPlace at = lpt_place(unit, Tr, static_cast<int>(p.heads), p.section_heads);
  return ws_item<C>(p, Tr, at.head, at.rank);
}
/// The producer's cursor.
struct LptCursor {
  int unit;
  // The counter's value taken at the start of this item, read only at its
  // end (next), so that the atomic's latency runs under the item's copies.
  int taken;

  __device__ static LptCursor first() { return {static_cast<int>(blockIdx.x), 0}; }
  template <typename Elem>
  __device__ bool valid(const Params<Elem>& p) const {
    return unit < p.units;
  }
  template <typename Elem>
  __device__ void take_next(const Params<Elem>& p) {
    taken = atomicAdd(p.item_counter, 1);
  }
  /// Every item started takes one count, so the p.units takes return
  /// 0 .. p.units - 1; the block whose take returned
  /// the last sets the counter back to 0 for the next launch, every other
  /// take being done by then.
  template <typename Elem>
  __device__ void next(const Params<Elem>& p) {
    if (taken == p.units - 1) *p.item_counter = 0;
    unit = taken + static_cast<int>(gridDim.x);
  }
};
template <typename C, typename Elem>
__device__ inline WsItem ws_item(const Params<Elem>& p, int Tr, const LptCursor& cursor) {
  return lpt_item<C>(p, Tr, cursor.unit);
}
/// A consumer's cursor: the numbers the producer hands over in item_slot,
/// each written before q_full's arrival that brings the item's Qi and read
/// after the consumer's wait for it (the mbarrier orders the two; take);
/// after the block's last item the producer hands over p.units with no Qi.
/// One slot is enough: the producer writes the next number only once
/// q_empty says every consumer is done with this item's Qi, long after
/// reading its number.
struct LptSlot {
  int unit;

  __device__ static LptSlot first() { return {0}; }
  template <typename Elem>
  __device__ bool valid(const Params<Elem>& p) const {
    return unit < p.units;
  }
  template <typename Elem>
  __device__ void next(const Params<Elem>&) {}  // take() reads the next
  template <typename C>
  __device__ void take(const WsSmem<C>& s, unsigned items_done) {
    sm90::mbarrier_wait(s.q_full(), items_done % 2);
    unit = *s.item_slot();
  }
};
template <typename C, typename Elem>
__device__ inline WsItem ws_item(const Params<Elem>& p, int Tr, const LptSlot& cursor) {
  return lpt_item<C>(p, Tr, cursor.unit);
}
template <typename C>
using ProducerCursor = std::conditional_t<C::kLpt, LptCursor, WsCursor>;
template <typename C>
using ConsumerCursor = std::conditional_t<C::kLpt, LptSlot, WsCursor>;
/// Called before each of a consumer's items, and after its last: with
/// kLpt, the number of the item q_full's phase items_done brings.
template <typename C>
__device__ inline void consumer_take(ConsumerCursor<C>& item, const WsSmem<C>& s,
                                     unsigned items_done) {
  if constexpr (C::kLpt) item.take(s, items_done);
}

/// The producer: thread 0 of warpgroup 0 issues every copy of the block's
/// items, in the order the consumers use them. A buffer's t-th fill waits
/// for the consumers' (t-1)-th release: parity (t - 1) % 2, i.e. t % 2 ^ 1
/// (on a fresh barrier, waiting for parity 1 returns at once). Kj's buffer
/// is released first (once S is in), so the next Kj but one can be on its
/// way while this tile's Vj is still read. Two choices of FlashAttention-3's
/// producer (its mainloop's load) keep the copies of Kj off the wait for Vj:
/// - the item's first Kj is copied before its Qi: Kj's buffer is free a
///   tile before Qi's (which waits for the last item's last S), and the
///   copy is under way by then;
/// - in steps 4-5, which read V_{j+1} beside K_j (ping_pong_tiles), K_{j-1}
///   is copied ahead of V_j: V_j's buffer is freed a tile after K_j's, and
///   copied in the order Kj, Vj the next Kj waited behind it. Step 3 reads
///   Kj and Vj in one iteration and keeps that order.
template <typename Elem, typename C>
__device__ inline void produce(const Params<Elem>& p, const TensorMaps& maps,
                               const WsSmem<C>& s) {
  unsigned tiles = 0, items_done = 0;
  const int Tr = (p.Nq - 1) / C::kBlockRows + 1;
  // K or V block j of K/V head `head` into its buffer for the block's tile
  // t, once the consumers have freed it.
  auto copy_tile = [&](const CUtensorMap* map, std::uint64_t* empty, std::uint64_t* full,
                       unsigned char* tile, int j, unsigned t, int head) {
    sm90::mbarrier_wait(empty, t / kStages % 2 ^ 1);
    sm90::mbarrier_arrive_expect_tx(full, C::kKVBytes);
    for (int cb = 0; cb < C::kColBlocks; ++cb) {
      sm90::tma_load_3d(tile + cb * C::kBc * sm90::kSwizzleRowBytes, map, full, 64 * cb,
                        j * C::kBc, head);
    }
  };
  auto copy_k = [&](int j, unsigned t, int head) {
    const int b = t % kStages;
    copy_tile(&maps.k, s.k_empty(b), s.k_full(b), s.Kj(b), j, t, head);
  };
  auto copy_v = [&](int j, unsigned t, int head) {
    const int b = t % kStages;
    copy_tile(&maps.v, s.v_empty(b), s.v_full(b), s.Vj(b), j, t, head);
  };
  for (ProducerCursor<C> item = ProducerCursor<C>::first(); item.valid(p);
       item.next(p), ++items_done) {
    if constexpr (C::kLpt) item.take_next(p);
    const WsItem it = ws_item<C>(p, Tr, item);
    const int q_row0 = it.row0, n_blocks = it.n_blocks, head = it.head;
    const int kv_head = head / p.group;  // the K/V head of the item's group
    if constexpr (C::kKAhead) {
      if (n_blocks > 0) copy_k(n_blocks - 1, tiles, kv_head);  // line 7's first Kj, before Qi
    }
    sm90::mbarrier_wait(s.q_empty(), items_done % 2 ^ 1);  // line 4
    if constexpr (C::kLpt) *s.item_slot() = item.unit;  // handed over with Qi
    // A consumer whose rows all lie past Nq gets no copy (a box wholly
    // outside the tensor is not asked of TMA), and computes nothing
    // (pass_tiles).
    const int halves = min(C::kConsumers, (p.Nq - q_row0 - 1) / kBr + 1);
    sm90::mbarrier_arrive_expect_tx(s.q_full(), halves * C::kQBytes);
    for (int w = 0; w < halves; ++w) {
      for (int cb = 0; cb < C::kColBlocks; ++cb) {
        sm90::tma_load_3d(s.Qi(w) + cb * kBr * sm90::kSwizzleRowBytes, &maps.q, s.q_full(),
                          64 * cb, q_row0 + w * kBr, head);
      }
    }
    // Line 7 (for the rest: kKAhead): Vj, and K_{j-1} ahead of it (steps
    // 4-5) or after it (step 3); else Kj, Vj. Not unrolled: the copies of an
    // unrolled loop would each keep their own offsets, more than the
    // producer's registers hold.
#pragma unroll 1
    for (int j = n_blocks - 1; j >= 0; --j, ++tiles) {
      if constexpr (!C::kKAhead) {
        copy_k(j, tiles, kv_head);
        copy_v(j, tiles, kv_head);
      } else if constexpr (C::kPingPong) {
        if (j > 0) copy_k(j - 1, tiles + 1, kv_head);
        copy_v(j, tiles, kv_head);
      } else {
        copy_v(j, tiles, kv_head);
        if (j > 0) copy_k(j - 1, tiles + 1, kv_head);
      }
    }
  }
  if constexpr (C::kLpt) {  // no more items: p.units, with no Qi
    sm90::mbarrier_wait(s.q_empty(), items_done % 2 ^ 1);
    *s.item_slot() = p.units;
    sm90::mbarrier_arrive(s.q_full());
  }
}

/// Steps 4-5's tile loop for one consumer and head (FlashAttention-3's
/// mainloop): one turn on the tensor cores per K/V tile, in which the
/// consumer issues both products of an iteration back to back, S_j = Qi K_j^T
/// and O~ += P~_{j+1} V_{j+1} of the tile before, then passes the turn on;
/// the other consumers' softmax runs under these two products, and this
/// one's under theirs. Step 4 waits for both products before the softmax of
/// S_j; step 5 (FlashAttention-3 Algorithm 2) waits for S_j alone
/// (wgmma_wait<1>) and runs its softmax while P~_{j+1} V_{j+1} is still in
/// flight. Both steps finish that product at the top of the next iteration:
/// wait for it (wgmma_wait<0>), free V_{j+1}'s buffer, then rescale O~ by
/// tile j's factors, off the path from one S to the next. Row for row the
/// same operations in the same order as step 3: O~ is rescaled by tile
/// j + 1's factors before P~_{j+1} V_{j+1} is added, and by tile j's after.
/// Costs P~_{j+1} in Bc / 4 packed registers (32 at Bc = 128) beside S_j.
/// `tiles` counts the K/V tiles consumed so far; the buffer phases follow.
/// release_q() is called once the last S is in: Qi is read no more.
template <typename Elem, typename C, typename Turn, typename Pass, typename Release>
__device__ inline void ping_pong_tiles(const Params<Elem>& p, const WsSmem<C>& s,
                                       std::uint32_t q_addr, int n_blocks, int unmasked_keys,
                                       const int (&keys_seen)[2], unsigned& tiles,
                                       float (&O)[C::kOutChains][C::kORegs], float (&m)[2],
                                       float (&l)[2], Turn my_turn, Pass your_turn,
                                       Release release_q) {
  // The last visited tile alone: its scores and softmax (O~ is still zero,
  // nothing to rescale).
  float alpha[2];
  float S[C::kSRegs];
  int b_prev = tiles % kStages;
  sm90::mbarrier_wait(s.k_full(b_prev), tiles / kStages % 2);
  my_turn();
  qk_product<Elem, C>(S, q_addr, sm90::smem_address(s.Kj(b_prev)), p.negate_q);
  your_turn();
  sm90::mbarrier_arrive(s.k_empty(b_prev));
  if (n_blocks == 1) release_q();
  if (unmasked_keys - (n_blocks - 1) * C::kBc < C::kBc) {
    mask_scores(S, (n_blocks - 1) * C::kBc, keys_seen);
  }
  softmax_scores(S, m, l, alpha, p.scale_log2);
  ++tiles;
  // The previous iteration's O~ += P~ V, waited for here, after this
  // iteration's barrier waits, not at the end of its own iteration: there
  // ptxas scheduled the wait ahead of the whole softmax (WARPGROUP.DEPBAR.LE
  // gsb0, 0x0 before the first SHFL in the SASS), and step 5's softmax ran
  // under nothing. The barrier waits are loops, which ptxas does not move it
  // across. The wait is .aligned, and so unconditional: all four warps of
  // the warpgroup reach it at one instruction (the rescale below is per warp,
  // on the warp's own vote). Its V tile sits in buffer (tiles - 2) % kStages.
  bool moved = false;  // whether O~ owes a rescale by alpha
  auto finish_pv = [&] {
    sm90::wgmma_wait<0>();
#pragma unroll
    for (int c = 0; c < C::kOutChains; ++c) sm90::fence_accumulators(O[c]);
    sm90::mbarrier_arrive(s.v_empty((tiles - 2) % kStages));
    if (moved) rescale_output<C>(O, alpha);
  };
  for (int j = n_blocks - 2; j >= 0; --j, ++tiles) {
    const int key0 = j * C::kBc;
    const int b = tiles % kStages;
    sm90::mbarrier_wait(s.k_full(b), tiles / kStages % 2);
    sm90::mbarrier_wait(s.v_full(b_prev), (tiles - 1) / kStages % 2);
    if (j < n_blocks - 2) finish_pv();
    std::uint32_t a[C::kPVSteps][4];
    pack_p<Elem, C>(a, S);  // P~_{j+1}, before the fence
    my_turn();
    // Group 1: S_j; group 2: O~ += P~_{j+1} V_{j+1}. The scale's sign is
    // tested outside the fence and the chains (a branch between them makes
    // ptxas wait, C7519).
    const std::uint32_t k_addr = sm90::smem_address(s.Kj(b));
    const std::uint32_t v_addr = sm90::smem_address(s.Vj(b_prev));
    if (p.negate_q) {
      sm90::wgmma_fence();
      issue_qk<Elem, C, -1>(S, q_addr, k_addr);
      issue_pv<Elem, C>(O, a, v_addr);
    } else {
      sm90::wgmma_fence();
      issue_qk<Elem, C, 1>(S, q_addr, k_addr);
      issue_pv<Elem, C>(O, a, v_addr);
    }
    your_turn();
    if constexpr (C::kOverlap) {
      sm90::wgmma_wait<1>();  // S_j is in; P~_{j+1} V_{j+1} may still run
    } else {
      sm90::wgmma_wait<0>();  // both are in
    }
    sm90::fence_accumulators(S);
    sm90::mbarrier_arrive(s.k_empty(b));  // done with K_j
    if (j == 0) release_q();
    if (unmasked_keys - key0 < C::kBc) mask_scores(S, key0, keys_seen);
    moved = softmax_scores(S, m, l, alpha, p.scale_log2);
    b_prev = b;
  }
  // The first tile's product.
  sm90::mbarrier_wait(s.v_full(b_prev), (tiles - 1) / kStages % 2);
  if (n_blocks > 1) finish_pv();
  my_turn();
  pv_product<Elem, C>(O, S, sm90::smem_address(s.Vj(b_prev)));
  your_turn();
  sm90::mbarrier_arrive(s.v_empty(b_prev));
}

/// The first of step 4's named barriers, one per consumer (0 is
/// __syncthreads'): consumer w waits on kTurn + w.
inline constexpr int kTurn = 1;
/// Threads a turn barrier counts: the waiting consumer's 128 and the 128
/// arrivals of the one that passes it the turn.
inline constexpr int kTurnThreads = 2 * kThreads;

/// The tile loop of a consumer whose 64 rows all lie past Nq (the last Q
/// block of a head, when Nq is not a multiple of the block's rows: at
/// d = 64, 192-row blocks, N = 2048 leaves the heaviest Q block of every
/// head 128 rows, one consumer with none, N = 4096 64 rows, two), or, under
/// a causal mask with Nq > Nk, see no key of the item: it computes
/// nothing, where it used to run every product on rows never written out,
/// taking the tensor cores from the other consumers. It keeps the
/// hand-overs in ping_pong_tiles' order: Qi released at once; then, n_blocks
/// + 1 times, wait for tile k's Kj and tile k - 1's Vj to land (an arrival
/// before that would count towards the buffer's previous use), take and
/// pass the turn (steps 4-5), release both. Waiting for every tile before
/// passing a turn would deadlock the ring: the producer's next Vj waits for
/// a buffer the other consumers free only in the turns this one holds up.
/// Its O~ stays zero; write_output_tma writes it to the consumer's buffer
/// and stores nothing for rows past Nq (skipping the buffer too put the
/// consumer's item count on the stack at d = 64: ptxas spilled it); rows
/// that see no key get O = 0 and L = -inf.
template <typename C, typename Turn, typename Pass, typename Release>
__device__ inline void pass_tiles(const WsSmem<C>& s, int n_blocks, unsigned& tiles, Turn my_turn,
                                  Pass your_turn, Release release_q) {
  release_q();
  const unsigned first = tiles;  // this item's tile k is the block's tile first + k
  // Rolled: this path is rare and its time is the barriers'.
#pragma unroll 1
  for (int k = 0; k <= n_blocks; ++k) {
    const unsigned t = first + k;
    if (k < n_blocks) sm90::mbarrier_wait(s.k_full(t % kStages), t / kStages % 2);
    if (k > 0) sm90::mbarrier_wait(s.v_full((t - 1) % kStages), (t - 1) / kStages % 2);
    my_turn();
    your_turn();
    if (k < n_blocks) sm90::mbarrier_arrive(s.k_empty(t % kStages));
    if (k > 0) sm90::mbarrier_arrive(s.v_empty((t - 1) % kStages));
  }
  tiles = first + n_blocks;
}

/// The first K/V tiles of an item that lie wholly above the causal diagonal
/// for this consumer's 64 rows, though not for the block's last row (the
/// producer copies the tiles the block's last row sees): the consumer hands
/// them over unread instead of computing scores it would mask to -inf. At
/// d = 64 (192-row blocks on 128-key tiles, Nq = Nk) consumers 0 and 1 of
/// every other block and consumer 0 of the rest skip one tile an item, 5 %
/// of the products at N = 2048; FlashAttention-3 runs them (its consumers
/// share the block's n_block range). They come first, since the tiles are
/// visited from the last one down, so the consumer's own tile loop then
/// runs as if the item had its own, shorter range. Each tile: wait for Kj
/// and Vj to land (an arrival before that would count towards the buffer's
/// previous use), take and pass one turn (steps 4-5: one a tile, as
/// ping_pong_tiles takes them, so that every consumer takes as many turns
/// an item and the ring stays in step), release both.
template <typename C, typename Turn, typename Pass>
__device__ inline void skip_tiles(const WsSmem<C>& s, int skipped, unsigned& tiles, Turn my_turn,
                                  Pass your_turn) {
  // Rolled: at most a tile or two an item, and its time is the barriers'.
#pragma unroll 1
  for (int k = 0; k < skipped; ++k, ++tiles) {
    const int b = tiles % kStages;
    const unsigned parity = tiles / kStages % 2;
    sm90::mbarrier_wait(s.k_full(b), parity);
    sm90::mbarrier_wait(s.v_full(b), parity);
    my_turn();
    your_turn();
    sm90::mbarrier_arrive(s.k_empty(b));
    sm90::mbarrier_arrive(s.v_empty(b));
  }
}

/// The first of the output barriers, one per consumer after the turn
/// barriers: consumer w's 128 threads meet on kOutput + w around the
/// writing of its O_i buffer (write_output_tma). 16 named barriers a block:
/// 1 + 3 + 3 are taken.
inline constexpr int kOutput = kTurn + consumer_warpgroups(Step::kIntraOverlap, 64);

/// Lines 12-13 for consumer w's 64 rows from q_row0 on through shared memory
/// (FlashAttention-3's epilogue): O_i = O~ / l rounded into the consumer's
/// O_i buffer, in the 128-byte swizzled layout of Qi (32-bit stores: the
/// quad's four threads fill one 16-byte chunk of a row, the warp's 8 rows
/// fall in 8 different chunks, no bank conflict), then one thread hands the
/// buffer to TMA, which writes whole rows of O (a box per 64 columns) and
/// clips rows past Nq and columns past d itself. The consumer does not
/// wait for the store: it goes on to its next item, and waits only before
/// it writes the buffer again, one item later (bulk_wait_group_read), by
/// when the copy has long read it. L_i as write_output (write_lse).
template <typename Elem, typename C>
__device__ inline void write_output_tma(const Params<Elem>& p, const TensorMaps& maps,
                                        const WsSmem<C>& s, int w, int head, int q_row0,
                                        const float (&O)[C::kOutChains][C::kORegs],
                                        const float (&m)[2], const float (&l)[2]) {
  const int warp = threadIdx.x % kThreads / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const bool issuer = threadIdx.x % kThreads == 0;  // the thread that stores and waits
  float inv[2];
  write_lse(p, head, q_row0, m, l, inv);
  unsigned char* tile = s.Oi(w);  // [kBr] x kHeadDim, swizzled as Qi
  if (issuer) sm90::bulk_wait_group_read<0>();  // the last item's store has read it
  sm90::named_barrier_sync(kOutput + w, kThreads);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = 16 * warp + g + 8 * h;
#pragma unroll
    for (int c = 0; c < C::kOutChains; ++c) {
#pragma unroll
      for (int nt = 0; nt < C::kORegs / 4; ++nt) {
        const int col = C::kOutN * c + 8 * nt + 2 * t;
        *reinterpret_cast<std::uint32_t*>(tile + sm90::swizzle128_offset(row, col, kBr)) =
            sm90::pack2<Elem>(O[c][4 * nt + 2 * h] * inv[h], O[c][4 * nt + 2 * h + 1] * inv[h]);
      }
    }
  }
  sm90::fence_proxy_async_shared();  // this thread's stores, before TMA reads them
  sm90::named_barrier_sync(kOutput + w, kThreads);
  // A consumer whose rows all lie past Nq stores nothing (as it was given
  // no Qi copy).
  if (issuer && q_row0 < p.Nq) {
    for (int cb = 0; cb < C::kColBlocks; ++cb) {
      sm90::tma_store_3d(&maps.o, tile + cb * kBr * sm90::kSwizzleRowBytes, 64 * cb, q_row0, head);
    }
    sm90::bulk_commit_group();
  }
}

/// Consumer w (0 .. kConsumers - 1): Algorithm 1 for rows 64 w .. 64 w + 63
/// of every item of the block, on the buffers the producer fills.
template <typename Elem, typename C>
__device__ inline void consume(const Params<Elem>& p, const TensorMaps& maps, const WsSmem<C>& s,
                               int w) {
  const int warp = threadIdx.x % kThreads / kWarpSize, lane = threadIdx.x % kWarpSize;
  auto keys_seen_by = [&](std::int64_t row) -> int {
    if (!p.causal) return p.Nk;
    const std::int64_t seen = row + 1 + p.Nk - p.Nq;
    return static_cast<int>(seen < 0 ? 0 : seen > p.Nk ? p.Nk : seen);
  };
  const std::uint32_t q_addr = sm90::smem_address(s.Qi(w));
  // Step 4's token, passed round the consumers 0, 1, (2,) 0, ...: consumer
  // w may use the tensor cores once its barrier kTurn + w has seen its own
  // 128 threads and the previous consumer's 128 arrivals; it passes the
  // token on with an arrival at the next one's. Step 3 takes no turns, nor
  // does step 5 at d = 64 (WsConfig::kTurns).
  auto my_turn = [&] {
    if constexpr (C::kTurns) sm90::named_barrier_sync(kTurn + w, kTurnThreads);
  };
  auto your_turn = [&] {
    if constexpr (C::kTurns) {
      sm90::named_barrier_arrive(kTurn + (w + 1) % C::kConsumers, kTurnThreads);
    }
  };
  // The ring of turns runs on across the block's items: the last consumer
  // passes the first turn once, before its first item (consumer 0 goes
  // first), and consumer 0 takes the last one it passes after its last
  // item, so every arrival on a turn barrier is matched. Passed and taken
  // once per item instead, the last consumer's pass for the next item could
  // reach turn barrier 0 before consumer 0 had taken the one for this item:
  // two arrivals of the same 128 threads would complete the barrier without
  // its owner (a race that only the length of the last consumer's epilogue
  // kept from happening).
  if (w == C::kConsumers - 1) your_turn();
  unsigned tiles = 0, items_done = 0;
  const int Tr = (p.Nq - 1) / C::kBlockRows + 1;
  for (ConsumerCursor<C> item = ConsumerCursor<C>::first();
       consumer_take(item, s, items_done), item.valid(p); item.next(p), ++items_done) {
    const WsItem it = ws_item<C>(p, Tr, item);
    const int q_row0 = it.row0 + w * kBr, block_tiles = it.n_blocks;
    // The tiles this consumer computes on: with kSkipTiles those its last
    // row sees, fewer under a causal mask where the block's last row sees
    // further (skip_tiles); else the block's.
    int n_blocks = block_tiles;
    if constexpr (C::kSkipTiles) {
      const int own_keys = keys_seen_by(static_cast<std::int64_t>(min(q_row0 + kBr, p.Nq)) - 1);
      n_blocks = min(block_tiles, own_keys == 0 ? 0 : (own_keys - 1) / C::kBc + 1);
    }
    int keys_seen[2];
    for (int h = 0; h < 2; ++h) {
      keys_seen[h] =
          keys_seen_by(static_cast<std::int64_t>(q_row0) + 16 * warp + lane / 4 + 8 * h);
    }
    const int unmasked_keys = keys_seen_by(q_row0);  // the fewest any of these rows sees
    float O[C::kOutChains][C::kORegs];
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int c = 0; c < C::kOutChains; ++c) {
#pragma unroll
      for (int r = 0; r < C::kORegs; ++r) O[c][r] = 0.0f;
    }
    if constexpr (!C::kLpt) sm90::mbarrier_wait(s.q_full(), items_done % 2);  // else waited for
    // Done with Qi once the item's last S is in (at once when it has no
    // tile): the producer copies the next item's Qi under this item's last
    // softmax, last P~ V and the writing of O.
    auto release_q = [&] { sm90::mbarrier_arrive(s.q_empty()); };
    if (block_tiles == 0) {
      release_q();
    } else if (q_row0 >= p.Nq || n_blocks == 0) {
      pass_tiles<C>(s, block_tiles, tiles, my_turn, your_turn, release_q);
    } else if constexpr (C::kPingPong) {
      if constexpr (C::kSkipTiles) {
        skip_tiles<C>(s, block_tiles - n_blocks, tiles, my_turn, your_turn);
      }
      ping_pong_tiles<Elem, C>(p, s, q_addr, n_blocks, unmasked_keys, keys_seen, tiles, O, m, l,
                               my_turn, your_turn, release_q);
    } else {
      if constexpr (C::kSkipTiles) {
        skip_tiles<C>(s, block_tiles - n_blocks, tiles, my_turn, your_turn);
      }
      for (int j = n_blocks - 1; j >= 0; --j, ++tiles) {
        const int key0 = j * C::kBc;
        const int b = tiles % kStages;
        const unsigned parity = tiles / kStages % 2;
        sm90::mbarrier_wait(s.k_full(b), parity);
        float S[C::kSRegs];
        qk_product<Elem, C>(S, q_addr, sm90::smem_address(s.Kj(b)), p.negate_q);
        sm90::mbarrier_arrive(s.k_empty(b));  // this thread's product is done with Kj
        if (j == 0) release_q();
        if (unmasked_keys - key0 < C::kBc) mask_scores(S, key0, keys_seen);
        online_softmax<C>(S, O, m, l, p.scale_log2);
        sm90::mbarrier_wait(s.v_full(b), parity);
        pv_product<Elem, C>(O, S, sm90::smem_address(s.Vj(b)));
        sm90::mbarrier_arrive(s.v_empty(b));  // and with Vj
      }
    }
    if constexpr (C::kOutByTma) {
      write_output_tma<Elem, C>(p, maps, s, w, it.head, q_row0, O, m, l);
    } else {
      write_output<Elem, C>(p, it.head, q_row0, O, m, l);
    }
  }
  if (w == 0) my_turn();
  // The block's shared memory must outlive the last store's reads of it.
  if (C::kOutByTma && threadIdx.x % kThreads == 0) sm90::bulk_wait_group<0>();
}

/// Step 3's kernel: blocks of three warpgroups, each taking (Q block of 128
/// rows, head) items, or of four taking (192 rows, head) at d = 64. The
/// register cap at entry (384 threads at one block per SM: 168 each; 512:
/// 128) is what setmaxnreg redistributes.
template <typename Elem, typename C>
__global__ void __launch_bounds__(C::kBlockThreads, 1)
    hopper_ws_kernel(const Params<Elem> p, const __grid_constant__ TensorMaps maps) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  const WsSmem<C> s(smem_raw);
  if (threadIdx.x == 0) {
    sm90::mbarrier_init(s.q_full(), 1);
    sm90::mbarrier_init(s.q_empty(), C::kConsumerThreads);
    for (int b = 0; b < kStages; ++b) {
      sm90::mbarrier_init(s.k_full(b), 1);
      sm90::mbarrier_init(s.k_empty(b), C::kConsumerThreads);
      sm90::mbarrier_init(s.v_full(b), 1);
      sm90::mbarrier_init(s.v_empty(b), C::kConsumerThreads);
    }
    sm90::fence_proxy_async_shared();  // the copy engine sees the initialized barriers
  }
  __syncthreads();  // the last block-wide barrier: the roles split here
  // Nothing computed above lives past setmaxnreg (the producer keeps 40 or
  // 32 registers: what lived longer would be spilled), so each role works
  // out its items' rows and K/V blocks for itself.
  if (threadIdx.x / kThreads == 0) {
    sm90::setmaxnreg_dec<C::kProducerRegs>();
    if (threadIdx.x == 0) produce<Elem, C>(p, maps, s);
  } else {
    sm90::setmaxnreg_inc<C::kConsumerRegs>();
    consume<Elem, C>(p, maps, s, threadIdx.x / kThreads - 1);
  }
#endif
}

}  // namespace flashstep::hopper
