// Stage 07's backward model (host only), in the conventions of the forward's
// (tensor_core_model.cpp) and stage 05's backward: valid elements only, Q, K,
// V, O, dO, dQ, dK, dV in p.dtype's bytes, L, D and the fp32 dQ accumulator
// four.
//
// Per head, K/V block j holds C_j keys and is visited by the Q blocks from
// i_first(j) on (0 unless causal): rows_j valid rows in n_j Q blocks of
// bwd::kBr, which the (dK, dV) kernel takes in passes of bwd::q_block rows
// (two Q blocks a pass in the atomic variant at d = 64, else one): m_j
// passes. What the kernel does once a pass (barriers, each warp's reads of
// its keys of Kj and Vj, the dQ step's of Kj) counts per pass, what it
// does per row per row, and the dQ adds per Q block of kBr (a warp of a
// pass's second Q block adds nothing where that block lies past Nq).
// Grouped heads (H_kv < H): what the (dK, dV) kernel does per K/V block
// itself (Kj, Vj read and written to shared memory, dK_j, dV_j written) is
// counted per K/V head, B H_kv times, since one thread block streams the Q
// blocks of its group's H / H_kv query heads past one Kj, Vj; what it does
// per visited Q block, and all the rest, per query head, B H times.
// - Pre-pass: O and dO read, L read, D and L log2 e written, per row; the
//   atomic variant zeroes dQ's accumulator first, padding included (4 bytes
//   per element of [dq_accum_rows(Nq), bucket]).
// - dK, dV kernel: Kj, Vj read once; per visited row Qi, dOi, L, D read;
//   dK_j, dV_j written once; the atomic variant's dQ adds read and write
//   4 bytes per element of the visited Q blocks' whole rows (padding rows
//   too) and of d's columns rounded up to whole chunks of bwd::dq_chunk
//   (64 columns at d = 256, 32 at d = 64 and 128: a warp skips the chunks
//   past d).
// - Shared memory writes: Kj, Vj once; Qi, dOi, L, D per visited row; the
//   atomic variant's dS tile (C_j per row); with 2-D warp tiles
//   (bwd::warp_tile_2d: d = 128, and the atomic variant at d = 64) a P^T
//   tile as much, and the deterministic variant's dS tile too.
// - Shared memory reads, as the warps load fragments: per visited row, the
//   products S^T = K Q^T and dP^T = V dO^T read Qi's and dOi's d columns once
//   per warp (W = key groups, 4 at d = 64 (deterministic) and 256, times
//   the d split) and each warp its own 16 rows of Kj, Vj per slice of
//   q_slice queries (one slice a Q block in the atomic variant at d = 256;
//   both warps of a key group at d = 256); dV += P^T dO and dK += dS^T Q
//   read dOi and Qi once per key group (each warp its columns); L and D
//   once per key group. With 2-D warp tiles (d = 128, both variants; d = 64,
//   atomic), a warp's S^T, dP^T tile of 32 keys x Br / 2 queries (32, or 64
//   in passes of 128) reads its keys of Kj, Vj and its queries of Qi, dOi,
//   so that per visited row and pass the kTileSideWarps warps of a key
//   range read all C_j keys and the
//   kTileKeyWarps warps of a query range all the rows; its dV, dK tile of 32
//   keys x d / 2 columns reads its keys' P^T, dS^T rows over all the pass's
//   rows (kTileSideWarps times a row's C_j) and its columns of dOi, Qi
//   (kTileKeyWarps times a row's d); L and D once per warp whose queries
//   hold the row (kTileKeyWarps).
//   Then, in either tiling, the atomic variant's dQ step reads dS's C_j
//   per row once per chunk of dq_chunk columns (each chunk reloads its
//   warp's dS fragments; a row's chunks, over the warps that share its
//   rows, cover d rounded up to whole chunks) and Kj's C_j d per pass per
//   row group (bwd::dq_row_groups: 4 groups of 32 rows at d = 64, 2 of 32
//   at d = 128, 4 of 16 at d = 256).
// - Matmul FLOPs: the five products, 2 C_j d per row each; at d = 256 the two
//   warps of a key group both compute S^T and dP^T (counted: executed work).
//   The deterministic variant's dQ kernel adds S, dP and dQ = dS K (6 R C d
//   per Q block of R rows over C visited keys) and drops the dQ product from
//   the dK, dV kernel. Its shared-memory reads: each warp its 16 rows of Qi
//   and dOi per K/V block (once, at the first, where it holds them in
//   registers: dq_holds_rows), all of Kj twice and Vj once.
// - Non-matmul FLOPs: per score the FFMA (2), exp2, dP - D, times P (5); the
//   deterministic dQ kernel repeats them.
// - Conversion pass (atomic variant): 4 d read, d elements written per row,
//   one multiply per element.
// - Block barriers, summed over thread blocks: a (dK, dV) block meets once
//   per visited (query head, pass) pair and once before its tiles are
//   reused; in the atomic variant with two dS tiles (bwd::ds_tiles, d = 256)
//   once more after the pairs, for the last pair's dQ step (each pair's dQ
//   step runs behind the next pair's barrier), with one tile once more per
//   pair (between its products and its dQ step); with 2-D warp tiles
//   (d = 128, both variants; d = 64, atomic) once more per pair (between
//   S^T, dP^T and the other products); not at all when no row sees its K/V block. A dQ kernel
//   block meets once per K/V block and once at its end.
#include <algorithm>

