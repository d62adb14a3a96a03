// Stage 08 on the CPU: its registry entries' architecture, its mirror against
// the fp64 reference at the GPU test's scales in both types, the negative
// scale as wgmma's imm-scale-a (bit for bit, no traffic), and its model by
// hand beside stage 07's. The layouts its kernel relies on are in
// test_sm90_layout.cpp.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <string_view>
#include <vector>

#include "common/check.h"
#include "common/device.h"
#include "common/error.h"
#include "common/reference.h"
#include "common/rounding.h"
#include "common/stage.h"
#include "check_cost.h"
#include "shapes.h"

using flashstep::Cost;
using flashstep::DType;
using flashstep::Problem;
using flashstep::Stage;
using flashstep::test::make_problem;
using flashstep::test::same_bits;
using flashstep::test::with_scale;

namespace {

std::vector<const Stage*> stage08_ladder() {
  const auto ladder = flashstep::select_stages("08");
  REQUIRE(ladder.size() == 5);
  return ladder;
}

struct MirrorRun {
  std::vector<float> O, L;  // [B, H, Nq, d] and [B, H, Nq]
  Cost counted;
};

// The mirror on Q, K, V rounded to p.dtype (as the runner sends them), O and
// L poisoned first.
MirrorRun run_mirror(const Stage& s, const Problem& p, flashstep::Inputs in) {
  for (std::vector<float>* x : {&in.Q, &in.K, &in.V}) {
    flashstep::round_to_dtype(p.dtype, x->data(), static_cast<std::int64_t>(x->size()));
  }
  MirrorRun run;
  run.O.assign(static_cast<size_t>(p.q_elems()), NAN);
  run.L.assign(static_cast<size_t>(p.lse_elems()), NAN);
  run.counted = s.mirror(p, {in.Q.data(), in.K.data(), in.V.data(), run.O.data(), run.L.data()});
  return run;
}

}  // namespace

TEST_CASE("stage 08's entries need sm_90a and were built for it, the other stages any GPU") {
  for (const Stage& s : flashstep::all_stages()) {
    CAPTURE(s.name);
    if (s.name.substr(0, 3) == "08_") {
      CHECK(s.arch == 90);
      CHECK(s.arch_built);  // this build's nvcc knows sm_90a
    } else {
      CHECK(s.arch == 0);
    }
  }
}

TEST_CASE("a stage built without its architecture is unavailable, in one line, before any CUDA call") {
  Stage s = *stage08_ladder().back();
  s.arch_built = false;
  std::string why;
  CHECK_FALSE(flashstep::stage_available(s, &why));
  CHECK(why ==
        "stage 08_hopper is unavailable: this build did not compile it for sm_90a, the "
        "architecture it needs");
  CHECK(why.find('\n') == std::string::npos);
  // The runner refuses it with the same line, before it allocates anything.
  Problem p = make_problem(1, 1, 8, 8, 64, false);
  p.dtype = DType::kBf16;
  const flashstep::Inputs none;
  CHECK_THROWS_WITH_AS(flashstep::DeviceRun(s, p, none.Q.data(), none.K.data(), none.V.data()),
                       why.c_str(), flashstep::Error);
  // A stage for any GPU (arch 0) is available without asking the device.
  Stage any = s;
  any.arch = 0;
  any.arch_built = true;
  CHECK(flashstep::stage_available(any));
}

TEST_CASE("stage 08's mirrors, in each type, at negative, zero and large scales: rule and model") {
  const double scales[] = {-0.5, 0.0, 2.0};
  std::vector<Problem> problems;
  for (const Problem& p : flashstep::test::ragged_problems()) {
    if (p.Nq * p.Nk <= 256 * 256) problems.push_back(p);
  }
  for (bool causal : {false, true}) problems.push_back(make_problem(1, 2, 300, 290, 136, causal));
  // d = 64, causal, Nq > Nk: consumer 0 of the first 192-row block sees no
  // key (pass_tiles), consumer 0 of the second skips the first of the
  // block's 3 tiles (skip_tiles).
  problems.push_back(make_problem(1, 2, 400, 300, 64, true));
  std::uint64_t seed = 800;
  for (const Problem& ragged : problems) {
    for (double scale : scales) {
      for (DType t : {DType::kBf16, DType::kFp16}) {
        const Problem p = with_scale(ragged, scale, t);
        const auto in = flashstep::random_inputs(p, seed++);
        const flashstep::ForwardTruth truth = flashstep::forward_truth(p, in);
        for (const Stage* s : stage08_ladder()) {
          if (!s->supports(t)) continue;
          CAPTURE(s->name);
          CAPTURE(p.describe());
          const MirrorRun run = run_mirror(*s, p, in);
          const auto c = flashstep::check_forward(p, run.O.data(), run.L.data(), truth);
          CHECK_MESSAGE(c.ok(), c.summary());
          flashstep::test::check_counts_equal(run.counted, s->model(p));
        }
      }
    }
  }
}

