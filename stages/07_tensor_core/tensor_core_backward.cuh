// Stage 07's backward kernels: FlashAttention-2's Algorithm 2 (Dao 2023) on
// tensor cores, bf16 or fp16 in and out, fp32 accumulators. Included by
// tensor_core_backward.cu only.
//
// Three kernels, as FlashAttention-2 runs them:
//   prepare_kernel   line 4: D_i = rowsum(dO_i o O_i); L_i into log2 units
//                    (the atomic variant's fp32 accumulator of dQ is zeroed
//                    by a memset before it)
//   dkdv_kernel      lines 5-20: one thread block per (K/V block j, K/V
//                    head), Kj, Vj kept in shared memory and dK_j, dV_j in
//                    registers while the Q blocks stream past, those of
//                    every query head of the K/V head's group; dQ_i += dS_ij
//                    Kj by fp32 atomic adds (atomic variant)
//   convert_dq_kernel  dQ = scale * accumulator, rounded to the element type
// The deterministic variant replaces the atomics and the conversion by
//   dq_kernel        one thread block per (Q block i, query head), summing
//                    dQ_i = scale sum_j dS_ij Kj over the K/V blocks of its
//                    group's K/V head in one fixed order, S_ij and dP_ij
//                    recomputed
//
// Grouped-query heads (H_kv < H): dK_j and dV_j of a K/V head are sums over
// the H / H_kv query heads of its group. The (dK, dV) kernel streams the Q
// blocks of all of them, member after member, through its one pipelined
// loop: the sums stay in registers, each dK_j, dV_j is written once, and
// they need no atomics (summing per query head in global memory would).
// With H_kv = H the group is one head and the loop is as before.
//
// The five products of dkdv_kernel, and where P and dS live. A warp owns 16
// keys of Kj (its key group) and computes the TRANSPOSED scores
// S_ij^T = Kj Qi^T (keys as rows, queries as columns): the key index is then
// the m (row) index of every accumulator it holds, which is what both dV_j
// and dK_j want.
//   S^T  = Kw Qi^T        A: Kw (ldmatrix)      B: Qi (ldmatrix)
//   P^T  = exp2(S^T scale log2e - L)            registers, fp32
//   dV  += P^T dOi        A: P^T from REGISTERS (the accumulator layout of
//                         two n8 tiles is the A layout of one k16 step,
//                         common/mma_sm80.cuh), rounded to 16 bits
//                         B: dOi (ldmatrix.trans)
//   dP^T = Vw dOi^T       A: Vw (ldmatrix)      B: dOi (ldmatrix)
//   dS^T = P^T o (dP^T - D)                     registers, fp32
//   dK  += dS^T Qi        A: dS^T from REGISTERS, as P^T   B: Qi (ldmatrix.trans)
//   dQi += dS Kj          A: dS through SHARED MEMORY      B: Kj (ldmatrix.trans)
// dS goes through shared memory for dQ for two reasons: dQ_i needs dS with
// the QUERY as its row (m) index, the transpose of what the registers hold
// (a register fragment cannot be transposed in place: each lane holds two
// neighbouring columns of one row), and dQ_i sums over all Bc keys, which
// the warps hold 16 each: the sum has to cross warps anyway. So the block
// writes dS_ij^T (rounded to 16 bits) once into a [Bc x Br] tile, as the
// registers hold it: a lane's two neighbouring queries are one 32-bit store.
// Each warp reads back 16 query rows of dS_ij as A fragments with
// ldmatrix.trans, which transposes on the way (load_a_transposed). Written
// as dS (queries as rows) the tile took twice the stores, 16-bit ones.
//
// At d = 128 dkdv_kernel (atomic or not), and the atomic one at d = 64,
// tile the same products in two dimensions instead, as FlashAttention-2
// does (warp_tile_2d in tensor_core_backward_tiles.h), Bc = 128 keys and 8
// warps: warp w computes S^T and dP^T for 32 keys (w % 4) x Br / 2 queries
// (w / 4; Br = 64 queries a pass at d = 128, 128 at d = 64: q_block), which
// reads 32 + 32 rows of the operands where 16 keys x 64 queries read 16 +
// 64 for as many scores (32 + 64 for twice as many at d = 64), and stores
// P^T and dS^T (rounded) to shared memory; after a barrier it accumulates
// dV_j, dK_j for the same 32 keys x d / 2 columns (w / 4), its A fragments
// (32 keys x all Br queries of P^T, dS^T) by ldmatrix from those tiles:
//   S^T  = Kw Qw^T        A: Kw (ldmatrix)      B: Qw, Br / 2 queries (ldmatrix)
//   dP^T = Vw dOw^T       A: Vw (ldmatrix)      B: dOw, Br / 2 queries (ldmatrix)
//   dV  += P^T dOi        A: P^T (ldmatrix)     B: dOi, d / 2 columns (ldmatrix.trans)
//   dK  += dS^T Qi        A: dS^T (ldmatrix)    B: Qi, d / 2 columns (ldmatrix.trans)
//   dQi += dS Kj          A: dS (ldmatrix.trans)   B: Kj (ldmatrix.trans), warps
//                         over dQ_i not as the tiles above (dq_row_groups): at
//                         d = 128 FlashAttention-2's 2 x 4, 32 queries x 32
//                         columns a warp; at d = 64 its 4 x 2, 32 queries x
//                         32 columns
// At d = 128, 576 KiB of ldmatrix a pass, FlashAttention-2's count, instead
// of 736 (docs/results/tuning_07/README.md, rounds 9 and 10), for 16 KiB
// more stored and a second barrier a pass (the deterministic kernel: 448
// instead of 640, for 32 KiB stored and a second barrier); at d = 64
// (atomic), 576 KiB a 128 x 128 pass, 288 a 64 x 128 area, FlashAttention-2's
// count, where passes of 64 queries read 352 a 64 x 128 pass (round 10b)
// and two 64 x 64 passes of the 1-D tiles 400, with two barriers a 128 x
// 128 pass instead of four (round 11).
//
// Shared memory: Kj and Vj for the block's life; Qi, dOi, and their rows' L
// and D double-buffered (cp.async brings block i + 1 while block i computes);
// at d = 256 the dS tile double-buffered too (atomic variant), so that
// block i's dQ step runs after block i + 1's one barrier, beside its
// products: one block barrier per Q block (dkdv_block proves the order
// race-free); at d = 64 and 128 one dS tile and a second barrier (ds_tiles),
// with the 2-D warp tiles beside a P^T tile (pt_tiles; the deterministic
// kernel has both tiles at d = 128 and none elsewhere). With 1-D warp tiles
// a warp computes S^T and dP^T for all 64 queries of the Q block at once in
// the atomic kernel at d = 256, reading its Kw and Vw fragments once a Q
// block, and for 32 at a time elsewhere, which keeps their accumulators beside
// dK_j's and dV_j's within the registers (q_slice in
// tensor_core_backward_tiles.h). All tiles but L and D in the
// forward's swizzled layout (tensor_core.cuh), whose fragment loaders this
// file reuses.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/element.cuh"
#include "common/mma_sm80.cuh"
#include "common/reduce.cuh"
#include "tensor_core.cuh"
#include "tensor_core_backward_tiles.h"

namespace flashstep::tensor_core::bwd {

/// Kernel arguments. Elem is __nv_bfloat16 or __half.
template <typename Elem>
struct BackwardParams {
  const Elem* Q;       // [heads, Nq, d]
  const Elem* K;       // [kv_heads, Nk, d]
  const Elem* V;       // [kv_heads, Nk, d]
  const Elem* O;       // [heads, Nq, d], the forward's output
  const float* L;      // [heads, Nq], the forward's logsumexp (natural log)
  const Elem* dO;      // [heads, Nq, d]
  Elem* dQ;            // [heads, Nq, d]
  Elem* dK;            // [kv_heads, Nk, d]
  Elem* dV;            // [kv_heads, Nk, d]
  float* dQ_accum;     // [heads, dq_accum_rows(Nq), bucket], fp32: the atomic variant's sums
  float* D;            // [heads, Nq]: rowsum(dO o O)
  float* L_log2;       // [heads, Nq]: L log2(e), +inf for a row that sees no key
  std::int64_t heads;     // B * H
  std::int64_t kv_heads;  // B * H_kv
  // Query heads per K/V head, H / H_kv: a group's query heads are consecutive,
  // K/V head kv serving query heads kv G .. kv G + G - 1, so query head bh
  // reads K/V head bh / G (common/problem.h's kv_head_of, one division).
  int G;
  int Nq, Nk, d;
  bool causal;
  float scale;       // the softmax scale, any sign
  float scale_log2;  // scale * log2(e): P = 2^(S scale_log2 - L_log2)
  bool vec;          // d % 8 == 0 and 16-byte aligned tensors: whole-chunk copies
};

/// What the head-dimension bucket and the variant (dQ by atomics or not)
/// fix at compile time.
template <int kHeadDim_, bool kAtomicDQ_>
struct BackwardConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kAtomicDQ = kAtomicDQ_;
  static constexpr int kKeyGroups = key_groups(kHeadDim, kAtomicDQ);
  // Query rows per pass (q_block): 128 in the atomic kernel at d = 64, else
  // kBr. The sizes below that name kBr are this one's.
  static constexpr int kBr = q_block(kHeadDim, kAtomicDQ);
  static constexpr int kBc = block_keys(kHeadDim, kAtomicDQ);
  static constexpr int kDSplit = d_split(kHeadDim);
  static constexpr int kWarps = warps(kHeadDim, kAtomicDQ);
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kWarpCols = kHeadDim / kDSplit;  // columns of dK_j, dV_j per warp
  static constexpr int kColTiles = kWarpCols / kMmaN;   // their n8 tiles
  static constexpr int kKeySteps = kBc / kMmaK;         // k16 steps over the keys (dQ)
  static constexpr int kDSteps = kHeadDim / kMmaK;      // k16 steps over d (S^T, dP^T)
  // The dQ step (atomic variant; the deterministic config carries these
  // unused): warps split dQ_i's rows kDQRowGroups ways, kDQRowTiles m16
  // tiles each (dq_row_groups), and its columns the other way.
  static constexpr int kDQRowGroups = dq_row_groups(kHeadDim);
  static constexpr int kDQRowTiles = kBr / kDQRowGroups / kMmaM;
  static constexpr int kDQCols = dq_warp_cols(kHeadDim);      // dQ columns per warp
  static constexpr int kDQChunkCols = dq_chunk(kHeadDim);     // of them at a time
  static constexpr int kChunkTiles = kDQChunkCols / kMmaN;    // n8 tiles of a dQ chunk
  // Whether the dQ step runs before the 2-D tiles' dV product, its
  // reductions spread over that product's k16 steps (dq_on_dv), or after
  // the dV and dK products.
  static constexpr bool kDQOnDV = kAtomicDQ && dq_on_dv(kHeadDim);

