/// \file tile_mask.h
/// \brief How a tile of scores meets the mask, the lesson of FlashAttention-2
/// §3.1 ("Causal masking"): a tile wholly above the diagonal is skipped, a
/// tile wholly below it needs no per-element test, and only the tiles that
/// cross it (or the ends Nq, Nk of a ragged problem) test every score. Shared
/// by the fp32 tiled kernels (stages 03-06 and stage 05's backward), their CPU
/// mirrors and their models; CUDA-free, callable from host and device code.
///
/// Score (r, c) of query row r and key c is *visible* when both are real
/// (r < Nq, c < Nk) and, with the causal mask aligned bottom-right as in
/// Problem::visible_keys, c <= r + Nk - Nq. A kernel computes whole tiles,
/// padding rows and keys included; those are never visible.
#pragma once

#include <cstdint>

#include "host_device.h"

namespace flashstep {

/// How much of a tile the mask hides.
enum class TileMask {
  kNone,     ///< every score visible: no per-element test
  kPartial,  ///< some visible: each score tested (the diagonal, the ends Nq and Nk)
  kAll,      ///< none visible: skipped, or every score tested when not skipped
};

/// How a causal forward treats its tiles. Users get kFast; the other two exist
/// for the benchmark (tests/bench/causal.cpp) to measure what each half of
/// FlashAttention-2's lesson is worth, and give the same O and L bit for bit.
enum class CausalMode {
  kFast,       ///< skip kAll tiles, test only kPartial ones (FlashAttention-2)
  kNoSkip,     ///< skipping off: visit every tile; kAll ones are tested
  kMaskEvery,  ///< diagonal-only masking off: test every score of every visited tile
};

/// Which rows see which keys: the problem's lengths and whether it is causal.
struct MaskShape {
  std::int64_t Nq = 1;  ///< query rows
  std::int64_t Nk = 1;  ///< keys
  bool causal = false;  ///< bottom-right aligned causal mask
};

/// The tile of query rows [row0, row0 + br) and keys [key0, key0 + bc)
/// (br, bc >= 1; row0 < Nq and key0 < Nk: the tile has a real row and key).
FLASHSTEP_HOST_DEVICE constexpr TileMask tile_mask(const MaskShape& s, std::int64_t row0,
                                                   std::int64_t br, std::int64_t key0,
                                                   std::int64_t bc) {
  // Bottom-right: the last real row sees the most keys, the first row the fewest.
  const std::int64_t last_row = row0 + br <= s.Nq ? row0 + br - 1 : s.Nq - 1;
  const std::int64_t shift = s.Nk - s.Nq;
  if (s.causal && key0 > last_row + shift) return TileMask::kAll;
  const bool padded = row0 + br > s.Nq || key0 + bc > s.Nk;
  if (padded || (s.causal && key0 + bc - 1 > row0 + shift)) return TileMask::kPartial;
  return TileMask::kNone;
}

/// K/V tiles of bc keys, from the first, that rows [row0, row0 + br) see
/// whole: tile_mask is kNone for K/V tiles j < this and for no later one.
FLASHSTEP_HOST_DEVICE constexpr std::int64_t unmasked_kv_tiles(const MaskShape& s,
                                                               std::int64_t row0,
                                                               std::int64_t br,
                                                               std::int64_t bc) {
  if (row0 + br > s.Nq) return 0;  // padding rows: every tile has hidden scores
  // Keys the first row sees (bottom-right: every later row sees them too).
  std::int64_t seen = s.Nk;
  if (s.causal) {
    const std::int64_t first = row0 + s.Nk - s.Nq + 1;
    seen = first < 0 ? 0 : first < s.Nk ? first : s.Nk;
  }
  return seen / bc;
}

/// Q tiles of br rows, [first, last), that see keys [key0, key0 + bc) whole:
/// tile_mask is kNone exactly for the Q tiles first <= i < last (none when
/// last <= first). A K/V-outer loop (stage 05's backward) walks Q tiles.
struct TileRange {
  std::int64_t first = 0;  ///< first Q tile that sees the keys whole
  std::int64_t last = 0;   ///< one past the last
};
FLASHSTEP_HOST_DEVICE constexpr TileRange unmasked_q_tiles(const MaskShape& s, std::int64_t key0,
                                                           std::int64_t bc, std::int64_t br) {
  if (key0 + bc > s.Nk) return {0, 0};  // padding keys
  // Row r sees the tile's last key iff r >= key0 + bc - 1 - (Nk - Nq).
  const std::int64_t need = s.causal ? key0 + bc - 1 - (s.Nk - s.Nq) : 0;
  const std::int64_t first = need <= 0 ? 0 : (need + br - 1) / br;
  return {first, s.Nq / br};  // only whole Q tiles: a ragged last one has padding rows
}

}  // namespace flashstep
