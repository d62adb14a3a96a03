/// \file split_kv_plan.h
/// \brief Stage 09's work plan, shared by the kernels, the CPU mirror and the
/// model: the tiles, the split count rule, and which keys and query rows one
/// thread block handles. CUDA-free; the index helpers also run on the device.
///
/// One unit of work is (K/V head, row tile, split):
/// - the K/V head kvh of B * H_kv;
/// - a tile of kRows rows of that head's *group*: the G = H / H_kv query heads
///   that read K/V head kvh, each with its Nq queries, flattened as
///   r = g * Nq + i (query head g of the group, query i), so that one block
///   reads each K/V tile once for every query head of the group;
/// - a split: a contiguous range of keys [s * keys_per_split, ...). Each split
///   writes a partial (O_s, L_s) per row, merged afterwards (partial_merge.h).
///
/// A block reads all of its split's keys, whatever the causal mask: decoding
/// rows (Nq small) see nearly every key, and the counts stay closed-form.
/// Scores of masked keys are not computed (they are -inf).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/error.h"
#include "common/host_device.h"
#include "common/problem.h"

namespace flashstep::split_kv {

/// Query rows per block: the rows of one group a block takes at once. 32
/// covers a whole group while decoding (Nq = 1 with G up to 32: MQA on 32
/// heads; Nq = 4 with G = 8), so K and V are read once per group there. 8
/// warps own 4 rows each for the softmax.
inline constexpr int kRows = 32;
/// Keys per tile: one per lane, so a warp holds one row's tile scores with one
/// score a lane and takes its max and sum by shuffles.
inline constexpr int kBc = 32;
/// Threads per block: 8 warps.
inline constexpr int kThreads = 256;
/// Warps per block, each owning kRows / kWarps = 4 rows of the tile.
inline constexpr int kWarps = kThreads / 32;
/// Rows of one thread's register tile in the fp32 kernel's wide layout:
/// warp w owns rows 4 w .. 4 w + 3 and computes them together, so that each
/// value it loads from shared memory feeds 4 rows' FFMAs. In S = Q K^T a lane
/// scores 4 rows x 2 keys over half the columns (per 4 columns 4 LDS.128 of
/// Q and 2 of K for 32 FFMA); in O~ += P~ V it holds 4 rows x 4 columns
/// (per key one LDS.128 of P~ and one of V for 16 FFMA). 4 is the warp's
/// whole share of the 32 rows, and its 16 accumulators a lane at d = 128 are
/// as many as the one-row layout holds (kRows d / kThreads).
inline constexpr int kFp32TileRows = 4;
/// Whether the fp32 kernel takes the wide layout (kFp32TileRows rows a
/// register tile) for a group of `group_rows` rows, or the narrow one (one
/// row at a time: warp w owns rows w, w + 8, w + 16, w + 24). With at most
/// kWarps rows the narrow layout gives every row its own warp, and the wide
/// one would leave all but ceil(rows / 4) warps idle while those run 4 rows'
/// work (mostly padding) in one chain; past kWarps rows a warp has two or
/// more real rows, and the wide layout does them in one pass with a quarter
/// of the shared-memory loads per FFMA in P~ V.
FLASHSTEP_HOST_DEVICE constexpr bool fp32_wide(std::int64_t group_rows) {
  return group_rows > kWarps;
}
/// Warps of a merge kernel block. A row of O is merged by merge_warps warps
/// of one block, each summing its own run of the splits, so that with few
/// rows and many splits (MQA on one sequence: 32 rows, up to 256 splits)
/// the reads of O_s are spread over 8 times the warps and each warp waits on
/// fewer rounds of them; with many rows one warp a row, 8 rows a block.
inline constexpr int kMergeWarps = 8;
/// Threads of the merge kernel.
inline constexpr int kMergeThreads = kMergeWarps * 32;
/// Lanes of the merge kernel's warp (the warp size): for a row's L, lane l
/// merges splits l, l + kMergeLanes, ..., then the lanes merge theirs in a
/// butterfly, kMergeLanes - 1 more merges in all.
inline constexpr int kMergeLanes = 32;
/// Splits the merge kernel reads before it sums them, for the head-dimension
/// bucket kD: that many rows of O_s (d floats each) in flight at once per
/// warp, to cover the reads' latency with few warps. Each round of reads
/// waits one L2 latency. 16 up to d = 128 (64 registers of a lane at
/// d = 128), 8 at d = 256 (64 registers there too).
FLASHSTEP_HOST_DEVICE constexpr int merge_splits(int kD) { return kD <= 128 ? 16 : 8; }
/// Warps that merge one row of O, for `splits` partials in bucket kD: enough
/// that each reads its run of the splits in one round of merge_splits (a
/// power of two, so that a block holds whole rows), at most kMergeWarps. The
/// row's L is found by every one of them (each needs it for its weights);
/// their sums of O then meet in shared memory, added in warp order.
FLASHSTEP_HOST_DEVICE constexpr int merge_warps(std::int64_t splits, int kD) {
  int w = 1;
  while (w < kMergeWarps && w * static_cast<std::int64_t>(merge_splits(kD)) < splits) w *= 2;
  return w;
}
/// Splits of a row's run for one of its merge warps: ceil(splits / warps);
/// warp w takes [w run, (w + 1) run).
FLASHSTEP_HOST_DEVICE constexpr std::int64_t merge_run(std::int64_t splits, int warps) {
  return (splits - 1) / warps + 1;
}

/// The 16-bit (bf16, fp16) split kernel runs on the tensor cores
/// (split_kv_mma.cuh) with the same plan: the same row tiles of kRows rows,
/// the same splits, the same partials. Its own tiles follow.
///
/// Warps of the 16-bit kernel. The rows are few (M = kRows = 32 at most, two
/// m16 tiles of mma.m16n8k16), so the warps split the keys instead of the
/// rows: each takes its own slice of every K/V tile (a split-K inside the
/// block), and their (m, l, O~) are merged at the end of the split. 4 warps
/// keep up to 2 blocks on an SM (below) and still leave each warp its
/// 255 registers.
inline constexpr int kMmaWarps = 4;
/// Keys of one warp's slice of a K/V tile: the k depth of one P~ V product
/// (mma.m16n8k16's k = 16), and two n8 tiles of S = Q K^T.
inline constexpr int kWarpKeys = 16;
/// m16 tiles of rows one warp holds, for the head-dimension bucket kD: both
/// of the row tile's (32 rows) at d = 64, where a warp's O~ is 2 x 16 x 64
/// fp32 = 64 registers a lane. From d = 128 one, and two warps share each
/// key slice: at d = 256 two would be 256 registers, more than a thread has;
/// at d = 128 they fit (128), but with one the K/V tile is 32 keys (16 KiB),
/// so the same shared memory holds twice the stages and more of it is in
/// flight (mma_stages). With at most 16 rows in the row tile a warp skips
/// its m16 tiles of padding rows (split_kv.cu).
constexpr int mma_warp_m_tiles(int kD) { return kD <= 64 ? 2 : 1; }
/// Warps that share one key slice (each with its own m16 tiles).
constexpr int mma_row_groups(int kD) { return 2 / mma_warp_m_tiles(kD); }
/// Keys of one K/V tile of the 16-bit kernel: one slice per warp group.
constexpr int mma_tile_keys(int kD) { return kMmaWarps / mma_row_groups(kD) * kWarpKeys; }
/// Whether the 16-bit kernel at bucket kD runs a group of at most one m16
/// tile of rows (G Nq <= 16: every decode of H_kv = 8 or 32 at H = 32) with
/// every warp multiplying: at d = 128 two warps share each 16-key slice of
/// a 32-key tile, one m16 tile of rows each, and with 16 rows or fewer the
/// second warp of each slice only copied and waited at the barriers. Here
/// the four warps take the four 16-key slices of two consecutive tiles
/// instead, all on rows 0..15, with one barrier per pair: the chain of
/// fragments, mma and softmax a warp runs per barrier is unchanged, and it
/// covers 64 keys a block instead of 32. At d = 128 only: a pair of tiles
/// with 4 more in flight needs the 6 stages (mma_stages); d = 64 has every
/// warp multiplying already.
FLASHSTEP_HOST_DEVICE constexpr bool mma_narrow(int kD, std::int64_t group_rows) {
  return kD == 128 && group_rows <= 16;
}
/// Key slices of 16 keys per barrier of the 16-bit kernel (kMmaWarps /
/// row groups, or every warp's own in the narrow layout), and the warps
/// that read each slice's K and V fragments.
constexpr int mma_step_slices(int kD, std::int64_t group_rows) {
  return mma_narrow(kD, group_rows) ? kMmaWarps : kMmaWarps / mma_row_groups(kD);
}
constexpr int mma_step_row_groups(int kD, std::int64_t group_rows) {
  return mma_narrow(kD, group_rows) ? 1 : mma_row_groups(kD);
}
/// Whether the 16-bit kernel's warps hold Q's A fragments (their m16 tiles'
/// rows, all kD columns) in registers for the whole split, read from shared
/// memory once, instead of once per K/V tile. Per tile that saves a third of
/// a warp's ldmatrix (its Q, besides K and V) and of the shared-memory
/// bandwidth they take: at d = 128 two blocks an SM read 8 x 512 bytes of Q
/// per warp and tile, 32 KiB of the ~96 KiB of fragments and ~32 KiB of
/// cp.async stores an SM's shared memory serves (128 bytes a clock) per
/// tile. It costs kD / 4 registers a lane per m16 tile: at d = 128 (one m16
/// tile, 168 registers) 32, and two blocks of 128 threads still fit under
/// 256 registers a thread. Not at d = 64, where its 164 registers would
/// pass the 170 that keep three blocks an SM (resident_blocks), nor at
/// d = 256, at 255 already.
constexpr bool mma_q_in_registers(int kD) { return kD == 128; }
/// K/V tiles of the 16-bit kernel in shared memory at once. Decoding is
/// HBM-bound, so the tiles are there to keep bytes in flight: by Little's law
/// an SM's share of an H200's ~4.8 TB/s (36 B/ns) at 1.5 to 2 us of latency
/// under load is 55 to 75 KB. A block waits for tile t with kStages - 2
/// younger tiles still coming, then starts tile t + kStages - 1 into the
/// stage tile t - 1 freed: between kStages - 2 and kStages - 1 tiles in
/// flight. At d = 128 (16 KiB tiles of 32 keys) 6 stages keep 64 to 80 KiB
/// in flight per block in 96 KiB, two blocks an SM (3 stages of 32 KiB, as
/// before, kept 32 to 64); at d = 256 (32 KiB tiles) 3 stages in 96 KiB; at
/// d = 64 (16 KiB tiles of 64 keys) 4 stages keep 32 to 48 KiB in flight in
/// 64 KiB, three blocks an SM.
constexpr int mma_stages(int kD) { return kD <= 64 ? 4 : kD <= 128 ? 6 : 3; }

/// The Hopper kernel (split_kv_sm90.cu) for wide groups: on an sm_90 GPU, in
/// 16 bits at d = 128, a group of more than kRows rows (MQA with Nq = 4: 32
/// query heads x 4 queries = 128 rows) runs in blocks of one warpgroup and
/// kWideRows = 64 rows (wgmma's M) on Hopper's asynchronous tensor cores.
/// There the time is the tensor cores', not the bytes': each K/V byte feeds
/// 128 rows, 128 FLOPs a byte, so 85 % of the copy ceiling (4.23 TB/s) asks
/// 460 TFLOP/s, past what mma.sync sustains in attention (stage 07's
/// forward: 355 of its 649 peak) and within reach of wgmma (stage 08: 700).
/// The row tiles of one split are consecutive blocks (split_wgmma_kernel),
/// so they run together and the second reads the split's keys from L2.
inline constexpr int kWideRows = 64;
/// Threads of the Hopper kernel: one warpgroup.
inline constexpr int kWideThreads = 128;
/// Keys of the Hopper kernel's K/V tile: S is m64 x n64 (32 fp32 a thread),
/// P~ V four k16 steps; 64 is also kPageKeyMultiple, so a paged tile is one
/// page's contiguous block.
inline constexpr int kWideKeys = 64;
/// K/V tiles in the Hopper kernel's shared memory: 3 of 32 KiB with Q's
/// 16 KiB take 113 KiB, two blocks an SM (kWideResidentBlocks), so that one
/// block's softmax runs beside the other's products (the two are not tied by
/// any barrier). Each block has 1 to 2 tiles in flight, 64 to 128 KiB an SM,
/// past the 55 to 75 KB an SM's share of HBM needs (mma_stages). More in
/// flight was slower (docs/results/tuning_09/README.md, run 20): 32-key
/// tiles 6 deep (per-tile work doubled a key), and two warpgroups sharing
/// 6 stages of 64 keys in one block an SM (level at 64 sequences, slower
/// at one).
inline constexpr int kWideStages = 3;
/// Blocks of the Hopper kernel an SM holds: two (its shared memory, and its
/// registers: 2 x 128 threads x up to 256).
inline constexpr int kWideResidentBlocks = 2;
/// Whether a problem of type t, head-dimension bucket kD and group_rows rows
/// a K/V head takes the Hopper kernel's layout on an sm_90 GPU (with 16-byte
/// rows and aligned tensors: the caller checks those).
FLASHSTEP_HOST_DEVICE constexpr bool wide_group(DType t, int kD, std::int64_t group_rows) {
  return t != DType::kFp32 && kD == 128 && group_rows > kRows;
}

/// Thread blocks of the split kernel that one SM holds at once on sm_90
/// (H100, H200: 64 K registers, 228 KiB of shared memory, 1 KiB of it
/// reserved per block), for p's element type and head-dimension bucket: the
/// fewer of what the registers (ptxas -v) and the shared memory allow.
///
///   fp32 (split_kernel, 256 threads)   d = 64, 128: 128 registers, 2 blocks
///                                      d = 256: 190 (wide), 165 (narrow)
///                                      registers, 1 block
///   16 bits (split_mma_kernel, 128)    d = 64: 168 registers, 69 KiB: 3
///                                      d = 128: 250 registers, 105 KiB: 2
///                                      d = 256: 255 registers, 113 KiB: 2
///
/// The 16-bit kernel asks ptxas for these blocks (its __launch_bounds__):
/// at d = 64 that caps it at 168 registers, where the next K/V tile's copies
/// issued between the mma of S and their use (split_kv.cu) took 187 to 211.
/// At 128 threads a block, 256 registers a thread still fit two blocks.
/// The split rule counts waves of blocks with it; a GPU test checks it
/// against the occupancy the device reports (test_kvcache_gpu.cpp).
constexpr int resident_blocks(DType t, int kD) {
  if (t == DType::kFp32) return kD <= 128 ? 2 : 1;
  return kD <= 64 ? 3 : 2;
}
/// Split only while the unsplit grid fills less than this share of the
/// resident slots (SMs x resident_blocks): above it the split's gain is a
/// short last wave, and its cost (the partials written and read back, a
/// second kernel) is paid in full. The measured decode sweep shows it: with
/// B * H_kv = 256 blocks on 264 slots, 3 splits took 0.147 ms, one 0.139.
inline constexpr double kFullGrid = 0.8;
/// Of the split counts, the fewest whose waves are at least this share as
/// full as the fullest any count reaches (below). Every block of a wave
/// reads as many keys, so a wave takes the same time however few blocks it
/// has: 544 blocks on 264 slots (2.06 waves) cost 3 waves, half again the
/// time of 512 blocks. Among full enough counts the fewest splits: longer
/// blocks (less pipeline fill and drain per key) and less merge work. 0.95
/// rather than FlashAttention-2's 0.85: a wave 85 % full leaves 40 of 132
/// SMs with one block, whose 1 to 2 K/V tiles in flight may not cover the
/// SM's share of the bandwidth.
inline constexpr double kWaveFill = 0.95;
/// At least this many keys per split, so that the partials (d + 1 floats per
/// row and split, written and read back by the merge) stay small beside the
/// K and V a split reads (2 d elements per key): at 256 keys they are under
/// 1 % of it when the group has one row, a quarter at MQA (32 rows).
inline constexpr std::int64_t kMinKeysPerSplit = 256;
/// At least this many keys per split where the GPU would be mostly idle
/// (idle_grid): there a split's chain of dependent K/V tiles in one block
/// (barrier, fragments, mma, softmax a tile, about 0.7 us each at MQA,
/// tuning_09 run 11), not the bytes, sets the time. 256 keys were 8 tiles of
/// 32 and kept MQA on one sequence near 18 us from 1k to 4k keys; 64 keys
/// are 1 to 2 tiles. Where the GPU is busier the partials' bytes and the
/// merge's work cost more than the shorter chain saves (tuning_09 run 12:
/// 128 blocks of 256 keys made 256 of 128 and ran 4-5 % slower).
inline constexpr std::int64_t kIdleMinKeysPerSplit = 64;
/// The GPU counts as idle (idle_grid) while the blocks of kMinKeysPerSplit
/// splits would occupy at most this share of its SMs: in run 12 plans of
/// 4 to 64 such blocks on 132 SMs gained from shorter splits, plans of 128
/// lost.
inline constexpr double kIdleShare = 0.5;
/// Splits of kMinKeysPerSplit keys go up to this many: 128, about one block
/// an SM on 132 SMs for a lone (batch, K/V head) (MQA on one sequence).
inline constexpr std::int64_t kShortSplitCap = 128;
/// Past kShortSplitCap splits, at least this many keys a split. Two blocks
/// an SM read faster than one (one block's tile loop, a chain of barrier,
/// fragments, mma and exponentials per K/V tile, falls short of the SM's
/// share of the bandwidth), but each split past one an SM adds its fixed
/// costs (the pipeline's fill, the block's slice merge, its partials written
/// and merged). In the A/B of the merge change (issue 15), MQA on one
/// sequence gained from 256 splits at 512k keys (2,048 a split) and lost at
/// 64k (256 a split) against what 128 splits gained from the merge alone at
/// 32k. 1,024 keys a split: more than 128 splits past 128k keys, 256 from
/// 256k.
inline constexpr std::int64_t kMinKeysPastShortCap = 1024;
/// At least this many keys a split for the Hopper kernel (wide) where the
/// unsplit grid already gives nearly every SM a block (n0 >= kFullGrid
/// SMs): there a split only adds each SM's second block, and that pays for
/// the merge and the partials (64 rows x (d + 1) floats a block, written
/// and read back) only on long splits. MQA on 64 sequences with Nq = 4 (128
/// blocks unsplit; docs/results/tuning_09/README.md, run 20): one split was
/// ahead at 1k and 2k keys, level at 4k, and two splits ahead at 8k.
inline constexpr std::int64_t kWideSecondBlockKeys = 4096;
/// At most this many splits: the merge reads every split's partial per row.
/// 256 lets a lone (batch, K/V head) fill one wave of two resident blocks on
/// 132 SMs (264 slots). The merge spreads a row's splits over merge_warps
/// warps, so twice the splits cost it one more round of reads, not twice
/// the rounds.
inline constexpr std::int64_t kMaxSplits = 256;
/// The SM count the model and the CPU mirror plan for (H100 SXM and H200
/// both have 132); the GPU plans for its own.
inline constexpr int kModelSmCount = 132;
/// An SM count above any GPU's, for sizing the workspace without a GPU
/// (max_splits below).
inline constexpr int kMaxSmCount = 1024;
/// Largest grid x (CUDA's limit); beyond it blocks walk the rest.
inline constexpr std::int64_t kMaxGridX = 2147483647;
/// Largest grid y (CUDA's limit); beyond it blocks walk the rest.
inline constexpr std::int64_t kMaxGridY = 65535;

/// How one problem is cut into work.
struct Plan {
  std::int64_t group_rows = 0;      ///< G * Nq: query rows per K/V head
  int tile_rows = kRows;            ///< rows a block takes: kRows, or kWideRows (wide)
  std::int64_t row_tiles = 0;       ///< ceil(group_rows / tile_rows)
  std::int64_t splits = 1;          ///< key ranges per (K/V head, row tile)
  std::int64_t keys_per_split = 0;  ///< a multiple of kBc (the last split may hold fewer)
};

/// Keys of a paged cache's page are a multiple of this: the largest K/V tile
/// of either split kernel (the 16-bit kernel's 64 keys at d = 64; 32
/// elsewhere), so that with splits starting at multiples of it
/// (key_granule) no tile straddles two pages and each tile is one
/// contiguous block, copied by the same loaders as the contiguous cache's.
/// FlashAttention-2's paged cache asks for multiples of 256.
inline constexpr std::int64_t kPageKeyMultiple = 64;

/// The granule splits are dealt out in: whole tiles of kBc keys, or with a
/// paged cache whole kPageKeyMultiple keys, so that every tile of every
/// split lies inside one page.
inline std::int64_t key_granule(bool paged) { return paged ? kPageKeyMultiple : kBc; }

/// Keys of each split when Nk keys are dealt out to at most `splits` splits
/// in whole granules of `granule` keys (kBc, or kPageKeyMultiple with a paged
/// cache): granule ceil(Nk / (splits granule)). The splits that get keys are
/// then ceil(Nk / keys_per_split), which may be fewer.
inline std::int64_t keys_per_split(std::int64_t Nk, std::int64_t splits,
                                   std::int64_t granule = kBc) {
  return ((Nk - 1) / (splits * granule) + 1) * granule;
}

/// Splits allowed for p with at least min_keys keys a split:
/// min(ceil(Nk / min_keys), kShortSplitCap), or ceil(Nk /
/// kMinKeysPastShortCap) where that is more, at most kMaxSplits.
inline std::int64_t split_cap(const Problem& p, std::int64_t min_keys) {
  const std::int64_t short_splits = std::min((p.Nk - 1) / min_keys + 1, kShortSplitCap);
  const std::int64_t long_splits = (p.Nk - 1) / kMinKeysPastShortCap + 1;
  return std::min(std::max(short_splits, long_splits), kMaxSplits);
}

/// Whether n0 blocks split into kMinKeysPerSplit keys would leave the GPU
/// mostly idle: at most kIdleShare of its sm_count SMs busy.
inline bool idle_grid(const Problem& p, std::int64_t n0, int sm_count) {
  return static_cast<double>(n0 * split_cap(p, kMinKeysPerSplit)) <= kIdleShare * sm_count;
}

/// The fewest keys a split of p may have on a GPU of sm_count SMs, with n0
/// blocks unsplit: kIdleMinKeysPerSplit where idle_grid, else kMinKeysPerSplit.
inline std::int64_t min_keys_per_split(const Problem& p, std::int64_t n0, int sm_count) {
  return idle_grid(p, n0, sm_count) ? kIdleMinKeysPerSplit : kMinKeysPerSplit;
}

/// The split count: whole waves of blocks, as few splits as that allows.
///
///   blocks without splitting  n0 = B * H_kv * row_tiles
///   resident slots            R = SMs * resident_blocks(type, d bucket)
///   min keys                  kIdleMinKeysPerSplit (64) if n0 splits of
///                             kMinKeysPerSplit (256) keys would occupy at most
///                             kIdleShare of the SMs (idle_grid), else 256
///   cap                       min(ceil(Nk / min keys), kShortSplitCap),
///                             or ceil(Nk / kMinKeysPastShortCap) if more,
///                             at most kMaxSplits (split_cap); wide with
///                             n0 >= kFullGrid SMs: at most
///                             ceil(Nk / kWideSecondBlockKeys)
///   n0 >= kFullGrid R         1 split (the GPU is full already)
///   n0 cap <= R               cap splits (one wave holds them all)
///   otherwise                 for S = 1 .. cap, dealt out as S' splits:
///                             fill(S) = n0 S' / (R ceil(n0 S' / R)), the
///                             waves' mean fullness; the fewest S' with
///                             fill >= kWaveFill * the best fill
///
/// then the keys are dealt out in whole tiles (keys_per_split), so no split is
/// empty. A decode of B * H_kv = 8 heads at Nk = 32k in 16 bits at d = 128
/// on 132 SMs (R = 264, cap 128): 31 splits of 1,088 keys, 248 blocks, one
/// wave 94 % full (the former rule, 4 blocks an SM wanted: 64 splits, 512
/// blocks); 32 K/V heads, 8 splits, 256 blocks (it took 17, 544 blocks, 2.06
/// waves); 256 K/V heads: 1 split. A prefill (many rows) gets 1 split. With
/// `split` false (the one-block contrast) it is 1. With `paged` (a paged KV
/// cache) the keys are dealt out in granules of kPageKeyMultiple. With
/// `wide` (the Hopper kernel, wide_group) blocks take kWideRows rows, an
/// SM holds kWideResidentBlocks, and where n0 is at least kFullGrid SMs
/// a split has at least kWideSecondBlockKeys keys.
inline Plan make_plan(const Problem& p, int sm_count, bool split = true, bool paged = false,
                      bool wide = false) {
  const std::int64_t granule = key_granule(paged);
  Plan plan;
  plan.group_rows = p.group() * p.Nq;
  plan.tile_rows = wide ? kWideRows : kRows;
  plan.row_tiles = (plan.group_rows - 1) / plan.tile_rows + 1;
  const std::int64_t n0 = p.B * p.kv_heads() * plan.row_tiles;
  const std::int64_t slots =
      static_cast<std::int64_t>(sm_count) *
      (wide ? kWideResidentBlocks : resident_blocks(p.dtype, head_dim_bucket(p.d)));
  std::int64_t cap = split ? split_cap(p, min_keys_per_split(p, n0, sm_count)) : 1;
  if (wide && n0 >= kFullGrid * sm_count) cap = std::min(cap, (p.Nk - 1) / kWideSecondBlockKeys + 1);
  std::int64_t splits = 1;
  if (cap > 1 && n0 < kFullGrid * slots) {
    if (n0 * cap <= slots) {
      splits = cap;
    } else {
      auto fill = [&](std::int64_t s) {  // the waves' fullness of s splits, as dealt out
        const std::int64_t blocks = n0 * ((p.Nk - 1) / keys_per_split(p.Nk, s, granule) + 1);
        return static_cast<double>(blocks) / static_cast<double>(slots * ((blocks - 1) / slots + 1));
      };
      double best = 0.0;
      for (std::int64_t s = 1; s <= cap; ++s) best = std::max(best, fill(s));
      splits = cap;
      for (std::int64_t s = 1; s <= cap; ++s) {
        if (fill(s) >= kWaveFill * best) {
          splits = s;
          break;
        }
      }
    }
  }
  plan.keys_per_split = keys_per_split(p.Nk, splits, granule);
  plan.splits = (p.Nk - 1) / plan.keys_per_split + 1;
  return plan;
}

/// The most splits make_plan gives p on any GPU of up to kMaxSmCount SMs (the
/// workspace's size), in either layout (kRows or, for a wide group,
/// kWideRows a block): the cap of the shortest splits, or 1 where n0 fills
/// such a GPU already.
inline std::int64_t max_splits(const Problem& p) {
  const std::int64_t group_rows = p.group() * p.Nq;
  auto fills = [&](std::int64_t tile_rows, int resident) {  // n0 fills the grid unsplit
    const std::int64_t n0 = p.B * p.kv_heads() * ((group_rows - 1) / tile_rows + 1);
    return n0 >= kFullGrid * static_cast<std::int64_t>(kMaxSmCount) * resident;
  };
  const bool narrow_fills = fills(kRows, resident_blocks(p.dtype, head_dim_bucket(p.d)));
  const bool wide_fills = !wide_group(p.dtype, head_dim_bucket(p.d), group_rows) ||
                          fills(kWideRows, kWideResidentBlocks);
  return narrow_fills && wide_fills ? 1 : split_cap(p, kIdleMinKeysPerSplit);
}

/// Whether the host's models (the cost model, the CPU mirror: an H200 with
/// aligned tensors) plan p in the Hopper kernel's layout.
inline bool model_wide(const Problem& p) {
  return wide_group(p.dtype, head_dim_bucket(p.d), p.group() * p.Nq);
}

/// Blocks of the merge kernel: kMergeWarps / merge_warps rows a block.
inline std::int64_t merge_blocks(const Problem& p, const Plan& plan) {
  const std::int64_t rows_per_block = kMergeWarps / merge_warps(plan.splits, head_dim_bucket(p.d));
  return std::min((p.heads() * p.Nq - 1) / rows_per_block + 1, kMaxGridX);
}
/// Thread blocks a run launches: the split kernel's grid (row tiles x splits
/// by B * H_kv, each capped at CUDA's limit, the blocks then walking the rest)
/// and, with more than one split, the merge kernel's (merge_blocks).
inline std::int64_t thread_blocks(const Problem& p, const Plan& plan) {
  const std::int64_t split = std::min(plan.row_tiles * plan.splits, kMaxGridX) *
                             std::min(p.B * p.kv_heads(), kMaxGridY);
  return split + (plan.splits > 1 ? merge_blocks(p, plan) : 0);
}

/// Keys query row i (0..Nq-1) may see in a sequence of nk keys: nk, or with
/// the causal mask (bottom-right: the queries are the sequence's last Nq
/// positions) i + nk - Nq + 1, clamped to 0..nk. Problem::visible_keys with
/// a per-sequence length, for the KV cache.
FLASHSTEP_HOST_DEVICE inline std::int64_t visible_keys(std::int64_t i, std::int64_t Nq,
                                                       std::int64_t nk, bool causal) {
  if (!causal) return nk;
  const std::int64_t v = i + nk - Nq + 1;
  return v < 0 ? 0 : (v > nk ? nk : v);
}

/// Where a KV cache keeps its keys (and values, in the same layout).
///
///   contiguous  [B, H_kv, Nk, d]: key j of K/V head kvh (of B H_kv) is row
///               kvh Nk + j
///   paged       [pages, H_kv, page_keys, d], a pool of pages, with
///               block_table [B, pages_per_seq]: key j of sequence b is slot
///               j % page_keys of page block_table[b][j / page_keys]
///
/// The paged layout is the one serving engines use (vLLM's PagedAttention,
/// flash_attn_with_kvcache's block_table): a sequence grows by whole pages
/// taken from a shared pool, so no sequence reserves its full capacity.
/// Inside a page each K/V head's keys are contiguous ([H_kv, page_keys, d],
/// where FlashAttention keeps [page_keys, H_kv, d]): a K/V tile of one head
/// is then one contiguous block, as in the contiguous cache, and the split
/// kernels copy it with the same loaders. Capacity (Problem::Nk) is
/// pages_per_seq page_keys.
struct CacheLayout {
  const std::int32_t* block_table = nullptr;  ///< [B, pages_per_seq]; null: contiguous
  std::int64_t pages_per_seq = 0;             ///< pages of one sequence's table
  std::int64_t page_keys = 0;                 ///< keys a page holds, a multiple of kPageKeyMultiple
};

/// The cache row (in units of d elements) of key `key` of K/V head kvh (of
/// B * H_kv, H_kv heads a sequence, capacity Nk), in either layout. The
/// paged lookup divides in 32 bits (validate_kvcache keeps B * H_kv and Nk
/// below 2^31): the split kernels look a page up once per K/V tile in every
/// thread, and a 64-bit division is several times the instructions.
FLASHSTEP_HOST_DEVICE inline std::int64_t cache_row(const CacheLayout& c, std::int64_t kvh,
                                                    std::int64_t H_kv, std::int64_t Nk,
                                                    std::int64_t key) {
  if (!c.block_table) return kvh * Nk + key;
  const auto head = static_cast<std::uint32_t>(kvh), heads = static_cast<std::uint32_t>(H_kv);
  const auto k = static_cast<std::uint32_t>(key);
  const auto page_keys = static_cast<std::uint32_t>(c.page_keys);
  const std::int64_t page = c.block_table[(head / heads) * c.pages_per_seq + k / page_keys];
  return (page * H_kv + head % heads) * c.page_keys + k % page_keys;
}

/// The K/V heads (B * H_kv) a paged cache may hold: cache_row's 32 bits.
inline constexpr std::int64_t kMaxPagedHeads = std::int64_t{1} << 31;

/// Checks the arguments of a KV-cache forward (split_kv.h's forward_kvcache
/// and mirror_kvcache with a KvCache) that the host can see, one clear error
/// each: the cache's own K and V (t_K, t_V null, so a call names one cache),
/// its seqlens, new keys and values together, and the layout: a paged
/// cache's pages a multiple of kPageKeyMultiple keys and as many as make
/// the capacity p.Nk. Device data (the lengths, the block table's page
/// numbers) is the caller's to keep in range, as with FlashAttention's.
inline void validate_kvcache(const Problem& p, const void* t_K, const void* t_V, const void* K,
                             const void* V, const void* seqlens, const CacheLayout& layout,
                             const void* K_new, const void* V_new) {
  if (t_K || t_V) {
    throw Error("stage 09: forward_kvcache reads K and V from the cache; the tensors' K and V "
                "must be null");
  }
  if (!K || !V) throw Error("stage 09: null cache K or V");
  if (!seqlens) throw Error("stage 09: null cache_seqlens");
  if ((K_new == nullptr) != (V_new == nullptr)) {
    throw Error("stage 09: K_new and V_new go together (both, or neither)");
  }
  if (!layout.block_table) {
    if (layout.pages_per_seq != 0 || layout.page_keys != 0) {
      throw Error("stage 09: pages_per_seq and page_keys without a block table");
    }
    return;
  }
  if (layout.page_keys < kPageKeyMultiple || layout.page_keys % kPageKeyMultiple != 0) {
    throw Error("stage 09: page_keys " + std::to_string(layout.page_keys) +
                " must be a positive multiple of " + std::to_string(kPageKeyMultiple) +
                " (no K/V tile may straddle two pages)");
  }
  if (p.B * p.kv_heads() >= kMaxPagedHeads) {
    throw Error("stage 09: a paged cache of B * H_kv = " + std::to_string(p.B * p.kv_heads()) +
                " K/V heads; at most " + std::to_string(kMaxPagedHeads - 1) +
                " (cache_row divides in 32 bits)");
  }
  if (layout.pages_per_seq < 1 || p.Nk % layout.page_keys != 0 ||
      layout.pages_per_seq != p.Nk / layout.page_keys) {  // divided: no product to overflow
    throw Error("stage 09: pages_per_seq " + std::to_string(layout.pages_per_seq) +
                " x page_keys " + std::to_string(layout.page_keys) + " must be the capacity Nk " +
                std::to_string(p.Nk));
  }
}

/// Query head bh (of B * H) of row g of K/V head kvh's group (kvh of B * H_kv):
/// the inverse of kv_head_of.
FLASHSTEP_HOST_DEVICE inline std::int64_t query_head(std::int64_t kvh, std::int64_t g,
                                                     std::int64_t H, std::int64_t H_kv) {
  return (kvh / H_kv) * H + (kvh % H_kv) * (H / H_kv) + g;
}

}  // namespace flashstep::split_kv
