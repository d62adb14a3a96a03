/// \file hopper_tiles.h
/// \brief Stage 08's ablation steps and tile shapes, shared by the kernel
/// (hopper.cuh), the launchers, the model and the CPU mirror. CUDA-free.
#pragma once

#include <cstdint>
#include <string_view>

#include "common/host_device.h"

namespace flashstep::hopper {

/// The ablation ladder of FlashAttention-3's ideas. Every step keeps the
/// previous steps' ideas.
enum class Step : int {
  /// wgmma.mma_async for S = Qi Kj^T (A and B from shared memory) and
  /// O~ += P~ Vj (P~ from registers, V through a transposed descriptor),
  /// each waited for at once; tiles copied in by the threads with ordinary
  /// loads and stores into the 128-byte-swizzled layout wgmma reads.
  kWgmmaSync = 1,
  /// + TMA: Qi, Kj and Vj brought in by cp.async.bulk.tensor, kStages
  ///   buffers deep, each completing on an mbarrier; K/V tile j - 1 lands
  ///   while tile j computes.
  kTmaPipeline = 2,
  /// + warp specialization (FlashAttention-3 §3.1): a producer warpgroup,
  ///   one thread of which issues every TMA copy, gives registers away
  ///   (setmaxnreg.dec); two consumer warpgroups of 64 rows each (three at
  ///   d = 64: consumer_warpgroups) take them (setmaxnreg.inc) and run the
  ///   products and the softmax. Buffers are handed over by full and empty
  ///   mbarriers, never by a block barrier.
  kWarpSpecialized = 3,
  /// + ping-pong (FlashAttention-3 §3.1): the consumer warpgroups take
  ///   turns on the tensor cores, a token passed round them on named
  ///   barriers once per K/V tile: in its turn a consumer issues both
  ///   products of an iteration back to back, S_j = Qi K_j^T and
  ///   O~ += P~_{j+1} V_{j+1}, passes the token on, and waits for both; its
  ///   softmax runs while the others' products do.
  kPingPong = 4,
  /// + intra-warpgroup overlap (FlashAttention-3 §3.2, Algorithm 2): each
  ///   consumer waits for S_j alone and runs its softmax while its own
  ///   O~ += P~_{j+1} V_{j+1} is still in flight; O~'s rescale waits for it.
  ///   At d = 64 its three consumers take no turns (hopper.cuh, kTurns).
  kIntraOverlap = 5,
};

constexpr std::string_view step_slug(Step step) {
  switch (step) {
    case Step::kWgmmaSync: return "step1_wgmma_sync";
    case Step::kTmaPipeline: return "step2_tma_pipeline";
    case Step::kWarpSpecialized: return "step3_warp_specialized";
    case Step::kPingPong: return "step4_ping_pong";
    case Step::kIntraOverlap: break;
  }
  return "step5_intra_overlap";
}

/// Threads per warpgroup, and per block in steps 1-2.
inline constexpr int kThreads = 128;

/// Consumer warpgroups per block: one in steps 1-2 (which it shares with the
/// copies); from step 3, beside the producer warpgroup, as FlashAttention-3
/// runs them (its hopper/tile_size.h): three at d = 64, blocks of 192 rows,
/// so that each K/V tile, copied and handed over once, serves 192 rows of Q
/// (a consumer's S, P~ and O~ at d = 64, 128 fp32 and packed registers,
/// fit the 160 three consumers can take); two at d = 128 and 256, whose O~
/// of 64 or 128 registers needs the 232 two can take.
constexpr int consumer_warpgroups(Step step, int head_dim_bucket) {
  if (step < Step::kWarpSpecialized) return 1;
  return head_dim_bucket <= 64 ? 3 : 2;
}
/// Whether, from step 3, a consumer under a causal mask hands over unread the
/// first K/V tiles of an item that lie wholly above its own 64 rows'
/// diagonal, though not the block's last row's (hopper.cuh, skip_tiles),
/// and computes on the rest only. At d = 64 only: there it drops one tile an
/// item for consumer 0 of every block and consumer 1 of every other, and
/// stage 08 ran in ×0.980 main's median time at N = 2048, B = 8, H = 32, causal (×0.993
/// at 4096, ×0.999 at 8192; H200, bf16, tuning_08 `skip_kahead_ab.txt`). At d = 128
/// it skips nothing with Nq = Nk, yet its extra code cost 3 % even without
/// a mask (×1.029-1.032), so d = 128 and 256 keep the loop that computes on
/// the block's whole range.
constexpr bool consumers_skip_tiles(Step step, int head_dim_bucket) {
  return step >= Step::kWarpSpecialized && head_dim_bucket <= 64;
}
/// Whether, from step 3, the producer copies Kj ahead of Vj as
/// FlashAttention-3's load does (hopper.cuh, produce): an item's first Kj
/// before its Qi, and in steps 4-5 K_{j-1} before V_j. At d = 64 only: with
/// skip_tiles, stage 08 ran in ×0.978-0.997 main's time under a causal mask and
/// ×0.980 without one (N = 4096, B = 4), against ×1.004 for skip_tiles
/// alone; at d = 128 the pair cost 2 % (×1.023-1.024; H200, bf16,
/// tuning_08 `skip_kahead_ab.txt`), so d = 128 and 256 copy Kj, Vj, Kj-1 in order.
constexpr bool producer_copies_k_ahead(Step step, int head_dim_bucket) {
  return step >= Step::kWarpSpecialized && head_dim_bucket <= 64;
}
/// Whether, from step 3, a causal problem's items are handed out as
/// FlashAttention-3's DynamicPersistentTileScheduler hands them
/// (hopper/tile_scheduler.hpp): one item (a Q block of one head) at a time,
/// heaviest first within sections of lpt_section_heads heads, each block
/// taking the next from a counter in global memory as it starts its current
/// one (hopper.cuh, LptCursor), so that the blocks that drew light items
/// take more of them and the lightest fill the tail (longest processing time
/// first). The fixed share of equal pairs (ws_schedule) leaves a tail when
/// the units are not a multiple of the blocks, and the dynamic order
/// shortens it (a model of a block's time as its items' tiles plus one tile
/// an item, at the paper's d = 64 shapes on 132 SMs:
/// docs/results/tuning_08/lpt_schedule_model.py). Timed on an H200
/// (docs/results/tuning_08/lpt_ab.txt) it was faster under a causal mask
/// and slower without one (all its items the same work, only the hand-over
/// added) and at d = 128: so only a causal problem at d = 64 runs this
/// order's kernel (WsLptConfig), every other main's (WsConfig).
constexpr bool lpt_schedule(Step step, int head_dim_bucket) {
  return step >= Step::kWarpSpecialized && head_dim_bucket <= 64;
}
/// Query heads per section of the dynamic order: FlashAttention-3's, the
/// largest power of two of K/V heads whose K and V (Nk x (d + d) 16-bit
/// elements a head) fit the 32 MiB of L2 it sets aside for them, at least
/// one, times the `group` query heads that share each K/V head (its
/// qhead_per_khead). The blocks running at once then share a section's K and
/// V in L2 (items numbered across all heads read them from HBM: tuning_08,
/// A/B 2).
inline constexpr std::int64_t kLptL2Bytes = std::int64_t{32} * 1024 * 1024;
constexpr std::int64_t lpt_section_heads(std::int64_t Nk, std::int64_t d, std::int64_t group) {
  const std::int64_t kv_head_bytes = Nk * 2 * d * 2;
  std::int64_t kv_heads = 1;
  while (2 * kv_heads * kv_head_bytes <= kLptL2Bytes) kv_heads *= 2;
  return kv_heads * group;
}
/// Item `unit` of the dynamic order (hopper.cuh, LptCursor): its head and its
/// rank (Q blocks counted from the last, the heaviest under a causal mask),
/// for Tr Q blocks a head: sections of section_heads heads one after another
/// (the last may hold fewer), within one rank by rank, head by head within a
/// rank (FlashAttention-3's DynamicPersistentTileScheduler::get_block_coord).
struct LptPlace {
  int head;
  int rank;
};
FLASHSTEP_HOST_DEVICE constexpr LptPlace lpt_place(int unit, int Tr, int heads,
                                                   int section_heads) {
  const int section_items = section_heads * Tr;
  const int section = unit / section_items;
  const int first_head = section * section_heads;
  const int in_section = unit - section * section_items;
  const int section_size = heads - first_head < section_heads ? heads - first_head : section_heads;
  const int rank = in_section / section_size;
  return {first_head + in_section - rank * section_size, rank};
}

/// Threads per block from step 3: the producer and the consumer warpgroups.
constexpr int ws_threads(int consumers) { return (1 + consumers) * kThreads; }
/// Registers per thread after setmaxnreg (step 3), FlashAttention-3's splits
/// of the SM's 65536 at one block per SM. Two consumers: the producer keeps
/// 40, they take 232 (40 x 128 + 2 x 232 x 128 = 64512); with 24 the
/// producer's copy loop spilled at d = 128 and 256. Three (d = 64): 32 and
/// 160 (32 x 128 + 3 x 160 x 128 = 65536); 40 and 152 would spill step 5's
/// consumer, and ptxas then serializes its wgmma. The producer fits 32 with
/// its K/V loop kept rolled (produce).
constexpr int producer_regs(int consumers) { return consumers == 2 ? 40 : 32; }
constexpr int consumer_regs(int consumers) { return consumers == 2 ? 232 : 160; }

/// Rows of Q per consumer warpgroup: one m64 wgmma tall. A block holds
/// consumer_warpgroups(step, d bucket) x kBr rows of Q (the paper's Br).
inline constexpr int kBr = 64;
/// Keys per K/V tile (the paper's Bc) of a head-dimension bucket, every step
/// alike; S = Qi Kj^T is one m64nBck16 wgmma chain wide, and O~ += P~ Vj a
/// chain of Bc / 16 k16 steps. FlashAttention-3's choices (its
/// hopper/tile_size.h), for the same reason: each product must be long
/// enough for ping-pong and the in-consumer overlap to hide a softmax under.
/// - d = 64 and 128: 128 keys, m64n128k16 for S. A consumer thread holds S
///   (64 fp32), P~ (32 packed) and O~ (32 or 64 fp32) inside its 160 or 232
///   registers; two buffers of Kj and Vj take 64 or 128 KiB beside Qi's 24
///   or 32 KiB (three or two consumers' 64 rows).
/// - d = 256: 64 keys, m64n64k16. O~ alone is 128 registers, and S of 128
///   keys beside it would leave the softmax none; two buffers of 128-key
///   Kj and Vj would take 256 KiB, more than the 227 KiB a block may have.
constexpr int key_tile(int head_dim_bucket) { return head_dim_bucket <= 128 ? 128 : 64; }
/// Columns of O~ per wgmma of O~ += P~ Vj, for a head-dimension bucket: all
/// of d up to 128 (m64n64k16 at d = 64, m64n128k16 at d = 128, as
/// FlashAttention-3 takes n = d): the wider the instruction, the fewer of
/// them and the fewer times P~'s A registers are passed. At d = 256 two
/// chains of n128: the same registers as one n256, with half the operands
/// in one asm statement.
constexpr int out_tile(int head_dim_bucket) {
  return head_dim_bucket < 128 ? head_dim_bucket : 128;
}
/// Whether O_i leaves through shared memory and a TMA store (from step 3,
/// FlashAttention-3's epilogue: a consumer writes its rows into a buffer of
/// its own, one thread hands it to TMA, and the consumer goes on to its next
/// item without waiting for the global writes) rather than straight from the
/// registers. The buffer cannot be Qi's, which the producer refills with the
/// next item's rows once the last S is in; a buffer of its own, each
/// consumer's 64 rows, fits beside Qi and the K/V buffers at d = 64 and 128
/// (24 and 32 KiB more), not at d = 256 (64 KiB more would pass 227 KiB):
/// there O_i is stored from the registers.
constexpr bool output_through_smem(Step step, int head_dim_bucket) {
  return step >= Step::kWarpSpecialized && head_dim_bucket <= 128;
}
/// K/V buffers of the TMA pipeline (step 2): two, so that the next tile's
/// copy runs under this tile's products and softmax. At d = 256 two stages
/// of Kj and Vj (64 keys) take 128 KiB beside the two consumers' 64 KiB of
/// Qi, inside the 227 KiB a block may have; at d = 128, 128 KiB (128 keys)
/// beside 32 KiB.
inline constexpr int kStages = 2;

/// How steps 3-5 share out their work: units numbered head by head, taken
/// by a persistent grid (one block per SM, block b taking units b,
/// b + blocks, ...: its next unit's Qi and first K/V tiles are copied while
/// it finishes the last). Without a causal mask a unit is one item (a Q block
/// of one head), all the same work. Under a causal mask item rank r (Q blocks
/// counted from the last) sees Tr - r K/V blocks' worth of keys, and a unit
/// is the pair of ranks r and Tr - 1 - r of one head, Tr + 1 blocks' worth
/// whichever r: the units are again the same work, and a fixed share of them
/// per block is balanced. (FlashAttention-3 instead hands items out heaviest
/// first, rank-major within groups of heads whose K and V fit in L2, from an
/// atomic counter; taken in a fixed stride, that order gives the first
/// blocks of every round of the grid the heavier items of that round, round
/// after round.) With Tr odd the middle item of each head is left alone;
/// those units, half the work of a pair, are numbered after all pairs, so
/// that they fill the tail. Head by head, the blocks running at once hold
/// units of a few heads and share their Kj and Vj in L2: numbered across
/// all heads, they read K and V from HBM (docs/results/tuning_08/, A/B 2).
/// At d = 64 (lpt_schedule) a causal problem is handed out from a counter
/// instead (WsLptConfig), which leaves no such round-by-round bias.
struct WsSchedule {
  std::int64_t units_per_head;  // of the first paired_units
  std::int64_t paired_units;    // units per head x heads
  std::int64_t units;           // + the causal middle items, one a head
};
constexpr WsSchedule ws_schedule(std::int64_t Tr, std::int64_t heads, bool causal) {
  const std::int64_t per_head = causal ? Tr / 2 : Tr;
  const std::int64_t middles = causal && Tr % 2 == 1 ? heads : 0;
  return {per_head, per_head * heads, per_head * heads + middles};
}

/// log2(e) and ln(2), as in stage 07: exponentials as exp2, scale folded in.
inline constexpr double kLog2e = 1.4426950408889634;
inline constexpr double kLn2 = 0.6931471805599453;

}  // namespace flashstep::hopper
