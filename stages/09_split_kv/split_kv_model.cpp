// Stage 09's model, workspace and registry entries (host only).
//
// Counting conventions (common/cost.h), over the split kernel's blocks (K/V
// head, row tile of R rows, split of C keys in ceil(C / kBc) K/V tiles) and
// the merge; valid rows, keys and columns only, as in common/fa2_model.cpp:
// the kernel's zero padding (rows past R, keys past the split, columns past d)
// is not counted.
// - HBM: Q once per split, K and V once per (row tile, split), the partials
//   (d + 1 fp32 per row and split) written and read back by the merge, O and
//   L written once; with one split O and L straight from the split kernel.
// fp32 runs on the CUDA-core split kernel:
// - SRAM writes: the block's Q rows (R d, widened to fp32), each K/V tile
//   (2 C d elements of p.dtype), per row and tile P~ (a float per key). The
//   row statistics (m, l, alpha) stay in the registers of the warp that owns
//   the row.
// - SRAM reads, one per multiply-add operand as in stages 01-06: a Q (fp32)
//   and a K element per (visible score, column); a P~ (fp32) and a V element
//   per (row, key read, column). (The kernel's register tiles load each
//   value once for several multiply-adds: a K value for 4 rows, a Q value
//   for 2 keys, a P~ for 4 columns, a V value for 4 rows in the wide layout;
//   the count keeps the operands, comparable with stages 01-06.) The merge kernel's shared
//   memory: per row the sums of its merge_warps - 1 other warps (d floats
//   each), written once and read once.
// - Matmul FLOPs: 2 d per visible score (S), 2 d per (row, key read) (P~ V).
// - Non-matmul FLOPs: the scale per visible score (masked ones are not
//   computed); max, subtract, exp2 and add to the row sum per (row, key
//   read); per row and tile the max with m, alpha (subtract, exp2), l alpha +
//   sum (2) and d rescales of O~; per row at the end d divisions and
//   L = (m + log2 l) ln 2 (3), counted even where l = 0 selects O = 0 and
//   L = -inf. The merge: lse_merge and partial_weight per (row, split),
//   kMergeLanes - 1 more lse_merge per row (the lanes' butterfly), per
//   (element, split) a multiply and an add (common/partial_merge.h), and
//   per element merge_warps - 1 adds (the row's warps' sums added up).
// fp16 and bf16 run on the tensor-core split kernel (split_kv.cu,
// split_mma_kernel), with the same HBM traffic and matmul FLOPs and, with S
// key slices of 16 keys per barrier step of T = 16 S keys (one K/V tile, or
// with the narrow layout a pair: mma_step_slices) and RG warps sharing a
// slice (mma_step_row_groups, split_kv_plan.h):
// - SRAM writes: the block's Q rows (R d elements of p.dtype), each K/V tile
//   (2 keys d), and at the end per row each slice's O_w and L_w (S (d + 1)
//   floats), the S merge weights and L (S + 1).
// - SRAM reads, as the warps load fragments: the rows of Q once per slice
//   (S R d) per visited K/V tile, or once per split where the warps hold
//   them in registers (mma_q_in_registers: d = 128); every K and V element
//   once per warp of its slice (RG each); at the end per row L_w twice (for
//   L, then the weights: 2 S), per element a weight and an O_w per slice
//   (2 S d), and L once.
// - Non-matmul FLOPs: per (row, key read) the scale (every score: masked ones
//   are scaled and then set to -inf), max, subtract, exp2 and add to the row
//   sum (5); per row and 16-key slice holding keys the max with m, alpha
//   (subtract, exp2), l alpha + sum (2) and d rescales of O~; per row and
//   slice at the end 1/l, d multiplies, L_w (log2, add, times ln 2); per row
//   S lse_merge and S partial_weight, and per element a multiply and an add
//   per slice. The merge kernel as for fp32.
#include <algorithm>
#include <cstdint>

#include "common/partial_merge.h"
#include "split_kv.h"