  // Shared memory: Kj, Vj; two buffers of Qi and dOi; two buffers of L and
  // D (fp32); then the dS^T and P^T tiles: in the atomic variant kDSTiles
  // dS tiles (ds_tiles says why one or two) and kPTTiles P^T tiles (one
  // with the 2-D warp tiles, warp_tile_2d); in the deterministic
  // variant, which has no dQ step, one of each with the 2-D warp tiles (for
  // dK and dV) and none without.
  static constexpr int kDSTiles = ds_tiles(kHeadDim);
  static constexpr int kPTTiles = pt_tiles(kHeadDim, kAtomicDQ);
  static constexpr int kKVElems = kBc * kHeadDim;
  static constexpr int kQElems = kBr * kHeadDim;
  static constexpr int kDSElems = kBr * kBc;
  static constexpr int kRowFloats = 2 * 2 * kBr;  // L and D, two buffers each
  static constexpr int smem_bytes() {
    const int score_tiles = kAtomicDQ ? kDSTiles + kPTTiles : 2 * kPTTiles;
    return (2 * kKVElems + 4 * kQElems + score_tiles * kDSElems) * 2 + kRowFloats * 4;
  }
  // The atomic kernel's tiles: 162 KiB at d = 64 (Bc = 128, passes of 128
  // queries, a dS and a P^T tile; one block an SM, as its registers allow),
  // 161 KiB at d = 128 (a dS and a P^T tile; one block, as its registers
  // allow), 209 KiB at d = 256. The deterministic kernel's: 49 KiB at
  // d = 64, 161 KiB at d = 128, 193 KiB at d = 256.
  static_assert(smem_bytes() <= sm90::kMaxSmemBytesPerBlock,
                "the dS and P^T tiles fit beside the other tiles in every bucket");

  static_assert(!kAtomicDQ || (kBr == kDQRowGroups * kDQRowTiles * kMmaM &&
                               kWarps % kDQRowGroups == 0 &&
                               kWarps / kDQRowGroups * kDQCols == kHeadDim),
                "in the dQ step each row group's warps take whole m16 tiles of query rows "
                "and together all d columns");
  static_assert(kDQCols % kDQChunkCols == 0 && kChunkTiles % 2 == 0 && kColTiles % 2 == 0,
                "whole chunks, n8 tiles in pairs");
  static_assert(kHeadDim / kChunkElems >= 8, "the swizzle permutes 8 chunks of a row");
};

// ---------------------------------------------------------------------------
// Line 4: D, L in log2 units. One warp per row.

template <typename Elem>
__global__ void __launch_bounds__(kPrepRowsPerBlock * kWarpSize)
    prepare_kernel(const BackwardParams<Elem> p) {
  const int lane = threadIdx.x % kWarpSize;
  const std::int64_t rows = p.heads * p.Nq;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * kPrepRowsPerBlock;
  for (std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kPrepRowsPerBlock +
                          threadIdx.x / kWarpSize;
       row < rows; row += stride) {
    const Elem* dOr = p.dO + row * p.d;  // [d]
    const Elem* Or = p.O + row * p.d;    // [d]
    float sum = 0.0f;
    for (int k = lane; k < p.d; k += kWarpSize) sum += to_float(dOr[k]) * to_float(Or[k]);
    sum = warp_reduce(sum, SumOp{});
    if (lane == 0) {
      p.D[row] = sum;
      // A row that sees no key has L = -inf (the forward's contract); +inf
      // here makes its P = 2^(S - inf) = 0 for every key instead of NaN.
      const float L = p.L[row];
      p.L_log2[row] = L == -INFINITY ? INFINITY : L * static_cast<float>(kLog2e);
    }
  }
}

// ---------------------------------------------------------------------------
// Fragments.