#include "tensor_core.h"
#include "tensor_core_backward_tiles.h"

namespace flashstep::tensor_core {

namespace {

constexpr std::int64_t kFloatBytes = 4;
constexpr std::int64_t kFlopsPerScore = 5;

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

}  // namespace

template <bool kAtomicDQ>
Cost backward_model(const Problem& p) {
  const int bucket = head_dim_bucket(p.d);
  const std::int64_t e = p.elem_bytes();
  const std::int64_t d = p.d;
  const std::int64_t split = bwd::d_split(bucket);
  const std::int64_t warps = bwd::warps(bucket, kAtomicDQ);
  const std::int64_t groups = bwd::key_groups(bucket, kAtomicDQ);
  const std::int64_t Bc = bwd::block_keys(bucket, kAtomicDQ);
  const bool defer_dq = kAtomicDQ && bwd::ds_tiles(bucket) == 2;
  const bool tile_2d = bwd::warp_tile_2d(bucket, kAtomicDQ);
  const std::int64_t barriers_per_pair = (kAtomicDQ && !defer_dq) || tile_2d ? 2 : 1;
  // 16-bit score tiles a pass stores (C_j per row each): P^T and dS^T with
  // 2-D warp tiles, else dS^T for the atomic variant's dQ step.
  const std::int64_t score_stores = tile_2d ? 2 : kAtomicDQ ? 1 : 0;
  const std::int64_t Tc = ceil_div(p.Nk, Bc);
  const std::int64_t Tr = ceil_div(p.Nq, bwd::kBr);
  const std::int64_t Br = bwd::q_block(bucket, kAtomicDQ);  // rows per pass
  const std::int64_t slices = bwd::kBr / bwd::q_slice(bucket, kAtomicDQ);
  const std::int64_t dq_chunk = bwd::dq_chunk(bucket);
  const std::int64_t dq_cols = std::min<std::int64_t>(bucket, ceil_div(d, dq_chunk) * dq_chunk);
  Cost head;     // per query head
  Cost kv_head;  // per K/V head
  for (std::int64_t j = 0; j < Tc; ++j) {
    const std::int64_t key0 = j * Bc;
    const std::int64_t C = std::min<std::int64_t>(Bc, p.Nk - key0);
    const std::int64_t first_row = p.causal ? std::max<std::int64_t>(0, key0 + p.Nq - p.Nk) : 0;
    kv_head.hbm_write_bytes += 2 * C * d * e;  // dK_j, dV_j: zeros when no row sees them
    if (first_row >= p.Nq) {
      head.skipped_tiles += Tr;
      continue;
    }
    const std::int64_t i_first = first_row / bwd::kBr;
    head.skipped_tiles += i_first;
    const std::int64_t blocks = Tr - i_first;  // Q blocks of kBr
    const std::int64_t rows = p.Nq - i_first * bwd::kBr;
    const std::int64_t passes = ceil_div(rows, Br);
    head.barriers += barriers_per_pair * passes;
    kv_head.barriers += defer_dq ? 2 : 1;  // the last pair's dQ step; the tiles' reuse
    kv_head.hbm_read_bytes += 2 * C * d * e;  // Kj, Vj
    kv_head.sram_write_bytes += 2 * C * d * e;
    head.hbm_read_bytes += rows * (2 * d * e + 2 * kFloatBytes);
    head.sram_write_bytes += rows * (2 * d * e + 2 * kFloatBytes) + score_stores * rows * C * e;
    if (tile_2d) {
      const std::int64_t key_warps = bwd::kTileKeyWarps, side_warps = bwd::kTileSideWarps;
      head.sram_read_bytes += 2 * (passes * side_warps * C + key_warps * rows) * d * e  // S^T, dP^T
                              + 2 * (side_warps * rows * C + key_warps * rows * d) * e  // dV, dK
                              + rows * key_warps * 2 * kFloatBytes;                   // L, D
    } else {
      head.sram_read_bytes += rows * (2 * warps + 2 * groups) * d * e +
                              passes * slices * 2 * split * C * d * e +
                              rows * groups * 2 * kFloatBytes;
    }
    const std::int64_t products = kAtomicDQ ? 5 : 4;
    head.matmul_flops += (products + 2 * (split - 1)) * 2 * rows * C * d;
    head.nonmatmul_flops += kFlopsPerScore * rows * C;
    if (kAtomicDQ) {
      head.hbm_read_bytes += blocks * bwd::kBr * dq_cols * kFloatBytes;
      head.hbm_write_bytes += blocks * bwd::kBr * dq_cols * kFloatBytes;
      const std::int64_t dq_chunks = dq_cols / dq_chunk;  // per row, over its warps
      head.sram_read_bytes +=
          rows * C * dq_chunks * e + passes * bwd::dq_row_groups(bucket) * C * d * e;
    }
  }
  if (!kAtomicDQ) {
    for (std::int64_t i = 0; i < Tr; ++i) {
      const std::int64_t R = std::min<std::int64_t>(bwd::kBr, p.Nq - i * bwd::kBr);
      const std::int64_t n = ceil_div(p.visible_keys(i * bwd::kBr + R - 1), bwd::kDQBc);
      const std::int64_t C = std::min(n * bwd::kDQBc, p.Nk);
      head.hbm_read_bytes += 2 * R * d * e + 2 * R * kFloatBytes + 2 * C * d * e;
      head.hbm_write_bytes += R * d * e;
      head.sram_write_bytes += 2 * R * d * e + 2 * C * d * e;
      // Each warp: its rows of Qi and dOi per K/V block, or once where it
      // holds them in registers; all of Kj (twice) and Vj.
      const std::int64_t row_reads = bwd::dq_holds_rows(bucket) ? std::min<std::int64_t>(n, 1) : n;
      head.sram_read_bytes += row_reads * 2 * R * d * e + bwd::kDQWarps * 3 * C * d * e;
      head.matmul_flops += 6 * R * C * d;
      head.nonmatmul_flops += kFlopsPerScore * R * C;
      head.barriers += n + 1;
    }
  }
  // Pre-pass: O, dO and L read; D and L log2 e written; D's d multiply-adds.
  head.hbm_read_bytes += p.Nq * (2 * d * e + kFloatBytes);
  head.hbm_write_bytes += p.Nq * 2 * kFloatBytes;
  head.nonmatmul_flops += p.Nq * (2 * d + 1);
  if (kAtomicDQ) {
    head.hbm_write_bytes += bwd::dq_accum_rows(p.Nq) * bucket * kFloatBytes;  // accumulator zeroed
    head.hbm_read_bytes += p.Nq * d * kFloatBytes;              // and converted
    head.hbm_write_bytes += p.Nq * d * e;
    head.nonmatmul_flops += p.Nq * d;
  }
  const std::int64_t kv_heads = p.B * p.kv_heads();
  Cost c = head.times(p.heads());
  c += kv_head.times(kv_heads);
  const std::int64_t heads_y = std::min(p.heads(), bwd::kMaxGridY);
  c.thread_blocks = Tc * std::min(kv_heads, bwd::kMaxGridY) + (kAtomicDQ ? 0 : Tr * heads_y);
  return c;
}

template Cost backward_model<true>(const Problem&);
template Cost backward_model<false>(const Problem&);

}  // namespace flashstep::tensor_core
