// Hopper's operand layouts (common/sm90_layout.h) against the PTX ISA's
// figures, and stage 08's use of them: the tiles it writes are the tiles its
// descriptors name, element for element. This is how the wgmma kernel's index
// arithmetic is checked without a GPU.
#include <doctest/doctest.h>

#include <cstdint>
#include <set>
#include <tuple>
#include <utility>

#include "08_hopper/hopper_tiles.h"
#include "common/sm90_layout.h"

namespace sm90 = flashstep::sm90;

TEST_CASE("wgmma accumulator layout: entries of the PTX ISA's m64nNk16 D figure") {
  // Figure "WGMMA .m64nNk16 register fragment layout for accumulator matrix D":
  // T0 holds d0, d1 at row 0, columns 0, 1 and d2, d3 at row 8; d4 starts
  // columns 8..; T1 columns 2, 3; T4 row 1; warp 1 (T32) starts at row 16.
  auto is = [](sm90::Coord c, int row, int col) { return c.row == row && c.col == col; };
  CHECK(is(sm90::accumulator_coord(0, 0), 0, 0));
  CHECK(is(sm90::accumulator_coord(0, 1), 0, 1));
  CHECK(is(sm90::accumulator_coord(0, 2), 8, 0));
  CHECK(is(sm90::accumulator_coord(0, 3), 8, 1));
  CHECK(is(sm90::accumulator_coord(0, 4), 0, 8));
  CHECK(is(sm90::accumulator_coord(1, 0), 0, 2));
  CHECK(is(sm90::accumulator_coord(4, 0), 1, 0));
  CHECK(is(sm90::accumulator_coord(31, 3), 15, 7));
  CHECK(is(sm90::accumulator_coord(32, 0), 16, 0));
  CHECK(is(sm90::accumulator_coord(127, 31), 63, 63));
  CHECK(is(sm90::accumulator_coord(127, 63), 63, 127));
  // Every element of a 64 x N accumulator held exactly once by 128 x N / 2
  // registers: n64 (O~'s column blocks, S at d = 256) and n128 (S at d <= 128).
  for (int N : {64, 128}) {
    CAPTURE(N);
    std::set<std::pair<int, int>> seen;
    for (int thread = 0; thread < sm90::kWarpgroupThreads; ++thread) {
      for (int reg = 0; reg < N / 2; ++reg) {
        const sm90::Coord c = sm90::accumulator_coord(thread, reg);
        REQUIRE(c.row < 64);
        REQUIRE(c.col < N);
        seen.insert({c.row, c.col});
      }
    }
    CHECK(seen.size() == 64u * static_cast<unsigned>(N));
  }
}

TEST_CASE("wgmma A in registers: the m64k16 figure, and P from the S accumulators") {
  auto is = [](sm90::Coord c, int row, int col) { return c.row == row && c.col == col; };
  // Figure "WGMMA .m64nNk16 register fragment layout for matrix A": T0 a0
  // holds (0, 0) and (0, 1), a1 (8, 0), a2 (0, 8), a3 (8, 8); T5 a0 (1, 2).
  CHECK(is(sm90::a_register_coord(0, 0, 0), 0, 0));
  CHECK(is(sm90::a_register_coord(0, 0, 1), 0, 1));
  CHECK(is(sm90::a_register_coord(0, 1, 0), 8, 0));
  CHECK(is(sm90::a_register_coord(0, 2, 0), 0, 8));
  CHECK(is(sm90::a_register_coord(0, 3, 1), 8, 9));
  CHECK(is(sm90::a_register_coord(5, 0, 0), 1, 2));
  CHECK(is(sm90::a_register_coord(64, 0, 0), 32, 0));
  // P's k16 block kk taken from S's registers: the same thread, the same
  // row, column 16 kk + the A column. So P never leaves the registers; kk
  // runs over the 8 k16 steps of a 128-key tile.
  for (int thread = 0; thread < sm90::kWarpgroupThreads; ++thread) {
    for (int kk = 0; kk < 8; ++kk) {
      for (int reg = 0; reg < 4; ++reg) {
        for (int e = 0; e < 2; ++e) {
          const sm90::Coord a = sm90::a_register_coord(thread, reg, e);
          const sm90::Coord s =
              sm90::accumulator_coord(thread, sm90::p_source_register(kk, reg, e));
          CHECK(s.row == a.row);
          CHECK(s.col == 16 * kk + a.col);
        }
      }
    }
  }
}