/// The A fragment of k16 step kk from the accumulators of n8 tiles 2 kk and
/// 2 kk + 1 (P^T or dS^T), rounded to Elem: registers to registers.
template <typename Elem, int kTiles>
__device__ inline void accumulator_to_a(std::uint32_t (&a)[4], const float (&acc)[kTiles][4],
                                        int kk) {
  a[0] = sm80::pack2<Elem>(acc[2 * kk][0], acc[2 * kk][1]);
  a[1] = sm80::pack2<Elem>(acc[2 * kk][2], acc[2 * kk][3]);
  a[2] = sm80::pack2<Elem>(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
  a[3] = sm80::pack2<Elem>(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
}

/// The A fragment of k depth k0 .. k0 + 15 of a matrix held TRANSPOSED in a
/// [k][kCols] tile (dS_ij^T: keys as rows, the pass's kCols = Br queries as
/// columns), at the rows m0 .. m0 + 15 fixed by lane_at, the lane's offset
/// at k0 = 0 (dst_lane_offset). ldmatrix.trans transposes each 8 x 8 block
/// on the way in.
template <typename Elem, int kCols>
__device__ inline void load_a_transposed(std::uint32_t (&a)[4], const Elem* tile, int lane_at,
                                         int k0) {
  // k0 % 8 == 0: the swizzle is unchanged
  sm80::ldmatrix_x4_trans(a, tile + lane_at + k0 * kCols);
}

/// A lane's ldmatrix.trans address (in elements) in a [k][kCols] transposed
/// tile for rows m0 .. m0 + 15 of the A fragment, at k0 = 0. A's registers
/// are the 8 x 8 blocks (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15),
/// (m 8-15, k 8-15), which in the transposed tile are (k 0-7, m 0-7), (k 0-7,
/// m 8-15), (k 8-15, m 0-7), (k 8-15, m 8-15): lanes 0-7 point at the first
/// block's rows, 8-15 the second's, and so on, which is k_point's pattern
/// (the B fragment of Q K^T has the same blocks in the same order). m0
/// depends on the warp, a runtime value: looked up in a LaneOffsets table it
/// would put the table in local memory, so it is computed once here.
template <int kCols>
__device__ inline int dst_lane_offset(int m0) {
  const LanePoint point = k_point(threadIdx.x % kWarpSize);
  return tile_offset<kCols, true>(point.row, m0 + point.col);
}

/// acc[16 rows x kTiles * 8] = 16 rows of A times tile B^T, over the k16
/// steps of kHeadDim: a_of(ks, scratch) gives A's fragment of step ks (loaded
/// into scratch, or held elsewhere). B's rows are the n index,
/// [rows][kHeadDim] with the k depth along d.
template <typename Elem, int kHeadDim, int kTiles, typename AFragment>
__device__ inline void product_abt_of(float (&acc)[kTiles][4], AFragment a_of, const Elem* B,
                                      const LaneOffsets<kHeadDim>& at_bk) {
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
  }
#pragma unroll
  for (int ks = 0; ks < kHeadDim / kMmaK; ++ks) {
    std::uint32_t scratch[4];
    const std::uint32_t(&a)[4] = a_of(ks, scratch);
#pragma unroll
    for (int np = 0; np < kTiles / 2; ++np) {
      std::uint32_t b[4];
      load_b_k<Elem, kHeadDim, true>(b, B, at_bk, np * 2 * kMmaN, ks * kMmaK);
      const std::uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
      sm80::mma_m16n8k16<Elem>(acc[2 * np], a, b_lo);
      sm80::mma_m16n8k16<Elem>(acc[2 * np + 1], a, b_hi);
    }
  }
}

/// product_abt_of with A = rows row0 .. row0 + 15 of tile A, its fragments
/// loaded step by step: B's rows are queries (Qi or dOi) or keys (Kj/Vj),
/// both tiles [rows][kHeadDim]. S^T, dP^T (dkdv_kernel) and S, dP
/// (dq_kernel).
template <typename Elem, int kHeadDim, int kTiles>
__device__ inline void product_abt(float (&acc)[kTiles][4], const Elem* A, const Elem* B, int row0,
                                   const LaneOffsets<kHeadDim>& at_a,
                                   const LaneOffsets<kHeadDim>& at_bk) {
  product_abt_of<Elem, kHeadDim, kTiles>(
      acc,
      [&](int ks, std::uint32_t(&scratch)[4]) -> const std::uint32_t(&)[4] {
        load_a<Elem, kHeadDim, true>(scratch, A, at_a, row0, ks * kMmaK);
        return scratch;
      },
      B, at_bk);
}

/// product_abt_of with A's fragments held in registers: a[ks] is k16 step
/// ks of the warp's 16 rows, loaded once for many products (dq_kernel's Qi
/// and dOi rows).
template <typename Elem, int kHeadDim, int kTiles>
__device__ inline void product_abt_held(float (&acc)[kTiles][4],
                                        const std::uint32_t (&a)[kHeadDim / kMmaK][4],
                                        const Elem* B, const LaneOffsets<kHeadDim>& at_bk) {
  product_abt_of<Elem, kHeadDim, kTiles>(
      acc,
      [&](int ks, std::uint32_t(&)[4]) -> const std::uint32_t(&)[4] { return a[ks]; },
      B, at_bk);
}

/// acc[16 x kOutTiles * 8] += A (register fragments of kSteps k16 steps,
/// from accumulators) times columns col0 .. of tile B [k rows][kHeadDim]
/// (ldmatrix.trans: B's rows are the k index). dV += P^T dOi, dK += dS^T Qi,
/// and dq_kernel's dQ += dS Kj.
template <typename Elem, int kHeadDim, int kInTiles, int kOutTiles>
__device__ inline void product_ab(float (&acc)[kOutTiles][4], const float (&in)[kInTiles][4],
                                  const Elem* B, int col0, const LaneOffsets<kHeadDim>& at_bv) {
#pragma unroll
  for (int kk = 0; kk < kInTiles / 2; ++kk) {
    std::uint32_t a[4];
    accumulator_to_a<Elem, kInTiles>(a, in, kk);
#pragma unroll
    for (int np = 0; np < kOutTiles / 2; ++np) {
      std::uint32_t b[4];
      load_b_v<Elem, kHeadDim, true>(b, B, at_bv, kk * kMmaK, col0 + np * 2 * kMmaN);
      const std::uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
      sm80::mma_m16n8k16<Elem>(acc[2 * np], a, b_lo);
      sm80::mma_m16n8k16<Elem>(acc[2 * np + 1], a, b_hi);
    }
  }
}

/// The 2-D warp tile of a product A B^T (warp_tile_2d): acc[kRowTiles m16
/// tiles x kTiles n8 tiles] = rows row0 .. row0 + 16 kRowTiles - 1 of tile A
/// times the first 8 kTiles rows of tile B, transposed, over the k16 steps of
/// kHeadDim; both tiles [rows][kHeadDim], both operands by ldmatrix. Each k16
/// step loads A's fragments once for all n8 tiles and B's once for all m16
/// tiles: 32 keys x 32 queries read 32 + 32 rows, where a 16 x 64 tile read
/// 16 + 64. S^T = Kw Qw^T and dP^T = Vw dOw^T of the (dK, dV) kernels at
/// d = 128, and of the atomic one at d = 64.
template <typename Elem, int kHeadDim, int kRowTiles, int kTiles>
__device__ inline void product_abt_2d(float (&acc)[kRowTiles][kTiles][4], const Elem* A,
                                      const Elem* B, int row0, const LaneOffsets<kHeadDim>& at_a,
                                      const LaneOffsets<kHeadDim>& at_bk) {
#pragma unroll
  for (int mt = 0; mt < kRowTiles; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;
    }
  }
#pragma unroll
  for (int ks = 0; ks < kHeadDim / kMmaK; ++ks) {
    std::uint32_t a[kRowTiles][4];
#pragma unroll
    for (int mt = 0; mt < kRowTiles; ++mt) {
      load_a<Elem, kHeadDim, true>(a[mt], A, at_a, row0 + mt * kMmaM, ks * kMmaK);
    }
#pragma unroll
    for (int np = 0; np < kTiles / 2; ++np) {
      std::uint32_t b[4];
      load_b_k<Elem, kHeadDim, true>(b, B, at_bk, np * 2 * kMmaN, ks * kMmaK);
      const std::uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
#pragma unroll
      for (int mt = 0; mt < kRowTiles; ++mt) {
        sm80::mma_m16n8k16<Elem>(acc[mt][2 * np], a[mt], b_lo);
        sm80::mma_m16n8k16<Elem>(acc[mt][2 * np + 1], a[mt], b_hi);
      }
    }
  }
}

/// product_ab_2d's hook after a k16 step where there is nothing to do there.
struct NoStepHook {
  __device__ void operator()(int) const {}
};

/// The 2-D warp tile of a product A B (warp_tile_2d): acc[kRowTiles m16 tiles
/// x kOutTiles n8 tiles] += rows row0 .. of tile A, [Bc][kBr] (P^T or dS^T
/// as the score step stored them: keys as rows, the pass's kBr queries as
/// the k depth; ldmatrix), times B, [kBr][kHeadDim] from column 0 of the pointer
/// (dOi or Qi from the warp's first column: ldmatrix.trans). dV += P^T dOi
/// and dK += dS^T Qi of the (dK, dV) kernels at d = 128 (the atomic one at
/// d = 64 too): 32 keys x d / 2 columns read 32 rows of A and kBr x d / 2
/// of B, where 16 x d read all of B. after_step(kk) runs after k16 step kk's
/// mma (the atomic variant issues its dQ reductions there, dkdv_block).
template <typename Elem, int kHeadDim, int kBr, int kRowTiles, int kOutTiles,
          typename AfterStep = NoStepHook>
__device__ inline void product_ab_2d(float (&acc)[kRowTiles][kOutTiles][4], const Elem* A,
                                     int row0, const LaneOffsets<kBr>& at_a, const Elem* B,
                                     const LaneOffsets<kHeadDim>& at_bv,
                                     AfterStep after_step = {}) {
#pragma unroll
  for (int kk = 0; kk < kBr / kMmaK; ++kk) {
    std::uint32_t a[kRowTiles][4];
#pragma unroll
    for (int mt = 0; mt < kRowTiles; ++mt) {
      load_a<Elem, kBr, true>(a[mt], A, at_a, row0 + mt * kMmaM, kk * kMmaK);
    }
#pragma unroll
    for (int np = 0; np < kOutTiles / 2; ++np) {
      std::uint32_t b[4];
      load_b_v<Elem, kHeadDim, true>(b, B, at_bv, kk * kMmaK, np * 2 * kMmaN);
      const std::uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
#pragma unroll
      for (int mt = 0; mt < kRowTiles; ++mt) {
        sm80::mma_m16n8k16<Elem>(acc[mt][2 * np], a[mt], b_lo);
        sm80::mma_m16n8k16<Elem>(acc[mt][2 * np + 1], a[mt], b_hi);
      }
    }
    after_step(kk);
  }
}

/// Stores a warp's kRowTiles x kTiles accumulators of a transposed score
/// tile (keys as rows from key_row0, queries as columns from q_col0: P^T or
/// dS^T), rounded to Elem, into a [Bc][kBr] tile (kBr: the pass's queries),
/// as the registers hold them: a lane's two neighbouring queries are one
/// 32-bit store.
template <typename Elem, int kBr, int kRowTiles, int kTiles>
__device__ inline void store_scores_transposed(Elem* tile, const float (&acc)[kRowTiles][kTiles][4],
                                               int key_row0, int q_col0) {
  const int lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mt = 0; mt < kRowTiles; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kTiles; ++nt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // keys g and g + 8, two neighbouring queries each
        const int key = key_row0 + mt * kMmaM + g + 8 * h;
        const int q = q_col0 + nt * kMmaN + 2 * t;
        *reinterpret_cast<std::uint32_t*>(tile + tile_offset<kBr, true>(key, q)) =
            sm80::pack2<Elem>(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
      }
    }
  }
}