TEST_CASE("stage 08: a negative scale is |scale| on -Q, bit for bit, at no cost (imm-scale-a)") {
  for (const Stage* s : stage08_ladder()) {
    for (bool causal : {false, true}) {
      const Problem neg = with_scale(make_problem(1, 2, 130, 77, 72, causal), -0.3, DType::kBf16);
      const Problem pos = with_scale(neg, 0.3, DType::kBf16);
      CAPTURE(s->name);
      CAPTURE(neg.describe());
      const auto in = flashstep::random_inputs(neg, 8);
      auto flipped = in;
      for (float& x : flipped.Q) x = -x;  // exact in any type
      const MirrorRun a = run_mirror(*s, neg, in);
      const MirrorRun b = run_mirror(*s, pos, flipped);
      CHECK(same_bits(a.O, b.O));
      CHECK(same_bits(a.L, b.L));
      flashstep::test::check_counts_equal(a.counted, b.counted);
    }
  }
}

TEST_CASE("stage 08's model by hand: Nq = Nk = 256, d = 64, K and V read once a warpgroup") {
  // 64 x 128 tiles (128 keys at d = 64), one warpgroup: 4 Q blocks of R = 64
  // rows, each visiting 2 K/V blocks (C = 256 keys); 2-byte elements, L 4 bytes.
  const Problem p = with_scale(make_problem(1, 1, 256, 256, 64, false), 0.125, DType::kBf16);
  const std::int64_t blocks = 4, R = 64, n = 2, C = 256, d = 64, e = 2;
  for (std::string_view name : {"08_step1_wgmma_sync", "08_step2_tma_pipeline"}) {
    const Stage* s = flashstep::select_stages(name).front();
    CAPTURE(s->name);
    const Cost c = s->model(p);
    CHECK(c.thread_blocks == blocks);
    CHECK(c.skipped_tiles == 0);
    CHECK(c.hbm_read_bytes == blocks * (R + 2 * C) * d * e);
    CHECK(c.hbm_write_bytes == blocks * R * (d * e + 4));
    CHECK(c.sram_write_bytes == blocks * (R + 2 * C) * d * e);  // Qi, Kj, Vj; O not staged
    // wgmma reads Qi once per K/V block, and Kj, Vj once for all four warps.
    CHECK(c.sram_read_bytes == blocks * (n * R * d + 2 * C * d) * e);
    CHECK(c.matmul_flops == blocks * 4 * R * C * d);
    CHECK(c.nonmatmul_flops == blocks * (5 * R * C + n * R * (4 + d) + R * (d + 4)));
  }
  // Stage 07's step 4 on 64 x 64 tiles: each of its 4 warps reads all of Kj
  // and Vj, Qi is read once per 64-key tile (4 tiles, stage 08's 2), and O
  // goes out through shared memory.
  const Cost c07 = flashstep::select_stages("07_step4_p_in_registers").front()->model(p);
  const Cost c08 = stage08_ladder().front()->model(p);
  CHECK(c07.hbm_read_bytes == c08.hbm_read_bytes);
  CHECK(c07.sram_read_bytes - c08.sram_read_bytes ==
        blocks * (3 * 2 * C * d + (4 - n) * R * d + R * d) * e);
}