TEST_CASE("128-byte swizzle: the PTX ISA's pattern, and a permutation of each 1024-byte atom") {
  // Row r holds chunk c at chunk position c ^ (r % 8): row 1 is c1 c0 c3 c2 ...
  CHECK(sm90::swizzle128_offset(0, 0, 64) == 0);
  CHECK(sm90::swizzle128_offset(1, 0, 64) == 128 + 16);
  CHECK(sm90::swizzle128_offset(1, 8, 64) == 128 + 0);
  CHECK(sm90::swizzle128_offset(7, 0, 64) == 7 * 128 + 7 * 16);
  CHECK(sm90::swizzle128_offset(8, 0, 64) == 1024);
  CHECK(sm90::swizzle128_offset(3, 5, 64) == 3 * 128 + 3 * 16 + 10);
  // Column 64 starts the second column block, after all 64 rows of the first.
  CHECK(sm90::swizzle128_offset(0, 64, 64) == 64 * 128);
  std::set<int> offsets;
  for (int row = 0; row < 64; ++row) {
    for (int col = 0; col < 128; ++col) offsets.insert(sm90::swizzle128_offset(row, col, 64));
  }
  CHECK(offsets.size() == 64u * 128u);
  CHECK(*offsets.rbegin() == 64 * 128 * 2 - 2);
  // The 8 rows of an atom at one column fall in 8 different 16-byte bank groups.
  std::set<int> banks;
  for (int row = 0; row < 8; ++row) banks.insert(sm90::swizzle128_offset(row, 0, 64) % 128 / 16);
  CHECK(banks.size() == 8u);
}

TEST_CASE("matrix descriptor: the fields of the PTX ISA's format round-trip") {
  const std::uint64_t desc = sm90::make_descriptor(0x1A400, 16, 1024, sm90::Swizzle::k128B);
  CHECK((desc & 0x3FFF) == 0x1A40);
  CHECK((desc >> 16 & 0x3FFF) == 1);
  CHECK((desc >> 32 & 0x3FFF) == 64);
  CHECK((desc >> 62) == 1);
  CHECK((desc >> 49 & 7) == 0);
  const sm90::DescriptorFields f = sm90::decode_descriptor(desc);
  CHECK(f.start == 0x1A400);
  CHECK(f.lbo == 16);
  CHECK(f.sbo == 1024);
  CHECK(f.swizzle == sm90::Swizzle::k128B);
}

TEST_CASE("matrix descriptor: advancing one by a byte offset is the descriptor of the moved address") {
  // Every 16-byte step a chain takes inside a block's 227 KiB, from any
  // 1024-byte aligned start: the start field alone moves, LBO, SBO and the
  // swizzle stay.
  constexpr std::uint32_t kSmemLimit = 227 * 1024;
  long checked = 0, wrong = 0;
  for (std::uint32_t start = 0; start < kSmemLimit; start += 1024) {
    for (std::uint32_t bytes = 0; start + bytes < kSmemLimit; bytes += 16) {
      for (std::uint32_t lbo : {16u, 16384u}) {
        const std::uint64_t base = sm90::make_descriptor(start, lbo, 1024, sm90::Swizzle::k128B);
        ++checked;
        if (sm90::advance_descriptor(base, bytes) !=
            sm90::make_descriptor(start + bytes, lbo, 1024, sm90::Swizzle::k128B)) {
          if (wrong++ == 0) CHECK_MESSAGE(false, "first at start ", start, " + ", bytes);
        }
      }
    }
  }
  CHECK(checked > 0);
  CHECK(wrong == 0);
}