/// Writes a warp's 16 x (kTiles * 8) accumulators, times `factor` and
/// rounded to Elem, to rows row0 .. of a [rows_valid, d] global array at
/// columns col0 ..; elements past rows_valid or d are not written. Element
/// by element: dK_j and dV_j are written once per block, so the uncoalesced
/// 2-byte stores cost nothing next to the loop, and they need no alignment.
template <typename Elem, int kTiles>
__device__ inline void store_rows(Elem* dst, const float (&acc)[kTiles][4], int row0, int col0,
                                  int rows_valid, int d, float factor) {
  const int lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = row0 + g + 8 * (e / 2);
      const int col = col0 + nt * kMmaN + 2 * t + e % 2;
      if (row < rows_valid && col < d) {
        dst[static_cast<std::int64_t>(row) * d + col] = from_float<Elem>(acc[nt][e] * factor);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Lines 5-20: dK_j, dV_j (and dQ by atomics).

/// dQ_i's fp32 accumulator += one n8 tile of a warp's dQ product, by atomic
/// adds. `at` is this lane's element (row g, column 2t) of the tile in the
/// accumulator's layout (dq_accum_index: fragment order); its rows are
/// kRowElems long (the bucket). Each of the lane's four registers is one
/// 4-byte reduction (red.global.add.f32), the warp's 32 of a register 32
/// consecutive floats, four whole 32-byte sectors. Every address is `at`
/// plus a constant, no checks: the accumulator is padded (dq_accum_rows).
/// (The first version, in the row-by-row layout, swapped a pair between
/// neighbouring lanes for one 16-byte reduction each and checked rows and
/// columns against Nq and d: ncu's source counters put a third of
/// dkdv_kernel's time in the dQ step at d = 128, with more such
/// instructions than mma and ldmatrix together.)
template <int kRowElems>
__device__ inline void add_to_dq(float* at, const float (&acc)[4]) {
  constexpr int kNextColumn = kDQRegisterElems;  // column 2t + 1: the block's second half
  constexpr int kRowsBelow = kDQBlock * kRowElems;  // row g + 8: the next row of blocks
  atomicAdd(at, acc[0]);
  atomicAdd(at + kNextColumn, acc[1]);
  atomicAdd(at + kRowsBelow, acc[2]);
  atomicAdd(at + kRowsBelow + kNextColumn, acc[3]);
}

/// Adds tile `tile` of a warp's dQ chunk (dq_step), its m16 tile
/// tile / kChunkTiles and n8 tile tile % kChunkTiles, the lane's element of
/// the chunk at `at`: an m16 tile is two rows of blocks, an n8 tile one
/// block along its row of blocks.
template <typename C>
__device__ inline void add_dq_tile(float* at, const float (&acc)[C::kDQRowTiles][C::kChunkTiles][4],
                                   int tile) {
  const int mt = tile / C::kChunkTiles, nt = tile % C::kChunkTiles;
  add_to_dq<C::kHeadDim>(at + mt * kMmaM * C::kHeadDim + nt * kDQBlockElems, acc[mt][nt]);
}

/// dq_step's chunks added as soon as they are made, every reduction of a
/// chunk back to back.
template <typename C>
struct AddChunkNow {
  __device__ void operator()(float* at,
                             const float (&acc)[C::kDQRowTiles][C::kChunkTiles][4]) const {
#pragma unroll
    for (int tile = 0; tile < C::kDQRowTiles * C::kChunkTiles; ++tile) add_dq_tile<C>(at, acc, tile);
  }
};

/// Starts the copies of a pass's C::kBr query rows (q_block: one Q block, or
/// two at d = 64 in the atomic kernel), Qi and dOi and their rows' L and D,
/// into their buffers (cp.async): the rows from q0 on of the query head bh
/// whose row 0 is row head_row = bh Nq of [heads * Nq]. Rows past Nq get Q = dO = 0,
/// L = +inf (P = 0) and D = 0. Every Q block but a ragged last one has all
/// its rows, and with d equal to the bucket and 16-byte aligned tensors takes
/// load_full_tile_async: one address per tile and constant offsets, where
/// load_tile's per-chunk row, column and bounds arithmetic was most of the
/// loop head's instructions. Its L and D come by 4-byte cp.async: loaded and
/// stored by the first two warps, they held those warps at the store for the
/// load's latency, every Q block. The ragged block, which needs the +inf,
/// loads them plainly.
template <typename Elem, typename C>
__device__ inline void load_q_block(const BackwardParams<Elem>& p, std::int64_t head_row, int q0,
                                    Elem* Qi, Elem* dOi, float* Ls, float* Ds) {
  const std::int64_t row0 = head_row + q0;
  const bool all_rows = q0 <= p.Nq - C::kBr;
  if (p.vec && p.d == C::kHeadDim && all_rows) {
    sm80::load_full_tile_async<Elem, C::kBr, C::kHeadDim, C::kThreads>(Qi,
                                                                       p.Q + row0 * C::kHeadDim);
    sm80::load_full_tile_async<Elem, C::kBr, C::kHeadDim, C::kThreads>(dOi,
                                                                       p.dO + row0 * C::kHeadDim);
  } else {
    load_tile<Elem, C::kBr, C::kHeadDim, true, true, C::kThreads>(Qi, p.Q + row0 * p.d,
                                                                   p.Nq - q0, p.d, p.vec);
    load_tile<Elem, C::kBr, C::kHeadDim, true, true, C::kThreads>(dOi, p.dO + row0 * p.d,
                                                                   p.Nq - q0, p.d, p.vec);
  }
  if (threadIdx.x < C::kBr) {
    if (all_rows) {
      sm80::cp_async_4(Ls + threadIdx.x, p.L_log2 + row0 + threadIdx.x);
      sm80::cp_async_4(Ds + threadIdx.x, p.D + row0 + threadIdx.x);
    } else {
      const bool inside = static_cast<int>(threadIdx.x) < p.Nq - q0;
      Ls[threadIdx.x] = inside ? p.L_log2[row0 + threadIdx.x] : INFINITY;
      Ds[threadIdx.x] = inside ? p.D[row0 + threadIdx.x] : 0.0f;
    }
  }
}

/// Line 15 of one pass, the atomic variant's dQ step: dQ_i += dS_ij Kj,
/// from dS (a [Bc][Br] tile of dS_ij^T, keys as rows, as the products wrote
/// it) and Kj, added by atomics to the fp32 accumulator's rows dq_row .. of
/// [heads * dq_accum_rows(Nq)] (the pass's first row there). rows_left,
/// Nq less the pass's first row, matters only where a pass takes two Q
/// blocks (C::kBr > kBr, q_block): a warp whose rows start past the pass's
/// last Q block with real rows adds nothing, since the accumulator, padded
/// to whole Q blocks of kBr, has no rows there. Reads shared memory only;
/// the caller keeps the tile's writers out (dkdv_block). Each chunk goes to
/// add(at, acc), at the lane's element (row g, column 2t) of the chunk in
/// the accumulator: AddChunkNow adds it there and then; dkdv_block, where
/// the step rides on the dV product (kDQOnDV), keeps it and spreads its
/// reductions over that product.
template <typename Elem, typename C, typename AddChunk = AddChunkNow<C>>
__device__ inline void dq_step(const BackwardParams<Elem>& p, const Elem* dS, const Elem* Kj,
                               std::int64_t dq_row, [[maybe_unused]] int rows_left,
                               AddChunk add = {}) {
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  // Warp w takes the kRowTiles m16 tiles of query rows of dQ_i from
  // 16 kRowTiles (w % C::kDQRowGroups) on and C::kDQCols of its columns from
  // (w / C::kDQRowGroups) C::kDQCols on, summing over all Bc keys
  // (dq_row_groups: 16 rows x 128 columns a warp at d = 256,
  // FlashAttention-2's 32 x 32 at d = 128 and, passes of 128 rows, at d = 64).
  constexpr int kRowTiles = C::kDQRowTiles;
  const int q_row0 = warp % C::kDQRowGroups * kRowTiles * kMmaM;
  const int dq_col0 = warp / C::kDQRowGroups * C::kDQCols;
  if constexpr (C::kBr > kBr) {
    if (q_row0 >= dq_accum_rows(rows_left)) return;  // past the accumulator's rows
  }
  // The lane's offsets into Kj from column dq_col0 on. dq_col0 is a runtime
  // value (0 or 32 at d = 64; 0, 32, 64 or 96 at d = 128); passed as a
  // column to a lane table made at column 0, it would index the table at run
  // time, and the table would go to local memory (below). Folded into the
  // table's point, the columns left are compile-time constants. (The table's
  // entries past the tile's row, from column d - dq_col0 on, are wrong and
  // unused: a warp reads its kDQCols columns only.)
  const LanePoint vp = v_point(lane);
  const LaneOffsets<C::kHeadDim> at_kq(LanePoint{vp.row, vp.col + dq_col0});
  // And into the dS tile for m16 tile mt of its rows, one offset per tile
  // (the swizzle permutes a row's chunks: the second tile's is not the
  // first's plus 16), each computed once by the compiler. (An array of them
  // filled in a loop compiled to other SASS at d = 256, for nothing.)
  auto at_ds = [&](int mt) { return dst_lane_offset<C::kBr>(q_row0 + mt * kMmaM); };
  // The lane's element (row g, column 2t) of its warp's part of dQ_i, in
  // fragment order (dq_accum_index, written out: the first row and column,
  // dq_row + q_row0 and dq_col0 + chunk, are multiples of 8, so their
  // blocks' offsets are products, kDQBlockElems / kDQBlock floats a column).
  constexpr int kColumnElems = kDQBlockElems / kDQBlock;
  float* dQw = p.dQ_accum + ((dq_row + q_row0) * C::kHeadDim + dq_col0 * kColumnElems +
                             kDQLanesPerRow * g + t);
  // The chunk loop is unrolled so that every column offset into Kj is a
  // compile-time constant: with a runtime chunk, the lane's swizzle table
  // (LaneOffsets) was indexed at run time and ptxas put it in local memory,
  // two local loads per fragment (ncu: 33 M local sectors at d = 64).
#pragma unroll
  for (int c = 0; c < C::kDQCols / C::kDQChunkCols; ++c) {
    const int chunk = c * C::kDQChunkCols;  // from dq_col0
    if (dq_col0 + chunk >= p.d) break;
    float acc[kRowTiles][C::kChunkTiles][4];
#pragma unroll
    for (int mt = 0; mt < kRowTiles; ++mt) {
#pragma unroll
      for (int nt = 0; nt < C::kChunkTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;
      }
    }
    // Each k16 step loads the A fragments of the warp's rows of dS once for
    // all n8 tiles and Kj's B fragments once for all m16 tiles.
#pragma unroll
    for (int kk = 0; kk < C::kKeySteps; ++kk) {
      std::uint32_t a[kRowTiles][4];
#pragma unroll
      for (int mt = 0; mt < kRowTiles; ++mt) {
        load_a_transposed<Elem, C::kBr>(a[mt], dS, at_ds(mt), kk * kMmaK);
      }
#pragma unroll
      for (int np = 0; np < C::kChunkTiles / 2; ++np) {
        std::uint32_t b[4];
        load_b_v<Elem, C::kHeadDim, true>(b, Kj, at_kq, kk * kMmaK, chunk + np * 2 * kMmaN);
        const std::uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
#pragma unroll
        for (int mt = 0; mt < kRowTiles; ++mt) {
          sm80::mma_m16n8k16<Elem>(acc[mt][2 * np], a[mt], b_lo);
          sm80::mma_m16n8k16<Elem>(acc[mt][2 * np + 1], a[mt], b_hi);
        }
      }
    }
    add(dQw + kColumnElems * chunk, acc);
  }
}

template <typename Elem, typename C>
__device__ inline void dkdv_block(const BackwardParams<Elem>& p, std::int64_t kv, int j,
                                  unsigned char* smem) {
  constexpr bool kAtomicDQ = C::kAtomicDQ;
  constexpr int kBc = C::kBc;
  // The pass's query rows (q_block): the Br of the tiles below.
  constexpr int kBrPass = C::kBr;
  Elem* Kj = reinterpret_cast<Elem*>(smem);  // [Bc][kHeadDim]
  Elem* Vj = Kj + C::kKVElems;               // [Bc][kHeadDim]
  Elem* Qbuf = Vj + C::kKVElems;             // 2 x [Br][kHeadDim]
  Elem* dObuf = Qbuf + 2 * C::kQElems;       // 2 x [Br][kHeadDim]
  float* Lbuf = reinterpret_cast<float*>(dObuf + 2 * C::kQElems);  // 2 x [Br]
  float* Dbuf = Lbuf + 2 * kBrPass;                                 // 2 x [Br]
  // kDSTiles x [Bc][Br]: dS_ij^T, keys as rows (atomic variant, and 2-D
  // warp tiles)
  Elem* dSbuf = reinterpret_cast<Elem*>(Dbuf + 2 * kBrPass);
  // kPTTiles x [Bc][Br]: P_ij^T, keys as rows (2-D warp tiles only)
  Elem* PT = dSbuf + C::kDSTiles * C::kDSElems;
  // Whether a pair's dQ step waits for the next pair's pass (two dS tiles)
  // or follows its products behind a barrier of its own (one).
  constexpr bool kDeferDQ = kAtomicDQ && C::kDSTiles == 2;
  // 1-D warp tiles: queries per slice of S^T and dP^T, and their n8 tiles.
  constexpr int kQSlice = q_slice(C::kHeadDim, kAtomicDQ);
  constexpr int kQTiles = kQSlice / kMmaN;
  // 2-D warp tiles (warp_tile_2d: d = 128, and d = 64 atomic), or 1-D ones
  // (a key group of 16 keys a warp, all d / kDSplit columns).
  constexpr bool k2D = warp_tile_2d(C::kHeadDim, kAtomicDQ);
  static_assert(!k2D || (kTileKeyWarps * kTileSideWarps == C::kWarps && !kDeferDQ &&
                         C::kDSTiles == 1 && C::kPTTiles == 1 && C::kDSplit == 1),
                "2-D tiles: every warp one tile, one dS tile, one P^T tile, no d split");
  static_assert(k2D || kBrPass == kBr, "1-D tiles: passes of one Q block (q_slice)");
  // A warp's m16 tiles of keys (of S^T, dP^T, dK_j and dV_j alike), and the
  // n8 tiles of its columns of dK_j and dV_j.
  constexpr int kKeyTiles = k2D ? kBc / kTileKeyWarps / kMmaM : 1;
  constexpr int kGradTiles = k2D ? C::kHeadDim / kTileSideWarps / kMmaN : C::kColTiles;
  // 2-D tiles: the n8 tiles of a warp's queries of S^T and dP^T (4 of 32
  // queries; 8 of 64 at d = 64, atomic, in passes of 128 queries).
  constexpr int kTileQTiles = kBrPass / kTileSideWarps / kMmaN;

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  // This warp's first key of Kj, Vj (16 kKeyTiles keys) and first column of
  // dK_j, dV_j (8 kGradTiles columns): warp w is key group w % kKeyGroups
  // (1-D) or takes keys by w % kTileKeyWarps and columns by w /
  // kTileKeyWarps (2-D).
  const int key_row0 =
      (k2D ? warp % kTileKeyWarps : warp % C::kKeyGroups) * kKeyTiles * kMmaM;
  const int col0 = k2D              ? warp / kTileKeyWarps * kGradTiles * kMmaN
                   : C::kDSplit == 1 ? 0
                                     : warp / C::kKeyGroups * C::kWarpCols;
  // col0 (64 at d = 128, 0 or 128 at d = 256) is a runtime value and a whole
  // number of swizzle spans: the dV and dK products take it on the tile's
  // pointer, so that the columns they pass to their lane table (at_bv) stay
  // compile-time constants. Passed as a column it indexed the table at run
  // time, and ptxas put the table in local memory: six local loads every
  // query slice. At d = 64 (2-D tiles, 32 columns a warp) col0 is 0 or 32,
  // half a span, which the pointer cannot take (the swizzle permutes a
  // span's chunks by row): there it goes into the point of a lane table of
  // its own (at_bcol), as dq_step's columns do, and the pointer stays.
  constexpr bool kColInTable = kGradTiles * kMmaN < sm80::kSwizzleSpan;
  static_assert(C::kWarpCols % sm80::kSwizzleSpan == 0 &&
                    (kColInTable ? k2D && sm80::kSwizzleSpan == kTileSideWarps * kGradTiles * kMmaN
                                 : kGradTiles * kMmaN % sm80::kSwizzleSpan == 0),
                "col0 moves by whole swizzle spans, or lies inside the tile's one span");
  const int key0 = j * kBc;
  const int keys_valid = min(kBc, p.Nk - key0);
  Elem* dKh = p.dK + kv * p.Nk * p.d + static_cast<std::int64_t>(key0) * p.d;  // [keys_valid, d]
  Elem* dVh = p.dV + kv * p.Nk * p.d + static_cast<std::int64_t>(key0) * p.d;  // [keys_valid, d]

  float dK[kKeyTiles][kGradTiles][4], dV[kKeyTiles][kGradTiles][4];
#pragma unroll
  for (int mt = 0; mt < kKeyTiles; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kGradTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dK[mt][nt][e] = dV[mt][nt][e] = 0.0f;
    }
  }
  // Lines 18-19: dK_j = scale dS^T Q summed (over the group's heads too),
  // dV_j as summed, the warp's m16 tiles of keys one by one.
  auto store_dk_dv = [&](float dk_scale) {
#pragma unroll
    for (int mt = 0; mt < kKeyTiles; ++mt) {
      const int row0 = key_row0 + mt * kMmaM;
      store_rows<Elem, kGradTiles>(dKh, dK[mt], row0, col0, keys_valid, p.d, dk_scale);
      store_rows<Elem, kGradTiles>(dVh, dV[mt], row0, col0, keys_valid, p.d, 1.0f);
    }
  };

  // The Q blocks above the first row that sees key0 are skipped, in every
  // query head of the group alike. Keys no row sees (causal, Nq < Nk) get
  // dK = dV = 0.
  const std::int64_t row_first = first_row(key0, p.Nq, p.Nk, p.causal);
  if (row_first >= p.Nq) {
    store_dk_dv(0.0f);  // dK and dV are still 0
    return;
  }
  // The first pass's first row: a Q block's, a multiple of kBr, so that the
  // causal skip keeps the Q blocks' grain in passes of two Q blocks too.
  const int q_first = static_cast<int>(row_first / kBr * kBr);

  const LaneOffsets<C::kHeadDim> at_a(a_point(lane)), at_bk(k_point(lane)), at_bv(v_point(lane));
  const LaneOffsets<kBrPass> at_ps(a_point(lane));  // A fragments of P^T, dS^T (2-D tiles)
  // The lane's offsets into dOi, Qi from column col0 on where col0 is half a
  // span (kColInTable: d = 64; unused elsewhere). Its entries past the row
  // (columns 64 - col0 on) are wrong and unused: a warp reads its 32 only.
  const LanePoint vp = v_point(lane);
  const LaneOffsets<C::kHeadDim> at_bcol(LanePoint{vp.row, vp.col + (kColInTable ? col0 : 0)});
  const LaneOffsets<C::kHeadDim>& at_grad = kColInTable ? at_bcol : at_bv;
  const int grad_col0 = kColInTable ? 0 : col0;  // col0 on the pointer

  load_tile<Elem, kBc, C::kHeadDim, true, true, C::kThreads>(              // line 6
      Kj, p.K + (kv * p.Nk + key0) * p.d, keys_valid, p.d, p.vec);
  load_tile<Elem, kBc, C::kHeadDim, true, true, C::kThreads>(
      Vj, p.V + (kv * p.Nk + key0) * p.d, keys_valid, p.d, p.vec);

  // Line 8 over the (query head, pass) pairs of the group (a pass: one Q
  // block, or two at d = 64 in the atomic kernel, q_block): query head bh's
  // passes from q_first on, then the next head's, G = H / H_kv heads in
  // all, as one loop, so that the pipeline runs on from one head into the
  // next. The pair advances by an increment and a wrap, never derived from a
  // step count by a division, and the loop keeps as many counters live as
  // the ungrouped one did (at d = 128 the kernel sits at 255 registers, where
  // one more spills): with G = 1 it is the ungrouped loop.
  std::int64_t bh = kv * p.G;  // the pair's query head
  int q0 = q_first;            // its pass's first row
  // The 2-D tiles' dQ step: its pass's first row of the fp32 accumulator,
  // [heads * dq_accum_rows(Nq)], carried with (bh, q0), so that a pass
  // finds its reductions' address by an add where bh dq_accum_rows(Nq) + q0
  // took a 64-bit multiply every pass, in the instructions right before
  // the reductions (no register more: 255 at d = 64 and 128, no spill).
  [[maybe_unused]] std::int64_t dq_pass = 0;
  if constexpr (kAtomicDQ && k2D) dq_pass = bh * dq_accum_rows(p.Nq) + q0;
  // Pairs left, this one included: an int (backward() refuses more).
  int left = p.G * ((p.Nq - q_first - 1) / kBrPass + 1);
  // Whether a pair has passed, whose dQ step is then due (kDeferDQ). A
  // flag: comparing `left` with a count of all pairs took a register more,
  // and ptxas -v (sm_90) showed 8 bytes spilled at d = 128; comparing
  // (bh, q0) with the group's first pair spilled at d = 128 and 256.
  [[maybe_unused]] bool after_first = false;
  // The buffers alternate with the parity of `left`, the first pair's too.
  const int first = left % 2;
  load_q_block<Elem, C>(p, bh * p.Nq, q0, Qbuf + first * C::kQElems, dObuf + first * C::kQElems,
                        Lbuf + first * kBrPass, Dbuf + first * kBrPass);
  sm80::cp_async_commit();

  // One block barrier per pair with two dS tiles (kDeferDQ). The atomic
  // variant's dQ step of a pair then runs in the next pair's pass, from the
  // other dS tile, so that the barrier that hands that pass its Q block also
  // hands it the finished dS tile. With one tile (d = 64 and 128) a pair's
  // dQ step follows its products behind a second barrier (the whole tile
  // written before any warp reads it), and barrier k + 1 keeps the next
  // products from rewriting the tile before every warp has read it. The
  // deterministic variant has no dQ step, and no dS tile but at d = 128.
  // With the 2-D warp tiles (d = 128, both variants; d = 64, atomic) P^T and dS^T both
  // cross that second barrier, to dV and dK (and the atomic variant's dQ
  // step): the second list below. The pass of pair k, with two tiles,
  // b = left % 2 and b' = 1 - b:
  //   after barrier k:  copies into Qi, dOi, L, D [b'] start (pair k + 1);
  //                     the dQ step of pair k - 1 reads dS [b'] and Kj;
  //                     the products of pair k read Qi, dOi, L, D [b], Kj,
  //                     Vj and write dS [b].
  // Each tile changes hands across one barrier:
  // - Qi, dOi, L, D [b]: their copies, started in pass k - 1, are waited for
  //   by each thread before barrier k (a ragged block's L and D are plain
  //   stores of pass k - 1), which makes them every warp's; they
  //   are refilled (pair k + 2) only after barrier k + 1, which every warp
  //   reaches after its products of pair k, their readers.
  // - Qi, dOi, L, D [b']: read by the products of pair k - 1, before barrier
  //   k; the copies of pair k + 1 into them start after it.
  // - dS [b]: written by the products of pair k, read by its dQ step after
  //   barrier k + 1 (the last pair's: after the barrier below the loop), so
  //   the whole tile is in; rewritten by the products of pair k + 2 after
  //   barrier k + 2, which every warp reaches after pair k's dQ step.
  // - dS [b'] is read in pass k while dS [b] is written: different tiles, so
  //   within a pass a warp may take the dQ step and the products in either
  //   order, and warps need not agree.
  // - Kj, Vj: copied before the loop (committed with pair 0's copies, waited
  //   for before barrier 0) and only read in it.
  // The pass of pair k with the 2-D warp tiles (one dS tile, one P^T tile,
  // the second barrier k'):
  //   after barrier k:  copies into Qi, dOi, L, D [b'] start (pair k + 1);
  //                     each warp's S^T, dP^T tile reads Qi, dOi, L, D [b],
  //                     Kj, Vj and writes its 32 keys x Br / 2 queries of P^T
  //                     and dS^T;
  //   after barrier k': dV += P^T dOi and dK += dS^T Qi read P^T, dS^T
  //                     and Qi, dOi [b], each warp 32 keys x all Br queries
  //                     of P^T, dS^T (other warps' tiles too); the atomic
  //                     variant's dQ step reads dS^T and Kj, before the
  //                     products at d = 128 (its reductions interleaved with
  //                     dV's k16 steps, kDQOnDV), after them at d = 64. All
  //                     of them only read shared memory, so either order is
  //                     race-free.
  // - P^T, dS^T: written before barrier k', so whole when read after it;
  //   rewritten by pair k + 1 after barrier k + 1 (after the last pair, by
  //   the next K/V head's after the barrier below the loop), which every
  //   warp reaches after its reads of pair k.
  // - Qi, dOi, L, D [b], [b'], Kj, Vj: as with two dS tiles (their readers
  //   in pass k, before and after barrier k', all precede barrier k + 1).
  for (; left > 0; --left) {
    const int buf = left % 2;
    const Elem* Qi = Qbuf + buf * C::kQElems;
    const Elem* dOi = dObuf + buf * C::kQElems;
    const float* Ls = Lbuf + buf * kBrPass;
    const float* Ds = Dbuf + buf * kBrPass;
    Elem* dS = dSbuf + (kDeferDQ ? buf : 0) * C::kDSElems;  // [Bc][Br]: this pair's dS_ij^T
    sm80::cp_async_wait<0>();
    __syncthreads();  // barrier k (above)
    if (left > 1) {  // line 9 for the next pair, under this one's products
      const int next = 1 - buf;
      // The next pair: the next pass, or after the head's last the next head's first.
      const bool wrap = q0 >= p.Nq - kBrPass;
      load_q_block<Elem, C>(p, (wrap ? bh + 1 : bh) * p.Nq, wrap ? q_first : q0 + kBrPass,
                            Qbuf + next * C::kQElems, dObuf + next * C::kQElems,
                            Lbuf + next * kBrPass, Dbuf + next * kBrPass);
    }
    sm80::cp_async_commit();
    // The previous pair's dQ step first: its reductions, fire-and-forget,
    // then drain while this pair's products run. (Either order is race-free,
    // above; with the dQ step after the products ptxas spilled at d = 64 and
    // 256.)
    if constexpr (kDeferDQ) {
      if (after_first) {
        dq_step<Elem, C>(p, dSbuf + (1 - buf) * C::kDSElems, Kj,
                         previous_dq_row(bh, q0, q_first, p.Nq), kBr);
      }
      after_first = true;
    }

    const int diag = tile_diag(q0, key0, p.Nq, p.Nk);
    const bool whole = whole_tile(keys_valid, kBc, p.causal, diag);

    if constexpr (k2D) {
      // The warp's 32 keys x Br / 2 queries of S^T and dP^T (kTileSideWarps
      // warps share a key range, each its half of the queries).
      const int q_col0 = warp / kTileKeyWarps * kTileQTiles * kMmaN;
      float S[kKeyTiles][kTileQTiles][4];  // S^T, then P^T
      product_abt_2d<Elem, C::kHeadDim, kKeyTiles, kTileQTiles>(
          S, Kj, Qi + q_col0 * C::kHeadDim, key_row0, at_a, at_bk);              // line 10
      float dP[kKeyTiles][kTileQTiles][4];  // dP^T, then dS^T
      product_abt_2d<Elem, C::kHeadDim, kKeyTiles, kTileQTiles>(
          dP, Vj, dOi + q_col0 * C::kHeadDim, key_row0, at_a, at_bk);            // line 13
#pragma unroll
      for (int mt = 0; mt < kKeyTiles; ++mt) {                                    // line 11
#pragma unroll
        for (int nt = 0; nt < kTileQTiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int q = q_col0 + nt * kMmaN + 2 * t + e % 2;
            S[mt][nt][e] = sm80::fast_exp2(fmaf(S[mt][nt][e], p.scale_log2, -Ls[q]));
          }
        }
      }
      if (!whole) {  // a tile on the diagonal or past Nk: its hidden pairs' P is 0
#pragma unroll
        for (int mt = 0; mt < kKeyTiles; ++mt) {
#pragma unroll
          for (int nt = 0; nt < kTileQTiles; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int key = key_row0 + mt * kMmaM + g + 8 * (e / 2);
              const int q = q_col0 + nt * kMmaN + 2 * t + e % 2;
              if (!visible(key, q, keys_valid, p.causal, diag)) S[mt][nt][e] = 0.0f;
            }
          }
        }
      }
#pragma unroll
      for (int mt = 0; mt < kKeyTiles; ++mt) {                                    // line 14
#pragma unroll
        for (int nt = 0; nt < kTileQTiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int q = q_col0 + nt * kMmaN + 2 * t + e % 2;
            dP[mt][nt][e] = S[mt][nt][e] * (dP[mt][nt][e] - Ds[q]);
          }
        }
      }
      store_scores_transposed<Elem, kBrPass>(PT, S, key_row0, q_col0);
      store_scores_transposed<Elem, kBrPass>(dS, dP, key_row0, q_col0);          // line 15
      __syncthreads();  // barrier k': the whole P^T and dS^T tiles are in
      // The atomic variant's dQ step: where it rides on the dV product
      // (kDQOnDV, d = 128: dq_on_dv says why) it runs right after barrier
      // k', its one chunk kept in registers and its tiles added over the
      // k16 steps of the dV product, four reductions a tile (add_dq_tile), so
      // that they drain under the dV and dK products instead of leaving as
      // one burst of 32 right before barrier k + 1. Elsewhere (d = 64) it
      // follows both products, its reductions added at once.
      if constexpr (C::kDQOnDV) {
        static_assert(C::kDQCols == C::kDQChunkCols, "one dQ chunk a warp");
        constexpr int kAdds = C::kDQRowTiles * C::kChunkTiles;  // the chunk's tiles
        constexpr int kSteps = kBrPass / kMmaK;                 // of dV
        float dQc[C::kDQRowTiles][C::kChunkTiles][4];
        float* dQat = nullptr;  // stays null where the warp adds nothing (dq_step)
        dq_step<Elem, C>(p, dS, Kj, dq_pass, p.Nq - q0,
                         [&](float* at, const float (&acc)[C::kDQRowTiles][C::kChunkTiles][4]) {
                           dQat = at;
#pragma unroll
                           for (int mt = 0; mt < C::kDQRowTiles; ++mt) {
#pragma unroll
                             for (int nt = 0; nt < C::kChunkTiles; ++nt) {
#pragma unroll
                               for (int e = 0; e < 4; ++e) dQc[mt][nt][e] = acc[mt][nt][e];
                             }
                           }
                         });
        auto add_at = [&](int step) {
#pragma unroll
          for (int tile = 0; tile < kAdds; ++tile) {
            if (tile * kSteps / kAdds == step && dQat != nullptr) add_dq_tile<C>(dQat, dQc, tile);
          }
        };
        product_ab_2d<Elem, C::kHeadDim, kBrPass, kKeyTiles, kGradTiles>(
            dV, PT, key_row0, at_ps, dOi + grad_col0, at_grad, add_at);            // line 12
      } else {
        product_ab_2d<Elem, C::kHeadDim, kBrPass, kKeyTiles, kGradTiles>(
            dV, PT, key_row0, at_ps, dOi + grad_col0, at_grad);                    // line 12
      }
      product_ab_2d<Elem, C::kHeadDim, kBrPass, kKeyTiles, kGradTiles>(
          dK, dS, key_row0, at_ps, Qi + grad_col0, at_grad);                       // line 16
      if constexpr (kAtomicDQ && !C::kDQOnDV) {
        dq_step<Elem, C>(p, dS, Kj, dq_pass, p.Nq - q0);
      }
    } else {
      // The Q block's queries in slices of kQSlice (q_slice: all 64 in the
      // atomic kernel at d = 256, else 32): S^T and dP^T of one slice at a
      // time, so that with two slices their accumulators take half the
      // registers.
#pragma unroll 1
      for (int qs = 0; qs < kBrPass; qs += kQSlice) {
        float S[kQTiles][4];  // S^T, then P^T: rows keys, columns queries qs ..
        product_abt<Elem, C::kHeadDim, kQTiles>(S, Kj, Qi + qs * C::kHeadDim, key_row0, at_a,
                                                at_bk);                        // line 10
#pragma unroll
        for (int nt = 0; nt < kQTiles; ++nt) {                                 // line 11
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int q = qs + nt * kMmaN + 2 * t + e % 2;
            S[nt][e] = sm80::fast_exp2(fmaf(S[nt][e], p.scale_log2, -Ls[q]));
          }
        }
        if (!whole) {  // a tile on the diagonal or past Nk: its hidden pairs' P is 0
#pragma unroll
          for (int nt = 0; nt < kQTiles; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int key = key_row0 + g + 8 * (e / 2);
              const int q = qs + nt * kMmaN + 2 * t + e % 2;
              if (!visible(key, q, keys_valid, p.causal, diag)) S[nt][e] = 0.0f;
            }
          }
        }
        product_ab<Elem, C::kHeadDim, kQTiles, C::kColTiles>(
            dV[0], S, dOi + qs * C::kHeadDim + col0, 0, at_bv);  // line 12
        float dP[1][kQTiles][4];  // dP^T, then dS^T: one m16 tile of keys
        product_abt<Elem, C::kHeadDim, kQTiles>(dP[0], Vj, dOi + qs * C::kHeadDim, key_row0, at_a,
                                                at_bk);                        // line 13
