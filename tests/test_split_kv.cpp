// Stage 09 on the CPU: the split rule by hand, the split kernel's mirror and
// its merge against the fp64 reference on ragged decoding shapes at several
// split counts, the model's counts, and the KV cache with lengths that differ
// across the batch, contiguous or paged, with new tokens appended.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "09_split_kv/split_kv.h"
#include "common/check.h"
#include "common/reference.h"
#include "common/rounding.h"
#include "check_cost.h"
#include "kvcache_fixture.h"
#include "shapes.h"

using flashstep::Problem;
namespace sk = flashstep::split_kv;

namespace {

struct Run {
  std::vector<float> O, L;
  flashstep::Cost counted;
};

Run run_kvcache(const Problem& p, const flashstep::Inputs& in, const std::vector<std::int64_t>& seqlens,
                int sm_count, bool split = true) {
  Run r;
  r.O.assign(static_cast<size_t>(p.q_elems()), NAN);
  r.L.assign(static_cast<size_t>(p.lse_elems()), NAN);
  r.counted = sk::mirror_kvcache(p, {in.Q.data(), in.K.data(), in.V.data(), r.O.data(), r.L.data()},
                                 seqlens.data(), sm_count, split);
  return r;
}

// O = 0 and L = -inf exactly in the rows that see no key.
void check_empty_rows(const Problem& p, const Run& r) {
  std::int64_t wrong = 0;
  for (std::int64_t bh = 0; bh < p.heads(); ++bh) {
    for (std::int64_t i = 0; i < p.Nq && p.visible_keys(i) == 0; ++i) {
      for (std::int64_t c = 0; c < p.d; ++c) wrong += r.O[(bh * p.Nq + i) * p.d + c] != 0.0f;
      wrong += r.L[bh * p.Nq + i] != -INFINITY;
    }
  }
  CHECK(wrong == 0);
}

// The inputs as the GPU receives them in p.dtype (forward_truth, taken
// before, rounds a copy of its own).
void round_inputs(const Problem& p, flashstep::Inputs& in) {
  for (std::vector<float>* x : {&in.Q, &in.K, &in.V}) {
    flashstep::round_to_dtype(p.dtype, x->data(), static_cast<std::int64_t>(x->size()));
  }
}

// The mirror of a full cache (every sequence Nk long) on sm_count SMs,
// checked against the fp64 truth, its rows that see no key, and at the
// model's SM count its counted traffic against the model.
Run check_full_cache(const Problem& p, const flashstep::Inputs& in,
                     const flashstep::ForwardTruth& truth, int sm_count) {
  CAPTURE(p.describe());
  CAPTURE(sm_count);
  const std::vector<std::int64_t> full(static_cast<size_t>(p.B), p.Nk);
  const Run r = run_kvcache(p, in, full, sm_count);
  const auto c = flashstep::check_forward(p, r.O.data(), r.L.data(), truth);
  CHECK_MESSAGE(c.ok(), c.summary());
  check_empty_rows(p, r);
  if (sm_count == sk::kModelSmCount) flashstep::test::check_counts_equal(r.counted, sk::model(p));
  return r;
}

}  // namespace

