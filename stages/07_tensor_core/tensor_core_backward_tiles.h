/// \file tensor_core_backward_tiles.h
/// \brief Tile shapes of stage 07's backward (FlashAttention-2, Algorithm 2,
/// on tensor cores), shared by the kernels (tensor_core_backward.cuh), the
/// closed-form model and the CPU mirror. CUDA-free.
#pragma once

#include <cstdint>

#include "common/host_device.h"
#include "common/sm90_layout.h"

namespace flashstep::tensor_core::bwd {

/// Key groups of 16 keys per K/V block, one m16 tile of rows each: 8 at
/// d = 128 and, in the atomic kernel, at d = 64; 4 at d = 256 and in the
/// deterministic kernel at d = 64. A warp owns one key group for the whole
/// life of the block (Kj, Vj, and the rows of dK_j and dV_j it accumulates),
/// so the block's Bc is 16 times the key groups and a warp's accumulators do
/// not grow with Bc. (With 8 key groups the kernels tile the same 8 warps
/// in two dimensions instead, 32 keys a warp: warp_tile_2d.)
/// - d = 128: Bc = 128 with 8 warps, FlashAttention-2's choice
///   (Flash_bwd_kernel_traits<128, 64, 128, 8, ...>). Each Q block that
///   streams past is loaded, and its dQ added by atomics, once per 128 keys
///   instead of per 64: half the L2 reductions (ncu, N = 4096: 403 M sectors
///   to 201 M) and the atomic backward 10 % faster.
/// - d = 64, atomic: Bc = 128 with 8 warps in 2-D tiles (round 10b of
///   docs/results/tuning_07/README.md), for half the reductions again, as
///   FlashAttention-2 (<64, 128, 128, 8, ...>). With 1-D tiles Bc = 128 had
///   halved them too but took the SM from three blocks of 4 warps to one
///   of 8 (218 registers a thread), and was no faster (6.57 ms to 6.64);
///   the 2-D tiles read 352 KiB of ldmatrix a 64 x 128 area where those
///   read 416 and Bc = 64 reads 400 (two passes), and 288 in passes of 128
///   queries (q_block, round 11).
/// - d = 64, deterministic: Bc = 64 with 4 warps; Bc = 128 with 1-D tiles
///   was 15 % slower (3.85 to 4.43 ms), and the kernel has no reductions to
///   halve.
/// - d = 256: Bc = 64; Bc = 128 would take 256 KiB of shared memory for Kj
///   and Vj alone.
constexpr int key_groups(int head_dim_bucket, bool atomic_dq) {
  return head_dim_bucket == 128 || (head_dim_bucket == 64 && atomic_dq) ? 8 : 4;
}
/// Keys per K/V block of the (dK, dV) kernel: the paper's Bc.
constexpr int block_keys(int head_dim_bucket, bool atomic_dq) {
  return 16 * key_groups(head_dim_bucket, atomic_dq);
}
/// The largest Bc of any bucket.
inline constexpr int kMaxBc = 128;

/// Query rows per Q block (the paper's Br): 64, four m16 tiles of rows. The
/// grain of the atomic variant's dQ accumulator (dq_accum_rows), of the
/// causal skip (the (dK, dV) kernel's first Q block starts at a multiple of
/// kBr) and of the dQ kernel's blocks; the (dK, dV) kernel's passes take
/// q_block rows at a time from there.
inline constexpr int kBr = 64;

/// Query rows per pass of the (dK, dV) kernel: 128 in the atomic kernel at
/// d = 64, two consecutive Q blocks of kBr taken as one pass, as
/// FlashAttention-2's Br = 128 (Flash_bwd_kernel_traits<64, 128, 128, 8, 2,
/// 4, 4, ...>); kBr elsewhere. With the 2-D warp tiles (warp_tile_2d) a
/// warp's S^T and dP^T tile is then 32 keys x 64 queries, which reads its
/// 32 rows of Kj (Vj) once for 64 queries where it read them once for 32,
/// and its dQ step 32 rows x 32 columns of dQ_i, which reads Kj's columns
/// once for 32 rows where it read them once for 16: 288 KiB of ldmatrix a
/// 64 x 128 area instead of 352, FlashAttention-2's count, and two barriers
/// a 128 x 128 pass instead of four (docs/results/tuning_07/README.md,
/// round 11). Two Q blocks of kBr rather than blocks of 128 rows: the
/// pass starts at any multiple of kBr, so the causal skip keeps its grain,
/// and dQ's accumulator keeps its padding to whole Q blocks of kBr (the
/// conversion pass and the workspace unchanged); a pass whose second Q
/// block lies wholly past Nq is zero-filled (P = dS = 0), and its warps
/// of those rows add nothing to the accumulator (dq_step), which has no
/// rows there. Not at d = 128 and 256, where the accumulators of 128
/// queries would not fit beside dK_j's and dV_j's, nor in the deterministic
/// kernel at d = 64 (1-D tiles, Bc = 64: key_groups).
FLASHSTEP_HOST_DEVICE constexpr int q_block(int head_dim_bucket, bool atomic_dq) {
  return head_dim_bucket == 64 && atomic_dq ? 2 * kBr : kBr;
}

/// Queries per slice of the S_ij^T and dP_ij^T accumulators: a warp computes
/// them for q_slice queries of the Q block at a time, q_slice / 2 fp32
/// registers each, beside dK_j's and dV_j's 2 d / kDSplit. Each slice
/// reloads the warp's Kw and Vw A fragments (16 keys x d each), so one slice
/// of all kBr = 64 queries reads them once a Q block where two of 32 read
/// them twice: at d = 128, 64 KiB of ldmatrix reads a (Q block, K/V block)
/// pass less, of 800 (docs/results/tuning_07/README.md, round 8). Only the
/// 1-D warp tiles take slices (d = 256, and the deterministic kernel at
/// d = 64; the 2-D tiles, warp_tile_2d, have none). ptxas -v on sm_90
/// (CUDA 13), bf16 and fp16:
/// - atomic kernel, d = 256: one slice of 64, 255 registers, no spill.
/// - d = 64: slices of 32. With 64, 215 registers (atomic, then 1-D) and
///   181 (deterministic) would leave two blocks of 4 warps an SM instead of
///   three (168 is three's limit).
/// - deterministic kernel, d = 256: slices of 32, as before round 8.
FLASHSTEP_HOST_DEVICE constexpr int q_slice(int head_dim_bucket, bool atomic_dq) {
  return atomic_dq && head_dim_bucket >= 128 ? kBr : kBr / 2;  // one slice, or two
}

/// Warps splitting the head dimension of dK_j and dV_j: 1 up to d = 128, 2 at
/// d = 256, where one warp's 16 x 256 rows of both would take 256 registers
/// per thread. The two warps of a key group then each recompute the group's
/// S^T and dP^T (the full d-long products) and keep half of dK_j's and dV_j's
/// columns: 7/5 of the matmul work at d = 256, for no spilling.
constexpr int d_split(int head_dim_bucket) { return head_dim_bucket > 128 ? 2 : 1; }

/// Warps per block of the main (dK, dV) kernel.
constexpr int warps(int head_dim_bucket, bool atomic_dq) {
  return key_groups(head_dim_bucket, atomic_dq) * d_split(head_dim_bucket);
}

/// Columns of dQ one warp computes at a time from dS_ij K_j (fp32
/// accumulators, 32 registers), before its atomic adds: all of a warp's
/// columns at d = 64 and d = 128 (32 each, dq_row_groups), half of them at
/// d = 256 (dq_chunk). Each chunk reloads the warp's dS A fragments (its
/// query rows x Bc keys), so one chunk of 64 reads them once where two of 32
/// read them twice: at d = 128 with 1-D warp tiles, 32 KiB of ldmatrix reads
/// a (Q block, K/V block) pass instead of 64, of 832 KiB in all
/// (docs/results/tuning_07/README.md, round 8), for no spill (ptxas -v on
/// sm_90; the registers are in the stage README): the dQ step runs where
/// the S^T and dP^T accumulators are dead, before a pass's products at
/// d = 256 and after them at d = 64 and 128. (An earlier kernel, whose dQ
/// step ran beside them, spilled 44 bytes a thread at d = 128 with 64.)
/// The price, at d = 256 only (the other buckets' chunks are 32): where d
/// is not a multiple of 64 a warp adds up to 32 columns of zeros into the
/// accumulator's padding that chunks of 32 skipped, as the model counts
/// (dq_cols).
inline constexpr int kDQChunk = 64;

/// Rows per head of the atomic variant's fp32 dQ accumulator: Nq rounded up
/// to whole Q blocks. The accumulator is [heads, dq_accum_rows(Nq), bucket],
/// padded as FlashAttention-2 pads its dq_accum, so that a lane's atomic adds
/// all land at compile-time offsets from one pointer and need no row or
/// column check: a padding row's or column's dS K is 0 (its Q and dO rows
/// are zero-filled, so P = dS = 0; Kj's columns past d are zero-filled), and
/// the conversion pass never reads it.
FLASHSTEP_HOST_DEVICE constexpr std::int64_t dq_accum_rows(std::int64_t Nq) {
  return (Nq + kBr - 1) / kBr * kBr;
}

/// The accumulator's layout (dq_accum_index): FlashAttention-2's dq_accum
/// order. Its [rows, bucket] split into 8 x 8 blocks (rows and columns from
/// multiples of 8; a row of blocks is 8 whole rows, bucket x 8 floats), each
/// block of kDQBlockElems floats in the order of the mma accumulator
/// registers: lane (g, t) of an n8 tile holds rows g, g + 8 x columns 2t,
/// 2t + 1, so element (r, c) of a block sits at (c % 2) kDQRegisterElems +
/// (r % 8) 4 + (c % 8) / 2, and one register of a warp's n8 tile is 32
/// consecutive floats from a multiple of 32: one 4-byte reduction a lane,
/// four whole 32-byte sectors, each once. Row by row (rounds 4 to 12), lane
/// (g, t)'s two columns were neighbours and went as one 8-byte reduction
/// (red.global.add.v2.f32), the same sectors in half the instructions but
/// 256 bytes each: among the dV product's ldmatrix reads they cost many
/// times the shared-load wavefronts FlashAttention-2's 4-byte ones cost
/// among its dK product's (ablation16.csv; bank_model.py in
/// docs/results/tuning_07 finds no address conflict), and the 4-byte
/// reductions made the d = 128 atomic backward faster
/// (tuning_07/bwd_run13_frag_ab.txt, round 13). Every bucket takes the
/// layout: at d = 64 and 256 too, the same registers and no spill (ptxas,
/// sm_90); 32 reductions a warp a pass at d = 64 and 128 (FlashAttention-2's
/// count), 64 at d = 256.
inline constexpr int kDQBlock = 8;                               // rows and columns of a block
inline constexpr int kDQBlockElems = kDQBlock * kDQBlock;        // 64 floats
inline constexpr int kDQRegisterElems = kDQBlockElems / 2;       // a register of a warp's n8 tile
inline constexpr int kDQLanesPerRow = kDQBlock / 2;              // lanes t of a row g (2 columns each)

/// Element (row, col) of the accumulator, rows of [heads * dq_accum_rows]
/// and columns of the bucket, in its layout (above).
FLASHSTEP_HOST_DEVICE constexpr std::int64_t dq_accum_index(int head_dim_bucket, std::int64_t row,
                                                            std::int64_t col) {
  return row / kDQBlock * kDQBlock * head_dim_bucket + col / kDQBlock * kDQBlockElems +
         col % 2 * kDQRegisterElems + row % kDQBlock * kDQLanesPerRow + col % kDQBlock / 2;
}

/// The accumulator's first row (of [heads * dq_accum_rows(Nq)]) of the
/// (query head, Q block) pair before (bh, q0) in the (dK, dV) kernel's
/// order, whose Q blocks run from q_first (a multiple of kBr) to a head's
/// last, then on to the next head's q_first: the same head's previous Q
/// block, or, at a head's first, the previous head's last, whose first row
/// is bh R - kBr (R = dq_accum_rows(Nq), a head's rows). The atomic
/// variant adds a pair's dQ one pass later (tensor_core_backward.cuh) and
/// finds its rows by this, rather than keep a 64-bit row live across the
/// products (two registers). After the last pair (bh one past the group's
/// last head, q0 = q_first) it gives the last pair's.
FLASHSTEP_HOST_DEVICE constexpr std::int64_t previous_dq_row(std::int64_t bh, int q0, int q_first,
                                                             int Nq) {
  return bh * dq_accum_rows(Nq) + (q0 == q_first ? 0 : q0) - kBr;
}

/// The deterministic variant's dQ kernel: one block per (Q block, head), 4
/// warps of 16 query rows (kBr = 64), streaming K/V blocks of kDQBc keys; its
/// dQ accumulators take d / 2 registers per thread.
inline constexpr int kDQWarps = 4;
/// Keys per K/V block of the dQ kernel: 64, so that a warp's S and dP
/// accumulators (16 x 64 each, 32 registers) fit beside dQ's at d = 256.
inline constexpr int kDQBc = 64;

/// Whether the dQ kernel's warps hold the A fragments of their 16 rows of Qi
/// and dOi in registers for the whole loop over K/V blocks (2 d / 4 registers
/// a thread), loading them once instead of for S and dP at every K/V block,
/// where they were a fifth of the loop's ldmatrix. ptxas -v on sm_90: 156 ->
/// 165 registers at d = 64 (three 4-warp blocks an SM still: the limit is
/// 168), 173 -> 241 at d = 128 (two blocks, as the kernel's 96 KiB of shared
/// memory already allowed); at d = 256, 128 more registers, ptxas spilled
/// about a kilobyte, so there they are read from shared memory as before.
constexpr bool dq_holds_rows(int head_dim_bucket) { return head_dim_bucket <= 128; }

/// Whether the (dK, dV) kernels tile their products by 2-D warp tiles, as
/// FlashAttention-2 does (Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2,
/// ...> at d = 128, <64, 128, 128, 8, 2, 4, 4, ...> at d = 64): at d = 128,
/// atomic and deterministic alike, and at d = 64 in the atomic kernel. The
/// 8 warps then split S^T and dP^T as kTileKeyWarps x kTileSideWarps tiles
/// of 32 keys x Br / 2 queries (32; 64 in the atomic kernel at d = 64,
/// whose passes take 128 queries: q_block), and dV_j, dK_j as tiles of 32
/// keys x d / 2 columns. A warp's dV_j and dK_j rows then need all Br
/// queries of P^T and dS^T, where it computed half: both go through shared
/// memory, behind a second barrier a pass. ldmatrix a (Q block, K/V block) pass at d = 128:
/// 608 KiB instead of 736 in the atomic kernel (576 with its dQ step's 2-D
/// layout too, dq_row_groups), 448 instead of 640 in the deterministic one,
/// which pays 32 KiB more shared memory (129 -> 161 KiB, still the one
/// block an SM its registers allow; docs/results/tuning_07/README.md,
/// rounds 9 and 10). At d = 64 (atomic, Bc = 128: key_groups) 352 KiB a
/// 64 x 128 pass where two passes of the 1-D tiles at Bc = 64 read 400, and
/// half the dQ reductions (round 10b); in passes of 128 queries 288 KiB a
/// 64 x 128 area, FlashAttention-2's count (q_block, round 11). Not in the deterministic kernel at
/// d = 64, which keeps Bc = 64 (key_groups); not at d = 256, where each
/// warp already holds half of dK_j's and dV_j's columns (d_split).
FLASHSTEP_HOST_DEVICE constexpr bool warp_tile_2d(int head_dim_bucket, bool atomic_dq) {
  return head_dim_bucket == 128 || (head_dim_bucket == 64 && atomic_dq);
}
/// The 2-D tiles' warps along the Bc = 128 keys: 32 keys a warp, two m16
/// tiles, the rows of its S^T, dP^T and of its dK_j, dV_j alike.
inline constexpr int kTileKeyWarps = 4;
/// And along the other side: the pass's q_block queries of S^T and dP^T
/// (32 a warp, four n8 tiles, at d = 128: with the two m16 tiles, 32 fp32
/// registers each, the accumulators of one query slice of 64 before; 64 a
/// warp, eight n8 tiles, 64 registers each, at d = 64 in passes of 128),
/// and the d columns of dK_j and dV_j (64 a warp at d = 128, 64 registers
/// each, as before; 32 at d = 64, 32 registers each). At d = 64 that is
/// 192 accumulator registers a thread, as FlashAttention-2 holds them:
/// ptxas -v on sm_90 (CUDA 13) gives the atomic kernel 255 registers and
/// no spill.
inline constexpr int kTileSideWarps = 2;

/// Row groups of the atomic kernel's dQ step: warp w takes the Br /
/// dq_row_groups query rows (Br: the pass's, q_block) from (w %
/// dq_row_groups) Br / dq_row_groups on of dQ_i, and its columns by w /
/// dq_row_groups, summing over all Bc keys.
/// - d = 256 (1-D warp tiles, 8 warps): 4 groups of 16 rows (one m16 tile),
///   2 warps of 128 columns each (two chunks of 64, dq_chunk).
/// - d = 64 (2-D warp tiles, 8 warps, passes of Br = 128): 4 groups of 32
///   rows (two m16 tiles), 2 warps of 32 columns each: FlashAttention-2's
///   4 x 2 layout at d = 64 (AtomLayoutMdQ = 4 in
///   Flash_bwd_kernel_traits<64, 128, 128, 8, 2, 4, 4, ...>). A warp reads
///   its 32 rows of dS (x Bc keys) and Kj's Bc keys x its 32 columns: 32 +
///   32 KiB of ldmatrix a 64 x 128 area, where passes of 64 rows (16 rows a
///   warp, round 10b) read 32 + 64 for dS and Kj; its accumulators take 32
///   registers (16 with 16 rows).
/// - d = 128 (2-D warp tiles): FlashAttention-2's 2 x 4 layout of dQ
///   (AtomLayoutMdQ = 2 in Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4,
///   2, ...>): 2 groups of 32 rows (two m16 tiles), 4 warps of 32 columns
///   each. A warp reads its 32 rows of dS (x Bc keys) and Kj's Bc keys x its
///   32 columns: 128 KiB of ldmatrix a pass for the block, where 16 rows x
///   64 columns a warp read Kj's 128 keys x 64 columns per 16 rows: 160 KiB
///   (docs/results/tuning_07/README.md, round 10). A warp's accumulators
///   stay 32 registers (32 x 32 where 16 x 64 were).
constexpr int dq_row_groups(int head_dim_bucket) { return head_dim_bucket == 128 ? 2 : 4; }
/// A warp's columns of dQ_i in the dQ step: the bucket's d over the atomic
/// kernel's warps of a row group.
constexpr int dq_warp_cols(int head_dim_bucket) {
  return head_dim_bucket * dq_row_groups(head_dim_bucket) / warps(head_dim_bucket, true);
}
/// The dQ step's chunk of columns (kDQChunk): a warp's all where they are
/// fewer (32 at d = 64 and 128).
constexpr int dq_chunk(int head_dim_bucket) {
  return dq_warp_cols(head_dim_bucket) < kDQChunk ? dq_warp_cols(head_dim_bucket) : kDQChunk;
}
/// Whether the atomic kernel's dQ step, with the 2-D warp tiles, rides on
/// the dV product: it runs right after the second barrier, its one chunk
/// kept in registers, its reductions spread over dV's k16 steps (d = 128),
/// or it follows the dV and dK products, its reductions at once (d = 64).
/// On the H200 (bwd median): at d = 128 the spread reductions gain 1.2 to
/// 1.7 %; at d = 64 the step before the products costs 3 %, the burst's
/// write-after-read waits holding the warp before its dV HMMAs (spread,
/// ptxas spilled 32 bytes there; with the 4-byte reductions of fragment
/// order, 16 bytes, in the score step's masking branch: tuning_07, round
/// 13).
constexpr bool dq_on_dv(int head_dim_bucket) { return head_dim_bucket == 128; }

/// The atomic (dK, dV) kernel's dS tiles. Two (d = 256): a Q block's dQ step
/// runs in the next block's pass, behind its one barrier, reading one tile
/// while the products write the other. One (d = 64 and 128): the dQ step
/// follows the products behind a second barrier of its own, which the 2-D
/// warp tiles need anyway (warp_tile_2d: there the second tile holds P^T).
/// On the H200 two tiles were faster than one at d = 128 before the 2-D
/// tiles and slower at d = 64, before them too (docs/results/tuning_07/
/// README.md, round 6); d = 256 takes two, where the deferred dQ step also
/// left ptxas no spill (one tile: 12 bytes).
constexpr int ds_tiles(int head_dim_bucket) { return head_dim_bucket == 256 ? 2 : 1; }
/// The (dK, dV) kernels' P^T tiles: one with 2-D warp tiles, else none (P^T
/// stays in the registers of the warp that computed it). The deterministic
/// kernel, which has no dQ step, has a dS tile beside it then, for dK.
constexpr int pt_tiles(int head_dim_bucket, bool atomic_dq) {
  return warp_tile_2d(head_dim_bucket, atomic_dq) ? 1 : 0;
}


/// Grid y holds at most 65535 blocks; beyond that one block takes the same
/// block of several heads.
inline constexpr std::int64_t kMaxGridY = 65535;

/// Rows of the pre-pass (D and L in log2 units, dQ's accumulator zeroed) per
/// thread block: one warp per row.
inline constexpr int kPrepRowsPerBlock = 8;

/// The mask of one (Q block, K/V block) tile, as offsets into the tile: its
/// top-left pair is (q0, key0), so key offset `key` (of keys_valid real keys)
/// and query offset `q` form a visible pair when key < keys_valid and,
/// causal (bottom-right: query r sees keys <= r + Nk - Nq), key - q <= diag
/// with diag = q0 + Nk - Nq - key0. The kernels and the CPU mirror test
/// every pair with these two functions.
///
/// tile_diag clamps diag to +-2 (kBr + kMaxBc): beyond that every pair (or
/// no pair) of the tile is visible alike, in the (dK, dV) kernel's passes of
/// q_block rows too (up to 2 kBr: key - q lies within +-(2 kBr + kMaxBc)),
/// and the offsets stay small ints.
/// It takes a tile's corner, 0 <= q0 < Nq and 0 <= key0 < Nk, with Nq and Nk
/// ints (validate() bounds them by 2^31 - 1), and sums diag in 32 bits as
/// (q0 - Nq) + (Nk - key0): the first term lies in [-Nq, 0), the second in
/// (0, Nk], so neither they nor their sum overflow. The kernels compute it
/// once per tile in their loops, where the 64-bit sum and clamp took a dozen
/// instructions and the 32-bit ones take three.
FLASHSTEP_HOST_DEVICE constexpr int tile_diag(int q0, int key0, int Nq, int Nk) {
  constexpr int kClamp = 2 * (kBr + kMaxBc);
  const int diag = (q0 - Nq) + (Nk - key0);
  return diag < -kClamp ? -kClamp : diag > kClamp ? kClamp : diag;
}

FLASHSTEP_HOST_DEVICE constexpr bool visible(int key, int q, int keys_valid, bool causal,
                                             int diag) {
  return key < keys_valid && (!causal || key - q <= diag);
}

/// Whether every pair of a tile of Bc keys is visible (no mask to apply):
/// all keys real, and, causal, the last key against the first query visible.
FLASHSTEP_HOST_DEVICE constexpr bool whole_tile(int keys_valid, int Bc, bool causal, int diag) {
  return keys_valid == Bc && (!causal || Bc - 1 <= diag);
}

/// The first query row that sees key key0 (0 unless causal; Nq or more when
/// no row does): the Q blocks above it are skipped.
FLASHSTEP_HOST_DEVICE constexpr std::int64_t first_row(std::int64_t key0, std::int64_t Nq,
                                                       std::int64_t Nk, bool causal) {
  return causal && key0 + Nq - Nk > 0 ? key0 + Nq - Nk : 0;
}

}  // namespace flashstep::tensor_core::bwd