#pragma unroll
        for (int nt = 0; nt < kQTiles; ++nt) {                                 // line 14
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            dP[0][nt][e] = S[nt][e] * (dP[0][nt][e] - Ds[qs + nt * kMmaN + 2 * t + e % 2]);
          }
        }
        product_ab<Elem, C::kHeadDim, kQTiles, C::kColTiles>(
            dK[0], dP[0], Qi + qs * C::kHeadDim + col0, 0, at_bv);  // line 16
        if (kAtomicDQ && col0 == 0) {  // line 15: one warp of each key group writes its dS^T
          store_scores_transposed<Elem, kBrPass>(dS, dP, key_row0, qs);
        }
      }

      if constexpr (kAtomicDQ && !kDeferDQ) {
        __syncthreads();  // the whole dS tile is in
        dq_step<Elem, C>(p, dS, Kj, bh * dq_accum_rows(p.Nq) + q0, p.Nq - q0);
      }
    }

    if (q0 >= p.Nq - kBrPass) {  // the next pair, as prefetched above
      q0 = q_first;
      ++bh;
      if constexpr (kAtomicDQ && k2D) dq_pass = bh * dq_accum_rows(p.Nq) + q0;
    } else {
      q0 += kBrPass;
      if constexpr (kAtomicDQ && k2D) dq_pass += kBrPass;
    }
  }
  // Before the last pair's dQ step (two dS tiles): a warp done with its
  // products stores dK_j and dV_j while the others finish theirs.
  store_dk_dv(p.scale);
  if constexpr (kDeferDQ) {
    __syncthreads();  // the last pair's dS tile is in: dS [1], as it had left = 1
    dq_step<Elem, C>(p, dSbuf + C::kDSElems, Kj, previous_dq_row(bh, q0, q_first, p.Nq), kBr);
  }
  sm80::cp_async_wait<0>();
  __syncthreads();  // the next head's copies may overwrite the tiles
}