TEST_CASE("stage 09's split rule by hand") {
  Problem p = flashstep::test::make_problem(1, 32, 1, 32768, 128, false);
  p.H_kv = 8;
  p.dtype = flashstep::DType::kBf16;
  // 8 K/V heads, one row tile each (4 rows): 8 blocks unsplit; 132 SMs of 2
  // resident blocks at d = 128 are 264 slots. 33 splits would fill them, but
  // dealt out in whole 32-key tiles 33 become 32 (256 blocks, 97 %), and the
  // fewest within 95 % of that is 31 splits of 1,088 keys (248 blocks, 94 %).
  sk::Plan plan = sk::make_plan(p, 132);
  CHECK(plan.group_rows == 4);
  CHECK(plan.row_tiles == 1);
  CHECK(plan.keys_per_split == 1088);
  CHECK(plan.splits == 31);
  CHECK(sk::make_plan(p, 132, false).splits == 1);
  // 32 K/V heads: 8 splits, 256 blocks in one wave (17 splits, 544 blocks,
  // would be 2.06 waves: three).
  p.H_kv = 32;
  CHECK(sk::make_plan(p, 132).splits == 8);
  // 256 K/V heads fill 80 % of the slots unsplit: one split.
  p.B = 8;
  CHECK(sk::make_plan(p, 132).splits == 1);
  // fp32 at d = 256 holds one block an SM: 132 slots, so 128 K/V heads
  // unsplit fill them already, while 16 bits (264 slots) splits them in two.
  p.B = 4;
  p.d = 256;
  p.dtype = flashstep::DType::kFp32;
  CHECK(sk::make_plan(p, 132).splits == 1);
  p.dtype = flashstep::DType::kBf16;
  CHECK(sk::make_plan(p, 132).splits == 2);
  // One wave holds the cap: one K/V head (MQA on one sequence) of 1k keys
  // takes 16 splits of 64 keys (kIdleMinKeysPerSplit: one or two 32-key
  // tiles a block, where 256 keys a split were a chain of 8); of 4k keys 64
  // of 64; of 16k keys 128 of 128 (kShortSplitCap; 64 blocks of 256 keys
  // leave the GPU idle); of 32k keys 128 of 256 (128 blocks: not idle); of
  // 64k keys 128 of 512 (more would have fewer than kMinKeysPastShortCap
  // keys); of 192k keys 192 of 1,024; of 256k keys 256 (kMaxSplits): 256
  // blocks in one wave of 264 slots.
  p.B = 1;
  p.H_kv = 1;
  p.d = 128;
  for (auto [Nk, splits] : {std::pair<std::int64_t, std::int64_t>{1024, 16},
                            {4096, 64},
                            {16384, 128},
                            {32768, 128},
                            {65536, 128},
                            {196608, 192},
                            {262144, sk::kMaxSplits}}) {
    p.Nk = Nk;
    CAPTURE(Nk);
    CHECK(sk::make_plan(p, 132).splits == splits);
  }
  // Few keys on an idle GPU: at least kIdleMinKeysPerSplit (64) a split. 8
  // K/V heads of 1,000 keys (4 splits of 256 would be 32 blocks, at most
  // half of 132 SMs: idle_grid): 16 splits of 64 (128 blocks, one wave);
  // 64 sequences of MQA (64 blocks unsplit, 256 in splits of 256: not
  // idle): the fewest splits within 95 % of the best fill, 4 of 256 keys
  // (256 blocks, 97 %).
  p.H_kv = 8;
  p.Nk = 1000;
  sk::Plan few = sk::make_plan(p, 132);
  CHECK(few.splits == 16);
  CHECK(few.keys_per_split == 64);
  p.H_kv = 1;
  p.B = 64;
  few = sk::make_plan(p, 132);
  CHECK(few.splits == 4);
  CHECK(few.keys_per_split == 256);
  // A busier GPU keeps 256 keys a split: MQA on 8 sequences of 4k keys (16
  // splits of 256 are 128 blocks, more than half of 132 SMs) takes those 16,
  // not 32 of 128 (run 12: 4 % slower); 32 K/V heads of 1k keys take 4.
  p.B = 8;
  p.Nk = 4096;
  CHECK_FALSE(sk::idle_grid(p, 8, 132));
  few = sk::make_plan(p, 132);
  CHECK(few.splits == 16);
  CHECK(few.keys_per_split == 256);
  p.B = 1;
  p.H_kv = 32;
  p.Nk = 1024;
  CHECK(sk::make_plan(p, 132).splits == 4);
  p.B = 1;
  p.H_kv = 8;
  p.Nk = 1;
  CHECK(sk::make_plan(p, 132).splits == 1);
  // Many keys: at most kMaxSplits.
  p.Nk = 1 << 20;
  p.H_kv = 1;
  CHECK(sk::make_plan(p, 1024).splits == sk::kMaxSplits);
  // A prefill fills the GPU with row tiles alone: 8 heads of 128 tiles.
  p = flashstep::test::make_problem(1, 8, 4096, 4096, 64, true);
  CHECK(sk::make_plan(p, 132).row_tiles == 128);
  CHECK(sk::make_plan(p, 132).splits == 1);
  // The Hopper kernel (wide) on a grid that gives nearly every SM a block
  // unsplit: MQA with Nq = 4 on 64 sequences is 128 blocks of 64 rows on
  // 132 SMs; a split of fewer than kWideSecondBlockKeys keys only adds the
  // SMs' second blocks, so 1k to 4k keys stay unsplit and 8k takes two
  // splits of 4k. Half the sequences (64 blocks) split as before: 4 of
  // 256 keys at 1k. Without `wide` (32-row tiles: 256 blocks on 264 slots,
  // full already) the rule is the one above.
  p = flashstep::test::make_problem(64, 32, 4, 1024, 128, false);
  p.H_kv = 1;
  p.dtype = flashstep::DType::kBf16;
  for (auto [Nk, splits] : {std::pair<std::int64_t, std::int64_t>{1024, 1},
                            {4096, 1},
                            {8192, 2},
                            {32768, 2}}) {
    p.Nk = Nk;
    CAPTURE(Nk);
    CHECK(sk::make_plan(p, 132, true, false, true).splits == splits);
  }
  p.Nk = 1024;
  CHECK(sk::make_plan(p, 132, true, false, false).splits == 1);
  p.B = 32;
  CHECK(sk::make_plan(p, 132, true, false, true).splits == 4);
  // The workspace covers any GPU's plan (the rule is not monotone in the SM
  // count: every count up to kMaxSmCount), in every type.
  for (flashstep::DType t : {flashstep::DType::kFp32, flashstep::DType::kBf16}) {
    for (const Problem& shape : {flashstep::test::make_problem(2, 4, 3, 5000, 64, false),
                                 flashstep::test::make_problem(3, 32, 1, 40000, 128, false)}) {
      p = shape;
      p.dtype = t;
      std::int64_t most = 0;
      for (int sms = 1; sms <= sk::kMaxSmCount; ++sms) most = std::max(most, sk::make_plan(p, sms).splits);
      CAPTURE(p.describe());
      CHECK(most * (p.q_elems() + p.lse_elems()) * 4 <= sk::workspace_bytes(p));
    }
  }
}

