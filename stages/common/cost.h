/// \file cost.h
/// \brief What a stage moves and computes: the type of every stage's model
/// (closed form) and of every CPU mirror's counters (counted while it runs).
///
/// Conventions, shared by every model and mirror so that their numbers compare:
/// - HBM bytes are the global-memory bytes the algorithm asks for: every element
///   a kernel loads from or stores to an input/output/workspace array, as the
///   algorithm's tiling dictates. Re-reads that the L2 cache may serve still
///   count: the measured DRAM bytes (ncu) are at most this, and the gap is L2's.
/// - SRAM bytes are shared-memory (on-chip tile buffer) element reads and writes
///   the algorithm names: writing a tile in counts once per element, and each
///   element a computation reads from a tile buffer counts once per use
///   at the granularity the model states (see each stage's model).
/// - Matmul FLOPs are the 2*M*N*K of the products Q K^T and P V (only the tiles
///   actually computed); non-matmul FLOPs are every other arithmetic operation
///   on scores, probabilities and outputs (scale, max, exp, add, multiply, divide,
///   log), one per elementwise operation.
/// - Thread blocks: how many the stage launches (summed over its kernels).
#pragma once

#include <cstdint>

namespace flashstep {

/// Traffic and FLOPs of one forward run. Integer counts, so that a mirror's
/// tally and a model's closed form can be compared exactly.
struct Cost {
  std::int64_t hbm_read_bytes = 0;    ///< global-memory bytes loaded
  std::int64_t hbm_write_bytes = 0;   ///< global-memory bytes stored
  std::int64_t sram_read_bytes = 0;   ///< shared-memory bytes read
  std::int64_t sram_write_bytes = 0;  ///< shared-memory bytes written
  std::int64_t matmul_flops = 0;      ///< 2*M*N*K of Q K^T and P V
  std::int64_t nonmatmul_flops = 0;   ///< everything else
  std::int64_t thread_blocks = 0;     ///< thread blocks launched
  std::int64_t skipped_tiles = 0;     ///< (Qi, Kj) tile pairs skipped as wholly masked
  /// Block-wide barriers executed, summed over thread blocks. Modelled by
  /// stage 06, where split-K's extra synchronisation is the lesson, and by
  /// stage 07's backward, whose barriers per Q block depend on d (one or
  /// two: ds_tiles, warp_tile_2d); 0 in the other stages means "not
  /// modelled" (their kernels do synchronise).
  std::int64_t barriers = 0;
  /// Scores whose visibility is tested one by one (the causal mask and the
  /// ends Nq, Nk), valid ones only: FlashAttention-2 tests only the tiles that
  /// cross the diagonal or an end (common/tile_mask.h). Counted by the fp32
  /// tiled stages (03-06 and stage 05's backward); 0 elsewhere means "not modelled".
  std::int64_t mask_tests = 0;

  std::int64_t hbm_bytes() const { return hbm_read_bytes + hbm_write_bytes; }

  /// The counts of n copies of this work (one head's, scaled to B * H heads):
  /// every field times n. A model then sets thread_blocks to what its launch has.
  Cost times(std::int64_t n) const {
    Cost c;
    c.hbm_read_bytes = n * hbm_read_bytes;
    c.hbm_write_bytes = n * hbm_write_bytes;
    c.sram_read_bytes = n * sram_read_bytes;
    c.sram_write_bytes = n * sram_write_bytes;
    c.matmul_flops = n * matmul_flops;
    c.nonmatmul_flops = n * nonmatmul_flops;
    c.thread_blocks = n * thread_blocks;
    c.skipped_tiles = n * skipped_tiles;
    c.barriers = n * barriers;
    c.mask_tests = n * mask_tests;
    return c;
  }
  std::int64_t sram_bytes() const { return sram_read_bytes + sram_write_bytes; }

  Cost& operator+=(const Cost& o) {
    hbm_read_bytes += o.hbm_read_bytes;
    hbm_write_bytes += o.hbm_write_bytes;
    sram_read_bytes += o.sram_read_bytes;
    sram_write_bytes += o.sram_write_bytes;
    matmul_flops += o.matmul_flops;
    nonmatmul_flops += o.nonmatmul_flops;
    thread_blocks += o.thread_blocks;
    skipped_tiles += o.skipped_tiles;
    barriers += o.barriers;
    mask_tests += o.mask_tests;
    return *this;
  }
  bool operator==(const Cost& o) const {
    return hbm_read_bytes == o.hbm_read_bytes && hbm_write_bytes == o.hbm_write_bytes &&
           sram_read_bytes == o.sram_read_bytes && sram_write_bytes == o.sram_write_bytes &&
           matmul_flops == o.matmul_flops && nonmatmul_flops == o.nonmatmul_flops &&
           thread_blocks == o.thread_blocks && skipped_tiles == o.skipped_tiles &&
           barriers == o.barriers && mask_tests == o.mask_tests;
  }
  bool operator!=(const Cost& o) const { return !(*this == o); }
};

}  // namespace flashstep