/// One thread block per (K/V block, K/V head); K/V heads past grid y's limit
/// by a grid-stride loop. K/V block 0 first: under a causal mask it sees the
/// most Q blocks.
template <typename Elem, typename C>
__global__ void __launch_bounds__(C::kThreads) dkdv_kernel(const BackwardParams<Elem> p) {
  extern __shared__ uint4 smem_chunks[];  // uint4: 16-byte alignment for cp.async
  auto* smem = reinterpret_cast<unsigned char*>(smem_chunks);
  for (std::int64_t kv = blockIdx.y; kv < p.kv_heads; kv += gridDim.y) {
    dkdv_block<Elem, C>(p, kv, static_cast<int>(blockIdx.x), smem);
  }
}

/// dQ = scale * dQ_accum, rounded to Elem: the atomic variant's last pass,
/// over the real rows and columns of the padded accumulator (rows
/// kHeadDim long, in its layout: dq_accum_index).
template <typename Elem, int kHeadDim>
__global__ void convert_dq_kernel(const BackwardParams<Elem> p) {
  const std::int64_t n = p.heads * p.Nq * p.d;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t pad_rows = dq_accum_rows(p.Nq) - p.Nq;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += stride) {
    const std::int64_t row = e / p.d;  // of heads * Nq
    const std::int64_t padded_row = row + row / p.Nq * pad_rows;
    p.dQ[e] = from_float<Elem>(p.scale * p.dQ_accum[dq_accum_index(kHeadDim, padded_row, e % p.d)]);
  }
}