TEST_CASE("stage 09's merge spreads a row's splits over up to 8 warps") {
  // One warp a row while its splits fit one round of reads (merge_splits:
  // 16 up to d = 128, 8 at d = 256), then twice the warps each time they
  // do not, up to kMergeWarps; each warp's run of splits is then one round.
  CHECK(sk::merge_warps(1, 128) == 1);
  CHECK(sk::merge_warps(16, 128) == 1);
  CHECK(sk::merge_warps(17, 128) == 2);
  CHECK(sk::merge_warps(31, 128) == 2);
  CHECK(sk::merge_warps(33, 128) == 4);
  CHECK(sk::merge_warps(128, 128) == 8);
  CHECK(sk::merge_warps(sk::kMaxSplits, 128) == sk::kMergeWarps);
  CHECK(sk::merge_warps(16, 256) == 2);
  CHECK(sk::merge_warps(sk::kMaxSplits, 64) == sk::kMergeWarps);
  // MQA on one sequence, 256 splits: 8 warps of 32 splits for each of the
  // 32 rows, one row a block; 31 splits: 2 warps of 16, 4 rows a block.
  CHECK(sk::merge_run(256, 8) == 32);
  CHECK(sk::merge_run(31, 2) == 16);
  Problem p = flashstep::test::make_problem(1, 32, 1, 262144, 128, false);
  p.H_kv = 1;
  p.dtype = flashstep::DType::kBf16;
  const sk::Plan plan = sk::make_plan(p, 132);
  CHECK(plan.splits == 256);
  CHECK(sk::merge_blocks(p, plan) == 32);
  CHECK(sk::thread_blocks(p, plan) == 256 + 32);
}

TEST_CASE("stage 09's split rule fills its waves") {
  // Decoding shapes of the sweep and a few more (H = 32, d = 128, 16 bits:
  // 264 slots on 132 SMs): a plan of several splits either holds every block
  // in one wave at the cap, or its waves are within kWaveFill as full as
  // those of any split count up to the cap (as dealt out).
  for (std::int64_t H_kv : {1, 8, 32}) {
    for (std::int64_t B : {1, 3, 8, 64}) {
      for (std::int64_t Nk : {1024, 5000, 16384, 32768, 131072, 524288}) {
        Problem p = flashstep::test::make_problem(B, 32, 1, Nk, 128, false);
        p.H_kv = H_kv;
        p.dtype = flashstep::DType::kBf16;
        CAPTURE(p.describe());
        CAPTURE(H_kv);
        const sk::Plan plan = sk::make_plan(p, sk::kModelSmCount);
        const std::int64_t n0 = B * H_kv, slots = 2 * sk::kModelSmCount;
        auto dealt = [&](std::int64_t s) { return (Nk - 1) / sk::keys_per_split(Nk, s) + 1; };
        auto fill = [&](std::int64_t splits) {
          const std::int64_t blocks = n0 * splits;
          return static_cast<double>(blocks) / static_cast<double>(((blocks - 1) / slots + 1) * slots);
        };
        const std::int64_t cap =
            sk::split_cap(p, sk::min_keys_per_split(p, n0, sk::kModelSmCount));
        CHECK(plan.splits <= cap);
        if (plan.splits == 1) continue;
        CHECK(n0 < sk::kFullGrid * slots);
        if (n0 * plan.splits <= slots && plan.splits == dealt(cap)) continue;
        for (std::int64_t s = 1; s <= cap; ++s) {
          CAPTURE(s);
          CHECK(fill(plan.splits) >= sk::kWaveFill * fill(dealt(s)));
        }
      }
    }
  }
}

TEST_CASE("stage 09's group rows map back to their query heads") {
  // K/V head kvh's group, row g: the query head that reads kvh.
  for (std::int64_t H_kv : {1, 2, 4, 8}) {
    const std::int64_t H = 8, B = 3;
    for (std::int64_t kvh = 0; kvh < B * H_kv; ++kvh) {
      for (std::int64_t g = 0; g < H / H_kv; ++g) {
        CHECK(flashstep::kv_head_of(sk::query_head(kvh, g, H, H_kv), H, H_kv) == kvh);
      }
    }
  }
}

