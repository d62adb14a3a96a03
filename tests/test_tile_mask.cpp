// The tile classification of common/tile_mask.h against brute force: every
// score of every tile tested one by one with Problem::visible_keys, over many
// (Nq, Nk, Br, Bc), causal and not, ragged ends and rows that see no key.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include "common/problem.h"
#include "common/tile_mask.h"
#include "shapes.h"

using flashstep::MaskShape;
using flashstep::Problem;
using flashstep::TileMask;

namespace {

// Visible scores of the tile, counted one by one; rows past Nq and keys past
// Nk are padding and never visible.
std::int64_t visible_scores(const Problem& p, std::int64_t row0, std::int64_t br,
                            std::int64_t key0, std::int64_t bc) {
  std::int64_t n = 0;
  for (std::int64_t r = row0; r < row0 + br && r < p.Nq; ++r) {
    for (std::int64_t c = key0; c < key0 + bc && c < p.Nk; ++c) n += c < p.visible_keys(r);
  }
  return n;
}

TileMask brute_force(const Problem& p, std::int64_t row0, std::int64_t br, std::int64_t key0,
                     std::int64_t bc) {
  const std::int64_t seen = visible_scores(p, row0, br, key0, bc);
  if (seen == 0) return TileMask::kAll;
  return seen == br * bc ? TileMask::kNone : TileMask::kPartial;
}

MaskShape shape_of(const Problem& p) { return {p.Nq, p.Nk, p.causal}; }

// Disagreements with brute force: how many, and the first one's description
// (millions of tiles: one doctest assertion each would be most of the time).
struct Mismatches {
  std::int64_t count = 0;
  std::string first;
  void add(bool agree, const Problem& p, const std::string& where) {
    if (agree) return;
    if (count++ == 0) first = p.describe() + ": " + where;
  }
};

std::string tile_name(std::int64_t row0, std::int64_t br, std::int64_t key0, std::int64_t bc) {
  return "rows " + std::to_string(row0) + "+" + std::to_string(br) + ", keys " +
         std::to_string(key0) + "+" + std::to_string(bc);
}

// Lengths around the tile sizes below, both ways of Nq != Nk, and ones.
const std::int64_t kLengths[] = {1, 2, 7, 16, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 200};
// Tile sizes the stages use (16-row warp slices, 32, 64, 128), and odd ones.
const std::int64_t kTiles[] = {1, 3, 16, 32, 64, 128};

}  // namespace

TEST_CASE("tile_mask agrees with testing every score of the tile, causal and not") {
  std::int64_t tiles = 0, partial = 0, all = 0;
  Mismatches wrong;
  for (std::int64_t Nq : kLengths) {
    for (std::int64_t Nk : kLengths) {
      for (bool causal : {false, true}) {
        const Problem p = flashstep::test::make_problem(1, 1, Nq, Nk, 1, causal);
        for (std::int64_t br : kTiles) {
          for (std::int64_t bc : kTiles) {
            for (std::int64_t row0 = 0; row0 < Nq; row0 += br) {
              for (std::int64_t key0 = 0; key0 < Nk; key0 += bc) {
                const TileMask want = brute_force(p, row0, br, key0, bc);
                wrong.add(flashstep::tile_mask(shape_of(p), row0, br, key0, bc) == want, p,
                          tile_name(row0, br, key0, bc));
                ++tiles;
                partial += want == TileMask::kPartial;
                all += want == TileMask::kAll;
              }
            }
          }
        }
      }
    }
  }
  CHECK_MESSAGE(wrong.count == 0, wrong.count << " tiles misclassified, first " << wrong.first);
  // The grid holds every kind, so the test cannot pass by always answering one.
  CHECK(tiles > 100000);
  CHECK(partial > 1000);
  CHECK(all > 1000);
  CHECK(tiles - partial - all > 1000);
}

TEST_CASE("unmasked_kv_tiles is the length of the run of kNone K/V tiles from the first") {
  Mismatches wrong;
  for (std::int64_t Nq : kLengths) {
    for (std::int64_t Nk : kLengths) {
      for (bool causal : {false, true}) {
        const Problem p = flashstep::test::make_problem(1, 1, Nq, Nk, 1, causal);
        for (std::int64_t br : kTiles) {
          for (std::int64_t bc : kTiles) {
            for (std::int64_t row0 = 0; row0 < Nq; row0 += br) {
              const std::int64_t n = flashstep::unmasked_kv_tiles(shape_of(p), row0, br, bc);
              for (std::int64_t j = 0; j * bc < Nk; ++j) {
                wrong.add((brute_force(p, row0, br, j * bc, bc) == TileMask::kNone) == (j < n), p,
                          tile_name(row0, br, j * bc, bc));
              }
            }
          }
        }
      }
    }
  }
  CHECK_MESSAGE(wrong.count == 0, wrong.count << " disagreements, first " << wrong.first);
}

TEST_CASE("unmasked_q_tiles is exactly the Q tiles that see a K/V tile whole") {
  Mismatches wrong;
  for (std::int64_t Nq : kLengths) {
    for (std::int64_t Nk : kLengths) {
      for (bool causal : {false, true}) {
        const Problem p = flashstep::test::make_problem(1, 1, Nq, Nk, 1, causal);
        for (std::int64_t br : kTiles) {
          for (std::int64_t bc : kTiles) {
            for (std::int64_t key0 = 0; key0 < Nk; key0 += bc) {
              const flashstep::TileRange whole =
                  flashstep::unmasked_q_tiles(shape_of(p), key0, bc, br);
              for (std::int64_t i = 0; i * br < Nq; ++i) {
                wrong.add((brute_force(p, i * br, br, key0, bc) == TileMask::kNone) ==
                              (whole.first <= i && i < whole.last),
                          p, tile_name(i * br, br, key0, bc));
              }
            }
          }
        }
      }
    }
  }
  CHECK_MESSAGE(wrong.count == 0, wrong.count << " disagreements, first " << wrong.first);
}

TEST_CASE("tile_mask at the ends of the int64 problems the contract allows") {
  // Nq, Nk near 2^31: row0 + Nk and key0 + bc stay far inside int64.
  const std::int64_t big = 2147483647;
  const MaskShape square{big, big, true};
  CHECK(flashstep::tile_mask(square, big - 64, 64, big - 64, 64) == TileMask::kPartial);
  CHECK(flashstep::tile_mask(square, big - 64, 64, 0, 64) == TileMask::kNone);
  CHECK(flashstep::tile_mask(square, 0, 64, big - 64, 64) == TileMask::kAll);
  // One key, many rows (causal): only the last row sees it.
  const MaskShape one_key{big, 1, true};
  CHECK(flashstep::tile_mask(one_key, 0, 64, 0, 64) == TileMask::kAll);
  CHECK(flashstep::tile_mask(one_key, big - 1, 64, 0, 64) == TileMask::kPartial);
  CHECK(flashstep::unmasked_kv_tiles(one_key, big - 1, 1, 1) == 1);
  // The last 64 keys: only row big - 1 sees the last of them, and it sits in
  // the ragged last Q tile, so no Q tile sees them whole.
  const flashstep::TileRange last_keys = flashstep::unmasked_q_tiles(square, big - 64, 64, 64);
  CHECK(last_keys.first == (big - 1 + 63) / 64);
  CHECK(last_keys.last == big / 64);
  CHECK(last_keys.last <= last_keys.first);
}