// ---------------------------------------------------------------------------
// The deterministic variant's dQ: one block per (Q block i, query head), warps
// split Q as in the forward; every dQ element summed in one order, no atomics.

template <int kHeadDim_>
struct DQConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kThreads = kDQWarps * kWarpSize;
  static constexpr int kBc = kDQBc;
  static constexpr int kKTiles = kBc / kMmaN;        // n8 tiles of S over the keys
  static constexpr int kDTiles = kHeadDim / kMmaN;   // n8 tiles of dQ
  static constexpr int kDSteps = kHeadDim / kMmaK;   // k16 steps over d (S, dP)
  static constexpr bool kHoldRows = dq_holds_rows(kHeadDim);  // Qi, dOi fragments in registers
  static constexpr int kQElems = kBr * kHeadDim;
  static constexpr int kKVElems = kBc * kHeadDim;
  // Qi, dOi once; Kj and Vj double-buffered.
  static constexpr int kSmemBytes = (2 * kQElems + 4 * kKVElems) * 2;
  static_assert(kBr == kDQWarps * kMmaM, "one m16 tile of query rows per warp");
};

template <typename Elem, typename C>
__device__ inline void dq_block(const BackwardParams<Elem>& p, std::int64_t bh, int i,
                                unsigned char* smem) {
  constexpr int kBc = C::kBc;
  Elem* Qi = reinterpret_cast<Elem*>(smem);  // [Br][kHeadDim]
  Elem* dOi = Qi + C::kQElems;               // [Br][kHeadDim]
  Elem* Kbuf = dOi + C::kQElems;             // 2 x [Bc][kHeadDim]
  Elem* Vbuf = Kbuf + 2 * C::kKVElems;       // 2 x [Bc][kHeadDim]
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const int q_row0 = warp * kMmaM;  // this warp's 16 rows of Qi
  const int q0 = i * kBr;
  const int rows_valid = min(kBr, p.Nq - q0);
  const std::int64_t row0 = bh * p.Nq + q0;
  const std::int64_t kv = bh / p.G;  // the K/V head of bh's group

  // This lane's rows g and g + 8: their L and D, in registers for the loop.
  float Lr[2], Dr[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = q_row0 + g + 8 * h;
    Lr[h] = row < rows_valid ? p.L_log2[row0 + row] : INFINITY;
    Dr[h] = row < rows_valid ? p.D[row0 + row] : 0.0f;
  }
  // The keys the block's last row sees: the K/V blocks past them are skipped.
  const std::int64_t last = static_cast<std::int64_t>(q0) + rows_valid - 1;
  const std::int64_t seen = p.causal ? last + 1 + p.Nk - p.Nq : p.Nk;
  const int seen_keys = static_cast<int>(seen < 0 ? 0 : seen > p.Nk ? p.Nk : seen);
  const int n_blocks = seen_keys == 0 ? 0 : (seen_keys - 1) / kBc + 1;

  const LaneOffsets<C::kHeadDim> at_a(a_point(lane)), at_bk(k_point(lane)), at_bv(v_point(lane));
  // Every K/V block but a ragged last one by load_full_tile_async, as the
  // (dK, dV) kernel's Q blocks (load_q_block). Not at d = 256: there the
  // kernel sits at 252 registers, and with both paths ptxas -v showed it
  // spill 12 to 24 bytes (outside the loop).
  auto load_kv = [&](int j, int buf) {
    const int key0 = j * kBc;
    if (C::kHeadDim <= 128 && p.vec && p.d == C::kHeadDim && key0 <= p.Nk - kBc) {
      sm80::load_full_tile_async<Elem, kBc, C::kHeadDim, C::kThreads>(
          Kbuf + buf * C::kKVElems, p.K + (kv * p.Nk + key0) * C::kHeadDim);
      sm80::load_full_tile_async<Elem, kBc, C::kHeadDim, C::kThreads>(
          Vbuf + buf * C::kKVElems, p.V + (kv * p.Nk + key0) * C::kHeadDim);
    } else {
      load_tile<Elem, kBc, C::kHeadDim, true, true, C::kThreads>(
          Kbuf + buf * C::kKVElems, p.K + (kv * p.Nk + key0) * p.d, p.Nk - key0, p.d, p.vec);
      load_tile<Elem, kBc, C::kHeadDim, true, true, C::kThreads>(
          Vbuf + buf * C::kKVElems, p.V + (kv * p.Nk + key0) * p.d, p.Nk - key0, p.d, p.vec);
    }
  };
  load_tile<Elem, kBr, C::kHeadDim, true, true, C::kThreads>(Qi, p.Q + row0 * p.d, rows_valid,
                                                              p.d, p.vec);
  load_tile<Elem, kBr, C::kHeadDim, true, true, C::kThreads>(dOi, p.dO + row0 * p.d, rows_valid,
                                                              p.d, p.vec);
  if (n_blocks > 0) load_kv(0, 0);
  sm80::cp_async_commit();

  float dQ[C::kDTiles][4];
#pragma unroll
  for (int nt = 0; nt < C::kDTiles; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dQ[nt][e] = 0.0f;
  }
  const Elem* Qw = Qi + q_row0 * C::kHeadDim;    // this warp's rows
  const Elem* dOw = dOi + q_row0 * C::kHeadDim;
  // The warp's A fragments of Qw and dOw, k16 step by step, where it holds
  // them (C::kHoldRows, d <= 128): [kDSteps][4] registers each.
  std::uint32_t Qa[C::kHoldRows ? C::kDSteps : 1][4], dOa[C::kHoldRows ? C::kDSteps : 1][4];
  for (int j = 0; j < n_blocks; ++j) {
    const int buf = j % 2;
    const Elem* Kj = Kbuf + buf * C::kKVElems;
    const Elem* Vj = Vbuf + buf * C::kKVElems;
    sm80::cp_async_wait<0>();
    __syncthreads();  // Kj, Vj (and Qi, dOi) arrived; every warp is done with block j - 1
    if (j + 1 < n_blocks) load_kv(j + 1, 1 - buf);
    sm80::cp_async_commit();

    const int key0 = j * kBc;
    const int keys_valid = min(kBc, p.Nk - key0);
    const int diag = tile_diag(q0, key0, p.Nq, p.Nk);
    const bool whole = whole_tile(keys_valid, kBc, p.causal, diag);

    float S[C::kKTiles][4];  // S, then P: rows queries, columns keys
    if constexpr (C::kHoldRows) {
      if (j == 0) {  // Qi and dOi arrived with the first K/V block
#pragma unroll
        for (int ks = 0; ks < C::kDSteps; ++ks) {
          load_a<Elem, C::kHeadDim, true>(Qa[ks], Qw, at_a, 0, ks * kMmaK);
          load_a<Elem, C::kHeadDim, true>(dOa[ks], dOw, at_a, 0, ks * kMmaK);
        }
      }
      product_abt_held<Elem, C::kHeadDim, C::kKTiles>(S, Qa, Kj, at_bk);
    } else {
      product_abt<Elem, C::kHeadDim, C::kKTiles>(S, Qw, Kj, 0, at_a, at_bk);
    }
#pragma unroll
    for (int nt = 0; nt < C::kKTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        S[nt][e] = sm80::fast_exp2(fmaf(S[nt][e], p.scale_log2, -Lr[e / 2]));
      }
    }
    if (!whole) {  // a tile on the diagonal or past Nk: its hidden pairs' P is 0
#pragma unroll
      for (int nt = 0; nt < C::kKTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int q = q_row0 + g + 8 * (e / 2);
          const int key = nt * kMmaN + 2 * t + e % 2;
          if (!visible(key, q, keys_valid, p.causal, diag)) S[nt][e] = 0.0f;
        }
      }
    }
    float dP[C::kKTiles][4];  // dP, then dS
    if constexpr (C::kHoldRows) {
      product_abt_held<Elem, C::kHeadDim, C::kKTiles>(dP, dOa, Vj, at_bk);
    } else {
      product_abt<Elem, C::kHeadDim, C::kKTiles>(dP, dOw, Vj, 0, at_a, at_bk);
    }