TEST_CASE("stage 09: splits and their merge match fp64 on ragged decoding shapes, causal and not") {
  // Nq in {1, 3, 16}, Nk from 1 up past a few splits, grouped and not; the SM
  // counts give 1 split, a few, and many (sm_count 1024: up to Nk / 256; 36
  // at 9,000 keys, merged by 4 warps a row).
  struct Shape {
    std::int64_t B, H, H_kv, Nq, Nk, d;
  };
  const Shape shapes[] = {{2, 4, 4, 1, 1, 64},    {1, 8, 2, 1, 1000, 64}, {2, 8, 1, 3, 777, 40},
                          {1, 4, 1, 16, 9, 128},  {3, 2, 2, 16, 2049, 59}, {1, 32, 1, 1, 1300, 16},
                          {2, 2, 1, 3, 2, 256},   {1, 2, 1, 1, 9000, 40}};
  std::uint64_t seed = 90;
  int several = 0;
  for (const Shape& sh : shapes) {
    for (bool causal : {false, true}) {
      Problem p = flashstep::test::make_problem(sh.B, sh.H, sh.Nq, sh.Nk, sh.d, causal);
      p.H_kv = sh.H_kv;
      const auto in = flashstep::random_inputs(p, seed++);
      const auto truth = flashstep::forward_truth(p, in);
      const std::vector<std::int64_t> full(static_cast<size_t>(p.B), p.Nk);
      for (int sms : {1, 132, 1024}) {
        CAPTURE(p.describe());
        CAPTURE(sms);
        const sk::Plan plan = sk::make_plan(p, sms);
        several += plan.splits > 1;
        const Run r = run_kvcache(p, in, full, sms);
        const auto c = flashstep::check_forward(p, r.O.data(), r.L.data(), truth);
        CHECK_MESSAGE(c.ok(), c.summary());
        check_empty_rows(p, r);
      }
    }
  }
  CHECK(several >= 10);  // the merge ran, not just the one-split path
}

TEST_CASE("stage 09: the mirrors count what the models say, and K and V are read once per group") {
  std::uint64_t seed = 95;
  for (const Problem& grouped : flashstep::test::grouped_problems()) {
    for (bool split : {true, false}) {
      CAPTURE(grouped.describe());
      CAPTURE(split);
      const auto in = flashstep::random_inputs(grouped, seed++);
      const std::vector<std::int64_t> full(static_cast<size_t>(grouped.B), grouped.Nk);
      const Run r = run_kvcache(grouped, in, full, sk::kModelSmCount, split);
      flashstep::test::check_counts_equal(r.counted, split ? sk::model(grouped)
                                                           : sk::model_one_block(grouped));
    }
  }
  // Decoding, Nq = 1, H = 32, H_kv = 8, Nk = 32k: K + V once per K/V head,
  // Q once per split, partials written and read back once.
  Problem p = flashstep::test::make_problem(2, 32, 1, 32768, 128, false);
  p.H_kv = 8;
  const sk::Plan plan = sk::make_plan(p, sk::kModelSmCount);
  const flashstep::Cost c = sk::model(p);
  const std::int64_t kv = 2 * p.kv_elems() * 4;
  const std::int64_t partials = plan.splits * p.lse_elems() * (p.d + 1) * 4;
  CHECK(c.hbm_read_bytes == kv + plan.splits * p.q_elems() * 4 + partials);
  CHECK(c.hbm_write_bytes == partials + p.lse_elems() * (p.d + 1) * 4);
  CHECK(static_cast<double>(c.matmul_flops) == p.forward_flops());
}

TEST_CASE("stage 09's model counts SRAM and other FLOPs as the mirror's loops do, split and not") {
  // Decoding and short-prefill shapes whose plan at the model's SM count has
  // one split, a few and many; grouped (H_kv < H, G Nq past one row tile) and
  // not; causal (rows that see only part of a split, or none of the last) and
  // not. The mirror walks the kernel's blocks and counts each access and
  // operation where it happens; the model is the closed form.
  struct Shape {
    std::int64_t B, H, H_kv, Nq, Nk, d;
  };
  const Shape shapes[] = {{1, 8, 2, 1, 1000, 40}, {2, 4, 4, 3, 777, 59}, {1, 32, 1, 5, 2049, 16},
                          {1, 2, 1, 16, 33, 64},  {2, 4, 2, 7, 300, 128}, {1, 4, 1, 1, 5000, 40}};
  std::uint64_t seed = 140;
  int one = 0, several = 0;
  for (const Shape& sh : shapes) {
    for (bool causal : {false, true}) {
      Problem p = flashstep::test::make_problem(sh.B, sh.H, sh.Nq, sh.Nk, sh.d, causal);
      p.H_kv = sh.H_kv;
      const auto in = flashstep::random_inputs(p, seed++);
      const std::vector<std::int64_t> full(static_cast<size_t>(p.B), p.Nk);
      for (bool split : {true, false}) {
        CAPTURE(p.describe());
        CAPTURE(split);
        const sk::Plan plan = sk::make_plan(p, sk::kModelSmCount, split);
        (plan.splits > 1 ? several : one) += 1;
        const Run r = run_kvcache(p, in, full, sk::kModelSmCount, split);
        const flashstep::Cost model = split ? sk::model(p) : sk::model_one_block(p);
        flashstep::test::check_counts_equal(r.counted, model);
        CHECK(r.counted.sram_read_bytes > 0);
        CHECK(r.counted.nonmatmul_flops > 0);
      }
    }
  }
  CHECK(one >= 10);
  CHECK(several >= 8);

  // One query, one head, one 32-key tile, d = 4, fp32, by hand.
  // SRAM writes: Q 4 + K and V 2 * 32 * 4 + P~ 32 = 292 floats (m, l and
  // alpha stay in registers). Reads: S 32 * 4 * 2, P~ V 32 * 4 * 2 = 512 floats.
  // Non-matmul: 32 scales, 4 * 32 per key, 5 + 4 for the tile, 4 + 3 at the end = 176.
  const Problem tiny = flashstep::test::make_problem(1, 1, 1, 32, 4, false);
  const flashstep::Cost c = sk::model(tiny);
  CHECK(c.sram_write_bytes == 292 * 4);
  CHECK(c.sram_read_bytes == 512 * 4);
  CHECK(c.nonmatmul_flops == 176);
  CHECK(c.matmul_flops == 2 * 32 * 4 * 2);
}