TEST_CASE("stage 08 step 3's model by hand: consumer warpgroups share a block of 128 or 192 rows") {
  // Each consumer warpgroup reads its 64 rows of Qi per tile and all of Kj
  // and Vj: K/V reads of one warpgroup times the consumers, fewer blocks.
  // O_i leaves through shared memory (written by the threads, read by the
  // TMA store): R d elements more of each.
  // d = 128, two consumers: Nq = Nk = 256, 2 Q blocks of R = 128 rows, each
  // visiting n = 2 K/V blocks of 128 keys.
  {
    const Problem p = with_scale(make_problem(1, 1, 256, 256, 128, false), 0.125, DType::kBf16);
    const std::int64_t blocks = 2, R = 128, n = 2, C = 256, d = 128, e = 2;
    const Cost c = flashstep::select_stages("08_hopper").front()->model(p);
    CHECK(c.thread_blocks == blocks);
    CHECK(c.hbm_read_bytes == blocks * (R + 2 * C) * d * e);
    CHECK(c.hbm_write_bytes == blocks * R * (d * e + 4));
    CHECK(c.sram_write_bytes == blocks * (R + 2 * C + R) * d * e);  // Qi, Kj, Vj, O
    CHECK(c.sram_read_bytes == blocks * (n * R * d + 2 * 2 * C * d + R * d) * e);
    CHECK(c.matmul_flops == blocks * 4 * R * C * d);
  }
  // d = 64, three consumers (FlashAttention-3's 192-row blocks): Nq = Nk =
  // 384, 2 Q blocks of R = 192 rows, each visiting n = 3 K/V blocks.
  for (std::string_view name : {"08_step3_warp_specialized", "08_hopper"}) {
    CAPTURE(name);
    const Problem p = with_scale(make_problem(1, 1, 384, 384, 64, false), 0.125, DType::kBf16);
    const std::int64_t blocks = 2, R = 192, n = 3, C = 384, d = 64, e = 2;
    const Cost c = flashstep::select_stages(name).front()->model(p);
    CHECK(c.thread_blocks == blocks);
    CHECK(c.hbm_read_bytes == blocks * (R + 2 * C) * d * e);
    CHECK(c.sram_write_bytes == blocks * (R + 2 * C + R) * d * e);
    CHECK(c.sram_read_bytes == blocks * (n * R * d + 3 * 2 * C * d + R * d) * e);
    CHECK(c.matmul_flops == blocks * 4 * R * C * d);
  }
  // d = 64, Nq = Nk = 256: Q blocks of 192 and 64 rows, both visiting n = 2
  // K/V blocks; the second block's consumers 2 and 3 have no rows and read
  // nothing (pass_tiles): 3 + 1 warpgroups read Kj and Vj.
  {
    const Problem p = with_scale(make_problem(1, 1, 256, 256, 64, false), 0.125, DType::kBf16);
    const std::int64_t rows = 256, n = 2, C = 256, d = 64, e = 2;
    const Cost c = flashstep::select_stages("08_hopper").front()->model(p);
    CHECK(c.sram_read_bytes == (n * rows * d + (3 + 1) * 2 * C * d + rows * d) * e);
  }
  // d = 256: no room for O_i's buffer beside Qi and the K/V buffers, and O_i
  // goes from the registers straight to HBM. Nq = Nk = 128: one block of
  // R = 128 rows visiting n = 2 K/V blocks of 64 keys.
  {
    const Problem p = with_scale(make_problem(1, 1, 128, 128, 256, false), 0.0625, DType::kBf16);
    const std::int64_t blocks = 1, R = 128, n = 2, C = 128, d = 256, e = 2;
    const Cost c = flashstep::select_stages("08_hopper").front()->model(p);
    CHECK(c.sram_write_bytes == blocks * (R + 2 * C) * d * e);
    CHECK(c.sram_read_bytes == blocks * (n * R * d + 2 * 2 * C * d) * e);
  }
}

TEST_CASE("stage 08, causal: the blocks above the diagonal are skipped, as in stage 07") {
  const Stage* step2 = flashstep::select_stages("08_step2_tma_pipeline").front();
  const Stage* step5 = flashstep::select_stages("08_hopper").front();
  // d = 64, 128 keys per K/V tile (4 tiles of Nk = 512): 64-row Q block i
  // visits K/V blocks 0..i / 2, 192-row block i (rows 192 i .. 192 i + 191,
  // the last one 128 rows) blocks 0..(192 i + 191) / 128.
  const Problem p64 = with_scale(make_problem(1, 1, 512, 512, 64, true), 0.125, DType::kBf16);
  CHECK(step2->model(p64).skipped_tiles == 3 + 3 + 2 + 2 + 1 + 1 + 0 + 0);
  CHECK(step5->model(p64).skipped_tiles == 2 + 1 + 0);
  // Yet each consumer computes only on the tiles its own 64 rows see
  // (skip_tiles): of its block's 2, 3 and 4 tiles, consumers 0, 1, 2 of block
  // 0 compute on 1, 1, 2, of block 1 on 2, 3, 3, of block 2 on 4, 4 (its
  // third has no rows): 20 tiles of 64 rows by 128 keys, as step 2's eight
  // 64-row blocks (1, 1, 2, 2, 3, 3, 4, 4), not the blocks' 3 x 2 + 3 x 3 +
  // 2 x 4 = 23.
  const std::int64_t rows = 64, keys = 128, d = 64;
  CHECK(step5->model(p64).matmul_flops == 20 * 4 * rows * keys * d);
  CHECK(step5->model(p64).matmul_flops == step2->model(p64).matmul_flops);
  // d = 128, 128 keys per K/V tile (2 tiles of Nk = 256): 128-row block i
  // visits blocks 0..i.
  const Problem p128 = with_scale(make_problem(1, 1, 256, 256, 128, true), 0.125, DType::kBf16);
  CHECK(step5->model(p128).skipped_tiles == 1 + 0);
  // d = 256, 64 keys per K/V tile (4 tiles): 64-row Q block i visits K/V
  // blocks 0..i, 128-row block i blocks 0..2i+1.
  const Problem p256 = with_scale(make_problem(1, 1, 256, 256, 256, true), 0.125, DType::kBf16);
  CHECK(step2->model(p256).skipped_tiles == 3 + 2 + 1 + 0);
  CHECK(step5->model(p256).skipped_tiles == 2 + 0);
}