#pragma unroll
    for (int nt = 0; nt < C::kKTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dP[nt][e] = S[nt][e] * (dP[nt][e] - Dr[e / 2]);
    }
    product_ab<Elem, C::kHeadDim, C::kKTiles, C::kDTiles>(dQ, dP, Kj, 0, at_bv);
  }
  sm80::cp_async_wait<0>();  // a block that visits no K/V block still copied Qi, dOi
  store_rows<Elem, C::kDTiles>(p.dQ + row0 * p.d, dQ, q_row0, 0, rows_valid, p.d, p.scale);
  __syncthreads();  // the next head's copies may overwrite the tiles
}

template <typename Elem, typename C>
__global__ void __launch_bounds__(C::kThreads) dq_kernel(const BackwardParams<Elem> p) {
  extern __shared__ uint4 smem_chunks[];
  auto* smem = reinterpret_cast<unsigned char*>(smem_chunks);
  const int Tr = (p.Nq - 1) / kBr + 1;
  const int i = Tr - 1 - static_cast<int>(blockIdx.x);  // the heaviest Q blocks first
  for (std::int64_t bh = blockIdx.y; bh < p.heads; bh += gridDim.y) {
    dq_block<Elem, C>(p, bh, i, smem);
  }
}

}  // namespace flashstep::tensor_core::bwd