TEST_CASE("stage 09's KV cache: lengths that differ across the batch, queries at each sequence's end") {
  // capacity 300; sequence lengths 1, capacity, 0 (nothing cached yet), and
  // ragged ones. Sequence b is the problem with Nk = seqlens[b] on the first
  // seqlens[b] keys of its cache rows.
  const std::vector<std::int64_t> seqlens = {1, 300, 0, 17, 299, 256};
  const std::int64_t capacity = 300;
  std::uint64_t seed = 97;
  for (std::int64_t Nq : {1, 3, 16}) {
    for (std::int64_t H_kv : {1, 2}) {
      for (bool causal : {false, true}) {
        Problem p = flashstep::test::make_problem(static_cast<std::int64_t>(seqlens.size()), 4, Nq,
                                                  capacity, 40, causal);
        p.H_kv = H_kv;
        CAPTURE(p.describe());
        const auto in = flashstep::random_inputs(p, seed++);
        for (int sms : {1, 1024}) {
          CAPTURE(sms);
          const Run r = run_kvcache(p, in, seqlens, sms);
          flashstep::test::check_sequences(p, in.Q, in.K, in.V, seqlens, r.O.data(), r.L.data());
        }
      }
    }
  }
}

TEST_CASE("stage 09 in bf16 and fp16: the mirror passes FlashAttention's rule and counts 2-byte elements") {
  std::uint64_t seed = 120;
  for (flashstep::DType t : {flashstep::DType::kBf16, flashstep::DType::kFp16}) {
    for (const Problem& grouped : flashstep::test::grouped_problems()) {
      Problem p = grouped;
      p.dtype = t;
      auto in = flashstep::random_inputs(p, seed++);
      const auto truth = flashstep::forward_truth(p, in);
      round_inputs(p, in);
      for (int sms : {1, sk::kModelSmCount, 1024}) {
        const Run r = check_full_cache(p, in, truth, sms);
        // O holds the type's values: rounding it again changes nothing.
        std::int64_t unrounded = 0;
        for (float o : r.O) unrounded += flashstep::round_to_dtype(t, o) != o;
        CHECK(unrounded == 0);
      }
    }
  }
}

TEST_CASE("stage 09 in bf16, wide groups: the Hopper kernel's 64-row tiles, counted by the model as by the mirror") {
  // More than kRows rows a K/V head at d = 128 in 16 bits (wide_group): the
  // host models plan the sm_90 kernel's layout, kWideRows rows a block.
  struct Shape {
    std::int64_t B, H, H_kv, Nq, Nk, d;
  };
  const Shape shapes[] = {{1, 32, 1, 4, 1000, 128}, {2, 16, 2, 16, 300, 96}, {1, 32, 1, 3, 257, 128}};
  std::uint64_t seed = 160;
  for (const Shape& sh : shapes) {
    for (bool causal : {false, true}) {
      Problem p = flashstep::test::make_problem(sh.B, sh.H, sh.Nq, sh.Nk, sh.d, causal);
      p.H_kv = sh.H_kv;
      p.dtype = flashstep::DType::kBf16;
      CAPTURE(p.describe());
      REQUIRE(sk::model_wide(p));
      const auto in = flashstep::random_inputs(p, seed++);
      const std::vector<std::int64_t> full(static_cast<size_t>(p.B), p.Nk);
      for (bool split : {true, false}) {
        CAPTURE(split);
        const sk::Plan plan = sk::make_plan(p, sk::kModelSmCount, split, false, true);
        CHECK(plan.tile_rows == sk::kWideRows);
        CHECK(plan.row_tiles == (p.group() * p.Nq - 1) / sk::kWideRows + 1);
        const Run r = run_kvcache(p, in, full, sk::kModelSmCount, split);
        flashstep::test::check_counts_equal(r.counted, split ? sk::model(p) : sk::model_one_block(p));
      }
    }
  }
  // By hand: MQA on 32 heads, Nq = 4 (128 rows: two row tiles), one tile of
  // 64 keys, one block a row tile. SRAM reads: Q a tile, 128 x 128 x 2 B =
  // 32,768; K and V once a row tile, 2 x 2 x 64 x 128 x 2 B = 65,536.
  Problem p = flashstep::test::make_problem(1, 32, 4, 64, 128, false);
  p.H_kv = 1;
  p.dtype = flashstep::DType::kBf16;
  CHECK(sk::model_one_block(p).sram_read_bytes == 32768 + 65536);
  CHECK_FALSE(sk::model_wide(flashstep::test::make_problem(1, 32, 1, 64, 128, false)));  // 32 rows
}