namespace flashstep::split_kv {

namespace {

// Non-matmul FLOPs of the split kernel, as the conventions above list them.
constexpr std::int64_t kFlopsPerVisibleScore = 1;  // the scale
constexpr std::int64_t kFlopsPerKey = 4;           // max, subtract, exp2, add (per row)
constexpr std::int64_t kFlopsPerRowTile = 5;       // max with m, subtract, exp2, l alpha + sum
constexpr std::int64_t kFlopsPerRowEnd = 3;        // log2, add, times ln 2 (besides d divisions)
// The merge's per (element, split): w O_s, then the add (besides partial_weight).
constexpr std::int64_t kMergeFlopsPerElem = 2;
// The tensor-core kernel's: per (row, key read) the scale, max, subtract,
// exp2 and add; per (row, slice) at the end 1/l, log2, add, times ln 2
// (besides the d multiplies).
constexpr std::int64_t kMmaFlopsPerKey = 5;
constexpr std::int64_t kMmaFlopsPerRowEnd = 4;

// Sum over x = x0 .. x0 + n - 1 of clamp(x, lo, hi) - lo (0 when hi <= lo):
// the keys of [lo, hi) that rows seeing x keys each see, in closed form.
std::int64_t clamped_sum(std::int64_t x0, std::int64_t n, std::int64_t lo, std::int64_t hi) {
  if (hi <= lo || n <= 0) return 0;
  const std::int64_t x1 = x0 + n - 1;
  const std::int64_t at_hi = std::clamp<std::int64_t>(x1 - hi + 1, 0, n);  // x >= hi: hi - lo each
  const std::int64_t a = std::max(x0, lo + 1), z = std::min(x1, hi - 1);     // lo < x < hi: x - lo
  const std::int64_t middle = z >= a ? (z - a + 1) * ((a - lo) + (z - lo)) / 2 : 0;
  return at_hi * (hi - lo) + middle;
}

// The counts of `plan` on p, by the split kernel's loops summed in closed form.
Cost count(const Problem& p, const Plan& plan) {
  constexpr std::int64_t F = kFloatBytes;  // L, the partials, and fp32 values on chip
  const std::int64_t E = p.elem_bytes();    // Q, K, V and O; K and V on chip
  const std::int64_t kv_heads = p.B * p.kv_heads();
  const std::int64_t rows_total = p.heads() * p.Nq;
  Cost c;
  // Each (row tile, split) block reads its rows of Q; over the row tiles of
  // a K/V head that is every row of its group once per split.
  c.hbm_read_bytes = plan.splits * rows_total * p.d * E;
  // Each block reads its split's keys of K and V: every key once per row tile.
  c.hbm_read_bytes += kv_heads * plan.row_tiles * 2 * p.Nk * p.d * E;
  // Partials in fp32 (d + 1 per row and split), or with one split O (in
  // p.dtype) and L.
  c.hbm_write_bytes = plan.splits > 1 ? plan.splits * rows_total * (p.d + 1) * F
                                      : rows_total * (p.d * E + F);
  // S: 2 d per visible key of each row; P V: 2 d per key its block reads.
  // Query i sees keys 0 .. i + Nk - Nq (causal), so over a split's keys
  // [k_lo, k_hi) its count is clamp(i + Nk - Nq + 1, k_lo, k_hi) - k_lo.
  std::int64_t seen = 0;  // over the Nq queries of one head
  for (std::int64_t s = 0; s < plan.splits; ++s) {
    const std::int64_t k_lo = s * plan.keys_per_split;
    const std::int64_t k_hi = std::min(k_lo + plan.keys_per_split, p.Nk);
    seen += p.causal ? clamped_sum(p.Nk - p.Nq + 1, p.Nq, k_lo, k_hi) : p.Nq * (k_hi - k_lo);
  }
  const std::int64_t visible = p.heads() * seen;  // scores computed
  const std::int64_t key_rows = rows_total * p.Nk;  // (row, key read) over the splits
  // (row, K/V tile): keys_per_split is a multiple of kBc, so the splits'
  // tiles together are the ceil(Nk / kBc) tiles of the whole sequence.
  const std::int64_t row_kv_tiles = rows_total * ((p.Nk - 1) / kBc + 1);
  const std::int64_t row_ends = plan.splits * rows_total;  // (row, split)
  c.matmul_flops = 2 * p.d * (visible + key_rows);
  if (p.dtype == DType::kFp32) {
    c.sram_write_bytes = plan.splits * rows_total * p.d * F +            // Q
                         kv_heads * plan.row_tiles * 2 * p.Nk * p.d * E +  // K and V
                         key_rows * F;                                     // P~
    c.sram_read_bytes = (visible + key_rows) * p.d * (F + E);  // S and P~ V operands
    c.nonmatmul_flops = kFlopsPerVisibleScore * visible + kFlopsPerKey * key_rows +
                        row_kv_tiles * (kFlopsPerRowTile + p.d) + row_ends * (p.d + kFlopsPerRowEnd);
  } else if (plan.tile_rows == kWideRows) {
    // The Hopper kernel: per K/V tile of kWideKeys keys each block reads its
    // rows of Q (the wgmma's A operand) and the tile's K and V once from
    // shared memory; O and L leave from the registers.
    std::int64_t tiles = 0;  // K/V tiles a (K/V head, row tile) takes over its splits
    for (std::int64_t s = 0; s < plan.splits; ++s) {
      const std::int64_t k_lo = s * plan.keys_per_split;
      tiles += (std::min(k_lo + plan.keys_per_split, p.Nk) - k_lo - 1) / kWideKeys + 1;
    }
    const std::int64_t kv_bytes = kv_heads * plan.row_tiles * 2 * p.Nk * p.d * E;
    c.sram_write_bytes = plan.splits * rows_total * p.d * E + kv_bytes;  // Q; K and V
    c.sram_read_bytes = rows_total * tiles * p.d * E + kv_bytes;         // Q a tile; K and V
    c.nonmatmul_flops = kMmaFlopsPerKey * key_rows + rows_total * tiles * (kFlopsPerRowTile + p.d) +
                        row_ends * (p.d + kMmaFlopsPerRowEnd);
  } else {
    const int kD = head_dim_bucket(p.d);
    // Slices a barrier step, warps sharing each, keys a step (one K/V tile,
    // or with the narrow layout a pair).
    const std::int64_t S = mma_step_slices(kD, plan.group_rows);
    const std::int64_t RG = mma_step_row_groups(kD, plan.group_rows);
    const std::int64_t T = S * kWarpKeys;
    std::int64_t tiles = 0;  // steps a (K/V head, row tile) takes over its splits
    for (std::int64_t s = 0; s < plan.splits; ++s) {
      const std::int64_t k_lo = s * plan.keys_per_split;
      tiles += (std::min(k_lo + plan.keys_per_split, p.Nk) - k_lo - 1) / T + 1;
    }
    // (row, 16-key slice): keys_per_split is a multiple of kWarpKeys, so the
    // splits' slices together are the ceil(Nk / kWarpKeys) of the sequence.
    const std::int64_t row_slices = rows_total * ((p.Nk - 1) / kWarpKeys + 1);
    c.sram_write_bytes = plan.splits * rows_total * p.d * E +              // Q
                         kv_heads * plan.row_tiles * 2 * p.Nk * p.d * E +  // K and V
                         row_ends * (S * (p.d + 1) + S + 1) * F;          // O_w, L_w; weights, L
    // Q's fragments: per K/V tile, or once per split where held in registers.
    const std::int64_t q_reads = mma_q_in_registers(kD) ? row_ends : rows_total * tiles;
    c.sram_read_bytes = S * q_reads * p.d * E +                                // Q fragments
                        kv_heads * plan.row_tiles * 2 * RG * p.Nk * p.d * E +  // K, V fragments
                        row_ends * (2 * S + 2 * S * p.d + 1) * F;              // the slices' merge
    c.nonmatmul_flops = kMmaFlopsPerKey * key_rows + row_slices * (kFlopsPerRowTile + p.d) +
                        row_ends * S * (p.d + kMmaFlopsPerRowEnd) +
                        row_ends * S * (kLseMergeFlops + kPartialWeightFlops) +
                        row_ends * p.d * S * kMergeFlopsPerElem;
  }
  if (plan.splits > 1) {  // the merge: every partial read, O and L written
    const std::int64_t other_warps = merge_warps(plan.splits, head_dim_bucket(p.d)) - 1;
    c.hbm_read_bytes += plan.splits * rows_total * (p.d + 1) * F;
    c.sram_write_bytes += rows_total * other_warps * p.d * F;
    c.sram_read_bytes += rows_total * other_warps * p.d * F;
    c.hbm_write_bytes += rows_total * (p.d * E + F);
    c.nonmatmul_flops += row_ends * (kLseMergeFlops + kPartialWeightFlops +
                                     p.d * kMergeFlopsPerElem) +
                         rows_total * (kMergeLanes - 1) * kLseMergeFlops +  // the lanes' butterfly
                         rows_total * p.d * other_warps;  // the warps' sums added up
  }
  c.thread_blocks = thread_blocks(p, plan);
  return c;
}

}  // namespace

std::int64_t workspace_bytes(const Problem& p) {
  const std::int64_t splits = max_splits(p);
  return splits > 1 ? splits * (p.q_elems() + p.lse_elems()) * kFloatBytes : 0;
}

std::int64_t workspace_bytes_one_block(const Problem&) { return 0; }

Cost model(const Problem& p) {
  return count(p, make_plan(p, kModelSmCount, true, false, model_wide(p)));
}

Cost model_one_block(const Problem& p) {
  return count(p, make_plan(p, kModelSmCount, false, false, model_wide(p)));
}

}  // namespace flashstep::split_kv

namespace flashstep {

std::vector<Stage> stages_09_split_kv() {
  Stage s;
  s.name = "09_split_kv";
  s.title = "split-KV decoding: keys over thread blocks, partials merged";
  s.writes_lse = true;
  s.forward = split_kv::forward;
  s.workspace_bytes = split_kv::workspace_bytes;
  s.model = split_kv::model;
  s.mirror = split_kv::mirror;
  s.grouped_heads = true;  // a group's query heads are rows of one block
  s.dtypes = {DType::kFp32, DType::kBf16, DType::kFp16};
  Stage one = s;
  one.name = "09_one_block";
  one.title = "decoding without splits: one block per (batch, K/V head)";
  one.forward = split_kv::forward_one_block;
  one.workspace_bytes = split_kv::workspace_bytes_one_block;
  one.model = split_kv::model_one_block;
  one.mirror = split_kv::mirror_one_block;
  return {s, one};
}

}  // namespace flashstep