TEST_CASE("stage 08's descriptors name the elements its swizzled tiles hold, d = 64, 128, 256") {
  // Tiles as stage 08 lays them out (hopper.cuh): Qi [64 x D], Kj and Vj
  // [Bc x D] (Bc = key_tile(D): 128 keys at D = 64 and 128, 64 at 256), each
  // D / 64 column blocks of their rows x 128 bytes, based on a 1024-byte
  // boundary. Its descriptors are those of issue_qk and issue_pv; the
  // address each names for an operand element must be the element's address
  // in the tile.
  constexpr std::uint32_t kBase = 0x4000;  // any 1024-byte aligned address
  constexpr int kQRows = flashstep::hopper::kBr;
  for (int D : {64, 128, 256}) {
    const int Bc = flashstep::hopper::key_tile(D);
    CAPTURE(D);
    CAPTURE(Bc);
    // S = Q K^T, k16 step kk: A(m, k) = Qi[m][16 kk + k] (m < 64);
    // B(k, n) = Kj[n][16 kk + k] (n < Bc: one m64nBck16 wgmma wide).
    for (int kk = 0; kk < D / 16; ++kk) {
      const std::uint32_t in_row = kk % 4 * 32;
      const std::uint64_t a = sm90::make_descriptor(kBase + kk / 4 * kQRows * 128 + in_row, 16,
                                                    1024, sm90::Swizzle::k128B);
      const std::uint64_t b = sm90::make_descriptor(kBase + kk / 4 * Bc * 128 + in_row, 16, 1024,
                                                    sm90::Swizzle::k128B);
      for (int k = 0; k < 16; ++k) {
        for (int m = 0; m < kQRows; ++m) {
          const auto want = kBase + static_cast<std::uint32_t>(
                                        sm90::swizzle128_offset(m, 16 * kk + k, kQRows));
          REQUIRE(sm90::k_major_address(a, m, k) == want);
        }
        for (int n = 0; n < Bc; ++n) {
          const auto want =
              kBase + static_cast<std::uint32_t>(sm90::swizzle128_offset(n, 16 * kk + k, Bc));
          REQUIRE(sm90::k_major_address(b, n, k) == want);
        }
      }
    }
    // O += P V, chain c of No = out_tile(D) columns (64 or 128: one or two
    // column blocks, LBO = one column block of Bc rows apart), k16 step
    // kk < Bc / 16: B(k, n) = Vj[16 kk + k][No c + n].
    const int No = flashstep::hopper::out_tile(D);
    CAPTURE(No);
    for (int c = 0; c < D / No; ++c) {
      for (int kk = 0; kk < Bc / 16; ++kk) {
        const std::uint32_t start = kBase + c * (No / 64) * Bc * 128 + kk * 16 * 128;
        const std::uint64_t desc =
            sm90::make_descriptor(start, Bc * 128, 1024, sm90::Swizzle::k128B);
        for (int k = 0; k < 16; ++k) {
          for (int n = 0; n < No; ++n) {
            const auto want = kBase + static_cast<std::uint32_t>(
                                          sm90::swizzle128_offset(16 * kk + k, No * c + n, Bc));
            REQUIRE(sm90::mn_major_address(desc, k, n) == want);
          }
        }
      }
    }
  }
}

TEST_CASE("stage 08's dynamic order (lpt_place): every (head, rank) once, heaviest first in a section") {
  namespace hopper = flashstep::hopper;
  // Only the d = 64 bucket from step 3 has the dynamic order's kernel
  // (WsLptConfig, launched for causal problems only; the launcher asks
  // lpt_schedule); d = 128 and 256 and steps 1-2 run main's.
  CHECK(hopper::lpt_schedule(hopper::Step::kWarpSpecialized, 64));
  CHECK(hopper::lpt_schedule(hopper::Step::kPingPong, 64));
  CHECK(hopper::lpt_schedule(hopper::Step::kIntraOverlap, 64));
  CHECK_FALSE(hopper::lpt_schedule(hopper::Step::kTmaPipeline, 64));
  CHECK_FALSE(hopper::lpt_schedule(hopper::Step::kIntraOverlap, 128));
  CHECK_FALSE(hopper::lpt_schedule(hopper::Step::kIntraOverlap, 256));
  // FlashAttention-3's section: the largest power of two of heads whose K
  // and V fit 32 MiB, at least one.
  CHECK(hopper::lpt_section_heads(2048, 64, 1) == 64);
  CHECK(hopper::lpt_section_heads(16384, 64, 1) == 8);
  CHECK(hopper::lpt_section_heads(3000, 64, 1) == 32);
  CHECK(hopper::lpt_section_heads(std::int64_t{1} << 20, 64, 1) == 1);
  // Grouped heads: the K/V heads that fit, each read by `group` query heads.
  CHECK(hopper::lpt_section_heads(16384, 64, 4) == 32);
  CHECK(hopper::lpt_section_heads(std::int64_t{1} << 20, 64, 8) == 8);
  for (const auto& [Tr, heads, section] :
       {std::tuple{11, 256, 64}, std::tuple{11, 70, 32}, std::tuple{1, 3, 2}, std::tuple{5, 1, 1},
        std::tuple{4, 7, 8}, std::tuple{3, 9, 4}}) {
    CAPTURE(Tr);
    CAPTURE(heads);
    CAPTURE(section);
    std::set<std::pair<int, int>> seen;
    int last_section = -1, last_rank = 0;
    for (int unit = 0; unit < Tr * heads; ++unit) {
      const hopper::LptPlace at = hopper::lpt_place(unit, Tr, heads, section);
      REQUIRE(at.head >= 0);
      REQUIRE(at.head < heads);
      REQUIRE(at.rank >= 0);
      REQUIRE(at.rank < Tr);
      CHECK(seen.insert({at.head, at.rank}).second);
      const int in_section = at.head / section;
      CHECK(in_section >= last_section);  // sections one after another
      if (in_section == last_section) CHECK(at.rank >= last_rank);  // heaviest first
      last_section = in_section;
      last_rank = at.rank;
    }
    CHECK(seen.size() == static_cast<std::size_t>(Tr * heads));
  }
}