TEST_CASE("stage 09 in bf16: Q's fragments once a split where held in registers, and the narrow layout, by hand") {
  // One query head group, one split (the one-block plan), no mask. SRAM reads by hand
  // (split_kv_model.cpp's conventions): S slices a step, RG warps sharing a
  // slice, 2-byte elements, fp32 for the slices' merge (2 S + 2 S d + 1 per
  // row).
  //   d = 128, 32 rows (H = 32, H_kv = 1): 32-key tiles, S = 2, RG = 2,
  //     Nk = 64, Q held: Q 2 x 32 x 128 x 2 B once = 16,384; K and V
  //     2 x 2 x 64 x 128 x 2 B = 65,536; merge 32 x (4 + 512 + 1) x 4 B =
  //     66,176: 148,096.
  //   d = 128, one row (narrow): a pair of tiles a step, S = 4, RG = 1,
  //     Nk = 64: Q 4 x 128 x 2 B = 1,024; K and V 2 x 1 x 64 x 128 x 2 B =
  //     32,768; merge (8 + 1,024 + 1) x 4 B = 4,132: 37,924.
  //   d = 64, one row: 64-key tiles, S = 4, RG = 1, Nk = 128, Q per tile:
  //     Q 4 x 64 x 2 B x 2 tiles = 1,024; K and V 2 x 1 x 128 x 64 x 2 B =
  //     32,768; merge (8 + 512 + 1) x 4 B = 2,084: 35,876.
  CHECK(sk::mma_q_in_registers(128));
  CHECK_FALSE(sk::mma_q_in_registers(64));
  CHECK(sk::mma_narrow(128, 16));
  CHECK_FALSE(sk::mma_narrow(128, 17));
  CHECK_FALSE(sk::mma_narrow(64, 1));
  CHECK_FALSE(sk::mma_narrow(256, 1));
  struct Case {
    std::int64_t H, H_kv, Nk, d, sram_read_bytes;
  };
  for (const Case& k : {Case{32, 1, 64, 128, 148096}, Case{1, 1, 64, 128, 37924}, Case{1, 1, 128, 64, 35876}}) {
    Problem p = flashstep::test::make_problem(1, k.H, 1, k.Nk, k.d, false);
    p.H_kv = k.H_kv;
    p.dtype = flashstep::DType::kBf16;
    CAPTURE(p.describe());
    // The one-block plan: one split however many keys (128 keys at d = 64
    // are two splits of kMinKeysPerSplit in the split plan).
    REQUIRE(sk::make_plan(p, sk::kModelSmCount, false).splits == 1);
    CHECK(sk::model_one_block(p).sram_read_bytes == k.sram_read_bytes);
  }
}

TEST_CASE("stage 09 in bf16 and fp16, narrow layout: groups of at most 16 rows at d = 128 match fp64 and the model") {
  // The narrow layout (mma_narrow) on ragged decoding shapes: d = 128 (full
  // tiles by load_full_tile_async on the GPU) and 100 (the same bucket,
  // load_tile), splits with an odd number of 32-key tiles (the pair's
  // second tile past the split's end), causal and not, one to 16 rows.
  struct Shape {
    std::int64_t B, H, H_kv, Nq, Nk, d;
  };
  const Shape shapes[] = {{2, 8, 2, 3, 333, 128}, {1, 4, 4, 1, 1000, 100}, {3, 16, 1, 1, 97, 128},
                          {1, 32, 8, 4, 4099, 128}, {2, 2, 1, 8, 47, 112}};
  std::uint64_t seed = 160;
  for (flashstep::DType t : {flashstep::DType::kBf16, flashstep::DType::kFp16}) {
    for (const Shape& sh : shapes) {
      for (bool causal : {false, true}) {
        Problem p = flashstep::test::make_problem(sh.B, sh.H, sh.Nq, sh.Nk, sh.d, causal);
        p.H_kv = sh.H_kv;
        p.dtype = t;
        REQUIRE(sk::mma_narrow(flashstep::head_dim_bucket(p.d), p.group() * p.Nq));
        auto in = flashstep::random_inputs(p, seed++);
        const auto truth = flashstep::forward_truth(p, in);
        round_inputs(p, in);
        for (int sms : {1, sk::kModelSmCount}) check_full_cache(p, in, truth, sms);
      }
    }
  }
}

TEST_CASE("stage 09 in fp32: the wide layout from 9 rows a group, each warp's rows one register tile") {
  // fp32_wide: with at most kWarps rows every real row has its own warp
  // (narrow); past that the wide layout's register tiles. The decode
  // benchmark's points at H = 32: H_kv = 32 (G = 1) and H_kv = 8 (G = 4) at
  // Nq = 1 narrow; G = 4 at Nq = 4 and MQA (G = 32) wide.
  CHECK_FALSE(sk::fp32_wide(1));
  CHECK_FALSE(sk::fp32_wide(4));
  CHECK_FALSE(sk::fp32_wide(sk::kWarps));
  CHECK(sk::fp32_wide(sk::kWarps + 1));
  CHECK(sk::fp32_wide(16));
  CHECK(sk::fp32_wide(32 * 4));
  // The wide layout's warps hold the row tile in one pass each.
  static_assert(sk::kFp32TileRows * sk::kWarps == sk::kRows);
  struct Point {
    std::int64_t H_kv, Nq;
    bool wide;
  };
  for (const Point& pt : {Point{32, 1, false}, Point{32, 4, false}, Point{8, 1, false}, Point{8, 4, true},
                          Point{1, 1, true}, Point{1, 4, true}}) {
    Problem p = flashstep::test::make_problem(1, 32, pt.Nq, 32768, 128, false);
    p.H_kv = pt.H_kv;
    CAPTURE(p.describe());
    CHECK(sk::fp32_wide(sk::make_plan(p, sk::kModelSmCount).group_rows) == pt.wide);
  }
}

TEST_CASE("stage 09's KV cache: the cache rows of a contiguous and a paged layout") {
  const Problem p = flashstep::test::make_problem(3, 4, 1, 256, 8, false);
  // Contiguous: [B, H_kv, Nk, d], row kvh Nk + key.
  for (std::int64_t kvh : {0, 5, 11}) {
    for (std::int64_t key : {0, 63, 64, 255}) CHECK(sk::cache_row({}, kvh, 4, 256, key) == kvh * 256 + key);
  }
  // Paged: pages of 64 keys, sequence b's pages from its row of the table;
  // every (sequence, head, key) lands on its own row of the pool, and a
  // page's keys on consecutive rows.
  const std::vector<std::int32_t> table = {7, 2, 9, 0, 1, 3, 4, 5, 6, 8, 10, 11};  // [3, 4]
  const sk::CacheLayout paged{table.data(), 4, 64};
  std::vector<int> hits(12 * 4 * 64, 0);
  for (std::int64_t kvh = 0; kvh < p.B * 4; ++kvh) {
    for (std::int64_t key = 0; key < 256; ++key) {
      const std::int64_t row = sk::cache_row(paged, kvh, 4, 256, key);
      const std::int64_t page = table[static_cast<size_t>(kvh / 4 * 4 + key / 64)];
      CHECK(row == (page * 4 + kvh % 4) * 64 + key % 64);
      ++hits[static_cast<size_t>(row)];
    }
  }
  CHECK(std::count(hits.begin(), hits.end(), 1) == static_cast<std::ptrdiff_t>(hits.size()));
}

TEST_CASE("stage 09's paged plan deals the keys out in whole pages' granules, so no tile straddles two") {
  for (std::int64_t Nk : {64, 320, 4096, 65536, 524288}) {
    for (std::int64_t H_kv : {1, 8, 32}) {
      Problem p = flashstep::test::make_problem(1, 32, 1, Nk, 128, false);
      p.H_kv = H_kv;
      p.dtype = flashstep::DType::kBf16;
      CAPTURE(p.describe());
      const sk::Plan plan = sk::make_plan(p, sk::kModelSmCount, true, true);
      CHECK(plan.keys_per_split % sk::kPageKeyMultiple == 0);
      CHECK(plan.splits * plan.keys_per_split >= Nk);
      CHECK((plan.splits - 1) * plan.keys_per_split < Nk);  // no split is empty
      CHECK(plan.splits <= sk::max_splits(p));               // the workspace holds them
    }
  }
}

TEST_CASE("stage 09's KV cache refuses a layout it cannot read, one clear error each") {
  const Problem p = flashstep::test::make_problem(2, 4, 1, 256, 64, false);
  std::vector<float> Q(static_cast<size_t>(p.q_elems())), O(Q.size()), L(static_cast<size_t>(p.lse_elems()));
  std::vector<float> K(static_cast<size_t>(p.kv_elems())), V(K.size());
  const std::vector<std::int64_t> lens = {10, 20};
  const std::vector<std::int32_t> table = {0, 1, 2, 3, 4, 5, 6, 7};
  const flashstep::HostTensors t{Q.data(), nullptr, nullptr, O.data(), L.data()};
  auto message = [&](sk::HostKvCache cache, flashstep::HostTensors with = {}) {
    if (!with.Q) with = t;
    try {
      sk::mirror_kvcache(p, with, cache, sk::kModelSmCount);
    } catch (const flashstep::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const sk::HostKvCache ok{K.data(), V.data(), lens.data(), {}, nullptr, nullptr};
  CHECK(message(ok) == "no error");
  CHECK(message(ok, {Q.data(), K.data(), V.data(), O.data(), L.data()}).find("must be null") !=
        std::string::npos);
  sk::HostKvCache bad = ok;
  bad.K_new = K.data();
  CHECK(message(bad).find("K_new and V_new go together") != std::string::npos);
  bad = ok;
  bad.layout = {table.data(), 8, 32};
  CHECK(message(bad).find("page_keys 32 must be a positive multiple of 64") != std::string::npos);
  bad.layout = {table.data(), 2, 64};
  CHECK(message(bad).find("must be the capacity Nk 256") != std::string::npos);
  bad.layout = {table.data(), std::int64_t{1} << 62, 64};  // pages x keys would overflow
  CHECK(message(bad).find("must be the capacity Nk 256") != std::string::npos);
  bad.layout = {nullptr, 4, 64};
  CHECK(message(bad).find("without a block table") != std::string::npos);
  bad = ok;
  bad.seqlens = nullptr;
  CHECK(message(bad).find("null cache_seqlens") != std::string::npos);
  // 2^31 K/V heads pass cache_row's 32-bit division: refused before any read.
  Problem huge = p;
  huge.B = sk::kMaxPagedHeads / huge.kv_heads();
  std::string why = "no error";
  try {
    sk::validate_kvcache(huge, nullptr, nullptr, K.data(), V.data(), lens.data(),
                         {table.data(), 4, 64}, nullptr, nullptr);
  } catch (const flashstep::Error& e) {
    why = e.what();
  }
  CHECK(why.find("K/V heads; at most 2147483647") != std::string::npos);
}

// A paged cache with pages in a shuffled order and NaN pages no table names,
// the new tokens appended first: each sequence against the fp64 reference
// on its cached keys and then its new ones, and the pages afterwards hold the
// new tokens where the block table puts them.
TEST_CASE("stage 09's KV cache, paged and appended to: the mirror against fp64, sequence by sequence") {
  // Lengths before the call: empty, one key, ragged, on a page's edge, and
  // 447 + 16 new keys still inside the capacity of 512.
  const std::vector<std::int64_t> before = {0, 1, 300, 17, 447, 128};
  const std::int64_t capacity = 512;
  std::uint64_t seed = 400;
  for (flashstep::DType type : {flashstep::DType::kFp32, flashstep::DType::kBf16}) {
    for (std::int64_t page_keys : {64, 256}) {
      for (std::int64_t Nq : {1, 16}) {
        for (bool causal : {false, true}) {
          for (bool append : {false, true}) {
            Problem p = flashstep::test::make_problem(static_cast<std::int64_t>(before.size()), 8,
                                                      Nq, capacity, 64, causal);
            p.H_kv = 2;
            p.dtype = type;
            CAPTURE(p.describe());
            CAPTURE(page_keys);
            CAPTURE(append);
            auto in = flashstep::random_inputs(p, seed++);
            Problem fresh = p;  // the new tokens: [B, H_kv, Nq, d]
            fresh.Nk = Nq;
            auto added = flashstep::random_inputs(fresh, seed++);
            round_inputs(p, in);
            round_inputs(fresh, added);
            const auto paged = flashstep::test::page_cache(p, in.K, in.V, page_keys, seed++);
            std::vector<float> pool_K = paged.K, pool_V = paged.V;
            std::vector<std::int64_t> keys = before;
            if (append) {
              flashstep::test::append_contiguous(p, in.K, in.V, added.K, added.V, before);
              for (std::int64_t& n : keys) n += Nq;
            }
            std::vector<float> O(static_cast<size_t>(p.q_elems()), NAN);
            std::vector<float> L(static_cast<size_t>(p.lse_elems()), NAN);
            sk::HostKvCache cache{pool_K.data(), pool_V.data(), before.data(),
                                  {paged.table.data(), paged.pages_per_seq, page_keys},
                                  append ? added.K.data() : nullptr,
                                  append ? added.V.data() : nullptr};
            sk::mirror_kvcache(p, {in.Q.data(), nullptr, nullptr, O.data(), L.data()}, cache,
                               sk::kModelSmCount);
            flashstep::test::check_sequences(p, in.Q, in.K, in.V, keys, O.data(), L.data());
            if (append) {  // the pool holds the new tokens at keys before[b] ..
              std::int64_t wrong = 0;
              for (std::int64_t b = 0; b < p.B; ++b) {
                for (std::int64_t h = 0; h < p.kv_heads(); ++h) {
                  for (std::int64_t i = 0; i < Nq; ++i) {
                    const float* got = flashstep::test::paged_key(p, paged, pool_K, b, h, before[b] + i);
                    const float* want = added.K.data() + ((b * p.kv_heads() + h) * Nq + i) * p.d;
                    wrong += !std::equal(want, want + p.d, got);
                  }
                }
              }
              CHECK(wrong == 0);
            }
          }
        }
      }
    }
  }
}
