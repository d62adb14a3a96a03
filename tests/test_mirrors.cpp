// Every stage's CPU mirror, in its stage's native type, against the fp64
// reference (fp32 within kFp32Tolerance, fp16 and bf16 by FlashAttention's
// rule: common/check.h), and its counts against the stage's closed-form model;
// plus the model facts the stage READMEs state, and stage 07's ladder.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/check.h"
#include "common/device.h"
#include "common/error.h"
#include "common/reference.h"
#include "common/rounding.h"
#include "common/stage.h"
#include "common/tile_mask.h"
#include "03_fa1_kv_outer/fa1_kv_outer.h"
#include "04_fa2_q_outer/fa2_q_outer.h"
#include "check_cost.h"
#include "shapes.h"

using flashstep::CausalMode;
using flashstep::Cost;
using flashstep::DType;
using flashstep::Problem;
using flashstep::Stage;
using flashstep::test::make_problem;
using flashstep::test::same_bits;
using flashstep::test::with_scale;

namespace {
const Stage& stage_named(std::string_view name) {
  for (const Stage& s : flashstep::all_stages()) {
    if (s.name == name) return s;
  }
  FAIL("stage " << name << " is not registered");
  throw;  // unreachable: FAIL throws
}

// Q, K and V rounded to p.dtype, as the runner rounds them for the device
// (unchanged in fp32): what a mirror in that type is given.
flashstep::Inputs rounded(const Problem& p, flashstep::Inputs in) {
  for (std::vector<float>* x : {&in.Q, &in.K, &in.V}) {
    flashstep::round_to_dtype(p.dtype, x->data(), static_cast<std::int64_t>(x->size()));
  }
  return in;
}

struct MirrorRun {
  std::vector<float> O, L;  // [B, H, Nq, d] and [B, H, Nq]
  Cost counted;
};

// The stage's mirror on the inputs rounded to p.dtype, O and L poisoned first.
MirrorRun run_mirror(const Stage& s, const Problem& p, const flashstep::Inputs& in) {
  const flashstep::Inputs sent = rounded(p, in);
  MirrorRun run;
  run.O.assign(static_cast<size_t>(p.q_elems()), NAN);
  run.L.assign(static_cast<size_t>(p.lse_elems()), NAN);
  run.counted =
      s.mirror(p, {sent.Q.data(), sent.K.data(), sent.V.data(), run.O.data(), run.L.data()});
  return run;
}

// O and L against the truth for p.dtype by its rule (check_forward), and
// exactly O = 0 and L = -inf in the rows that see no key.
void check_outputs(const Stage& s, const Problem& p, const flashstep::ForwardTruth& truth,
                   const MirrorRun& run) {
  const auto c = flashstep::check_forward(p, run.O.data(), s.writes_lse ? run.L.data() : nullptr,
                                          truth);
  CHECK_MESSAGE(c.ok(), c.summary());
  std::int64_t not_empty = 0;  // elements of keyless rows that are not O = 0, L = -inf
  for (std::int64_t bh = 0; bh < p.heads(); ++bh) {
    for (std::int64_t i = 0; i < p.Nq && p.visible_keys(i) == 0; ++i) {
      const auto row = static_cast<size_t>(bh * p.Nq + i);
      for (size_t k = 0; k < static_cast<size_t>(p.d); ++k) {
        not_empty += run.O[row * static_cast<size_t>(p.d) + k] != 0.0f;
      }
      if (s.writes_lse) not_empty += run.L[row] != -INFINITY;
    }
  }
  CHECK(not_empty == 0);
}

}  // namespace

TEST_CASE("CPU mirrors, each in its stage's native type, match the reference and the model") {
  std::vector<const Stage*> mirrored;
  for (const Stage& s : flashstep::all_stages()) {
    if (s.mirror) mirrored.push_back(&s);
  }
  CHECK(mirrored.size() >= 7);  // stages 03 and 04, and the five entries of stage 07
  std::uint64_t seed = 1;
  for (const Problem& ragged : flashstep::test::ragged_problems()) {
    const auto in = flashstep::random_inputs(ragged, seed++);
    // The truth for each type, computed once for the mirrors that run in it.
    std::map<DType, flashstep::ForwardTruth> truths;
    for (const Stage* s : mirrored) {
      Problem p = ragged;
      p.dtype = s->dtypes.front();  // fp32 for stages 03 and 04, bf16 for stage 07
      CAPTURE(s->name);
      CAPTURE(p.describe());
      auto truth = truths.find(p.dtype);
      if (truth == truths.end()) {
        truth = truths.emplace(p.dtype, flashstep::forward_truth(p, in)).first;
      }
      const MirrorRun run = run_mirror(*s, p, in);
      check_outputs(*s, p, truth->second, run);
      flashstep::test::check_counts_equal(run.counted, s->model(p));
    }
  }
}

TEST_CASE("models count 2-byte Q, K, V and O in fp16 and bf16, and 4-byte L, S and workspaces") {
  for (bool causal : {false, true}) {
    Problem p = make_problem(2, 3, 100, 130, 40, causal);
    Problem half = p;
    half.dtype = DType::kBf16;
    const std::int64_t q = p.q_elems(), kv = p.kv_elems(), S = p.score_elems(), rows = p.lse_elems();
    for (const Stage& s : flashstep::all_stages()) {
      CAPTURE(s.name);
      const Cost full = s.model(p), low = s.model(half);
      CHECK(low.hbm_read_bytes < full.hbm_read_bytes);
      CHECK(low.hbm_write_bytes < full.hbm_write_bytes);
      CHECK(low.matmul_flops == full.matmul_flops);
      // Stage 09 runs fp16 and bf16 on its tensor-core kernel, whose softmax
      // bookkeeping (per warp key slice, the slices merged at the end of a
      // split) is not the fp32 CUDA-core kernel's: test_split_kv.cpp checks
      // its own count against its mirror.
      if (s.name.rfind("09_", 0) != 0) CHECK(low.nonmatmul_flops == full.nonmatmul_flops);
      // The runner's allocation: Q, K, V and O halve, L does not.
      CHECK(flashstep::device_bytes_needed(s, p) - flashstep::device_bytes_needed(s, half) ==
            (2 * q + 2 * kv) * 2 + s.workspace_bytes(p) - s.workspace_bytes(half));
    }
    // Stage 02 in bf16: S stays fp32, P (2 bytes) gets its own array after it.
    const Stage& s02 = stage_named("02_safe_softmax");
    CHECK(s02.model(half).hbm_write_bytes == S * 4 + S * 2 + q * 2 + rows * 4);
    CHECK(s02.workspace_bytes(half) >= S * 4 + S * 2);
    CHECK(s02.workspace_bytes(p) == S * 4);  // fp32: P over S
    // Stage 03 in bf16: Q, K, V and the final O at 2 bytes; the running O_i
    // makes its Tc round trips in fp32 (O_acc, q * 4 bytes of workspace).
    const Stage& s03 = stage_named("03_fa1_kv_outer");
    CHECK(s03.model(p).hbm_write_bytes - s03.model(half).hbm_write_bytes == q * 2);
    CHECK(s03.workspace_bytes(half) == q * 4 + 2 * rows * 4);
    CHECK(s03.workspace_bytes(p) == 2 * rows * 4);
  }
}

TEST_CASE("stages 01 and 02 write S and P, each B*H*Nq*Nk floats, to HBM") {
  for (bool causal : {false, true}) {
    const Problem p = make_problem(2, 3, 100, 100, 40, causal);
    const std::int64_t S = p.score_elems() * flashstep::kFloatBytes;
    const std::int64_t O = p.q_elems() * flashstep::kFloatBytes;
    const std::int64_t L = p.lse_elems() * flashstep::kFloatBytes;
    CHECK(stage_named("01_naive").model(p).hbm_write_bytes == 2 * S + O);
    CHECK(stage_named("02_safe_softmax").model(p).hbm_write_bytes == 2 * S + O + L);
    // 02 pays one more read of S than 01 for the row max.
    CHECK(stage_named("02_safe_softmax").model(p).hbm_read_bytes -
              stage_named("01_naive").model(p).hbm_read_bytes == S);
  }
}

TEST_CASE("the README's model claims at N = 4096, d = 64: 04 < 03 < 02 in HBM bytes") {
  for (bool causal : {false, true}) {
    const Problem p = make_problem(1, 1, 4096, 4096, 64, causal);
    CAPTURE(causal);
    const Cost c02 = stage_named("02_safe_softmax").model(p);
    const Cost c03 = stage_named("03_fa1_kv_outer").model(p);
    const Cost c04 = stage_named("04_fa2_q_outer").model(p);
    CHECK(c03.hbm_bytes() < c02.hbm_bytes());
    CHECK(c04.hbm_bytes() < c03.hbm_bytes());
    CHECK(c04.nonmatmul_flops < c03.nonmatmul_flops);
    if (causal) CHECK(c04.skipped_tiles > 0);  // whole K/V blocks above the diagonal
    else CHECK(c04.skipped_tiles == 0);
  }
}

TEST_CASE("stage 05 moves what stage 04 moves, spread over Tr * B * H thread blocks") {
  for (const Problem& p : flashstep::test::ragged_problems()) {
    CAPTURE(p.describe());
    Cost c04 = stage_named("04_fa2_q_outer").model(p);
    const Cost c05 = stage_named("05_sequence_parallel").model(p);
    const std::int64_t q_blocks = (p.Nq + 63) / 64;  // Br = 64
    CHECK(c04.thread_blocks == p.heads());
    CHECK(c05.thread_blocks == q_blocks * p.heads());
    c04.thread_blocks = c05.thread_blocks;
    CHECK(c04 == c05);
  }
}

TEST_CASE("stage 06: split-Q and split-K move FA2's HBM bytes, split-K pays in SRAM and barriers") {
  const auto both = flashstep::select_stages("06");
  REQUIRE(both.size() == 2);
  const Stage& q = stage_named("06_warp_split_q");
  const Stage& k = stage_named("06_warp_split_k");
  CHECK(q.writes_lse);
  CHECK(k.writes_lse);
  for (const Problem& p : flashstep::test::ragged_problems()) {
    CAPTURE(p.describe());
    const Cost cq = q.model(p);
    const Cost ck = k.model(p);
    // O and L written once, whatever the tiles.
    CHECK(cq.hbm_write_bytes == p.heads() * p.Nq * (p.d + 1) * flashstep::kFloatBytes);
    CHECK(ck.hbm_write_bytes == cq.hbm_write_bytes);
    CHECK(ck.sram_bytes() > cq.sram_bytes());
    CHECK(ck.barriers > cq.barriers);
  }
  // Non-causal, Nq = Nk = 256, d = 64, one head: split-Q's 128-row Q blocks
  // each read Qi once and all 256 keys of K and V once: 2 blocks, 2 barriers
  // per K/V tile of 64 keys.
  const Problem p = make_problem(1, 1, 256, 256, 64, false);
  const Cost cq = q.model(p);
  CHECK(cq.thread_blocks == 2);
  CHECK(cq.hbm_read_bytes == 2 * (128 + 2 * 256) * 64 * flashstep::kFloatBytes);
  CHECK(cq.barriers == 2 * 2 * (256 / 64));
}

// Stage 07: the tensor-core forward, its ablation ladder and its mirror.

namespace {

// The five stage-07 entries of the forward's ladder, steps 1-4 then the
// stage itself (not 07_tensor_core_deterministic: the same forward again,
// registered for its backward).
std::vector<const Stage*> stage07_ladder() {
  std::vector<const Stage*> ladder;
  for (const Stage* s : flashstep::select_stages("07")) {
    if (s->name != "07_tensor_core_deterministic") ladder.push_back(s);
  }
  REQUIRE(ladder.size() == 5);
  return ladder;
}

// The ragged grid without its two largest shapes (Nq = 1023, Nk = 1024: the
// first test case runs them), plus one with several Q blocks and K/V blocks
// of every step's tiles, rows that see no key when causal, and ragged edges.
std::vector<Problem> stage07_problems() {
  std::vector<Problem> out;
  for (const Problem& p : flashstep::test::ragged_problems()) {
    if (p.Nq * p.Nk <= 256 * 256) out.push_back(p);
  }
  for (bool causal : {false, true}) out.push_back(make_problem(1, 2, 300, 290, 64, causal));
  return out;
}

}  // namespace

TEST_CASE("stage 07's mirrors, in each type, at negative, zero and large scales: rule and model") {
  // The GPU test's scales: a negative one runs as |scale| on -Q, 0 as the
  // smallest normal float (which must still weigh every visible key alike),
  // and a large one puts the logits past fp32 exp's range.
  const double scales[] = {-0.5, 0.0, 2.0};
  const auto ladder = stage07_ladder();
  std::uint64_t seed = 700;
  for (const Problem& ragged : stage07_problems()) {
    for (double scale : scales) {
      for (DType t : {DType::kBf16, DType::kFp16}) {
        const Problem p = with_scale(ragged, scale, t);
        const auto in = flashstep::random_inputs(p, seed++);
        const flashstep::ForwardTruth truth = flashstep::forward_truth(p, in);
        for (const Stage* s : ladder) {
          if (!s->supports(t)) continue;
          CAPTURE(s->name);
          CAPTURE(p.describe());
          const MirrorRun run = run_mirror(*s, p, in);
          check_outputs(*s, p, truth, run);
          flashstep::test::check_counts_equal(run.counted, s->model(p));
        }
      }
    }
  }
}

TEST_CASE("stage 07: a negative scale is |scale| on -Q, bit for bit, for one read and write of Q") {
  for (const Stage* s : stage07_ladder()) {
    for (const Problem& ragged : stage07_problems()) {
      const double scale = 0.3;
      const Problem neg = with_scale(ragged, -scale, DType::kBf16);
      const Problem pos = with_scale(ragged, scale, DType::kBf16);
      CAPTURE(s->name);
      CAPTURE(neg.describe());
      const auto in = rounded(neg, flashstep::random_inputs(neg, 7));
      auto flipped = in;
      for (float& x : flipped.Q) x = -x;
      const MirrorRun a = run_mirror(*s, neg, in);
      const MirrorRun b = run_mirror(*s, pos, flipped);
      CHECK(same_bits(a.O, b.O));
      CHECK(same_bits(a.L, b.L));
      // The flip reads and writes Qi in shared memory once per Q block that
      // visits a K/V block (steps 1-2: every Q block).
      const std::int64_t flip_reads = a.counted.sram_read_bytes - b.counted.sram_read_bytes;
      CHECK(flip_reads == a.counted.sram_write_bytes - b.counted.sram_write_bytes);
      CHECK(flip_reads <= neg.q_elems() * 2);
      if (!neg.causal) CHECK(flip_reads == neg.q_elems() * 2);
      Cost rest = a.counted;
      rest.sram_read_bytes -= flip_reads;
      rest.sram_write_bytes -= flip_reads;
      CHECK(rest == b.counted);
    }
  }
}

TEST_CASE("stage 07's ladder: steps 1-4 compute the same numbers, and P~'s round trip costs more") {
  const auto ladder = stage07_ladder();
  std::uint64_t seed = 770;
  for (const Problem& ragged : stage07_problems()) {
    const Problem p = with_scale(ragged, ragged.softmax_scale(), DType::kBf16);
    CAPTURE(p.describe());
    const auto in = flashstep::random_inputs(p, seed++);
    const MirrorRun step4 = run_mirror(*ladder[3], p, in);
    for (int step = 0; step < 3; ++step) {
      CAPTURE(ladder[step]->name);
      // ldmatrix, the swizzle and cp.async change how the tiles move, and P~
      // rounds to bf16 the same in shared memory as in registers.
      const MirrorRun run = run_mirror(*ladder[step], p, in);
      CHECK(same_bits(run.O, step4.O));
      CHECK(same_bits(run.L, step4.L));
      // The model sees no difference between steps 1-3; each writes P~ to
      // shared memory and reads it back: one element per score computed.
      CHECK(ladder[step]->model(p) == ladder[2]->model(p));
      Cost trip = ladder[step]->model(p);
      const std::int64_t scores = trip.matmul_flops / (4 * p.d);
      trip.sram_read_bytes -= scores * 2;
      trip.sram_write_bytes -= scores * 2;
      CHECK(trip == ladder[3]->model(p));
    }
    // At d > 128 the stage's tiles are the ladder's: step 5 is step 4.
    if (p.d > 128) {
      const MirrorRun step5 = run_mirror(*ladder[4], p, in);
      CHECK(same_bits(step5.O, step4.O));
      CHECK(ladder[4]->model(p) == ladder[3]->model(p));
    }
  }
}

TEST_CASE("stage 07: a row that sees one key copies its V row exactly, in bf16 and fp16") {
  const Stage& s = stage_named("07_tensor_core");
  for (DType t : s.dtypes) {
    for (bool causal : {false, true}) {
      // Causal with Nq > Nk: the last row sees the one key, the rest none.
      const Problem p = with_scale(make_problem(2, 1, causal ? 130 : 1, 1, 40, causal), 0.125, t);
      CAPTURE(p.describe());
      const auto in = rounded(p, flashstep::random_inputs(p, 71));
      const MirrorRun run = run_mirror(s, p, in);
      for (std::int64_t bh = 0; bh < p.heads(); ++bh) {
        const std::int64_t last = bh * p.Nq + p.Nq - 1;
        for (std::int64_t k = 0; k < p.d; ++k) {
          CHECK(run.O[static_cast<size_t>(last * p.d + k)] ==
                in.V[static_cast<size_t>(bh * p.d + k)]);
        }
      }
    }
  }
}

TEST_CASE("stage 07's mirrors refuse the types their kernels lack") {
  const auto ladder = stage07_ladder();
  for (const Stage* s : ladder) {
    for (DType t : {DType::kFp32, DType::kFp16, DType::kBf16}) {
      const Problem p = with_scale(make_problem(1, 1, 3, 5, 8, false), 0.5, t);
      std::vector<float> Q(24), K(40), V(40), O(24), L(3);
      const flashstep::HostTensors tensors{Q.data(), K.data(), V.data(), O.data(), L.data()};
      CAPTURE(s->name);
      CAPTURE(p.describe());
      if (s->supports(t)) CHECK_NOTHROW(s->mirror(p, tensors));
      else CHECK_THROWS_AS(s->mirror(p, tensors), flashstep::Error);
    }
  }
}

TEST_CASE("stage 07's model by hand: one head, Nq = Nk = 256, d = 64, bf16, the stage's tiles") {
  // Br = Bc = 128 with 4 warps of 32 rows: 2 Q blocks, each visiting 2 K/V
  // blocks (256 keys); 2-byte elements, L 4 bytes.
  const Problem p = with_scale(make_problem(1, 1, 256, 256, 64, false), 0.125, DType::kBf16);
  const std::int64_t blocks = 2, R = 128, n = 2, C = 256, d = 64, W = 4, e = 2;
  const Cost c = stage_named("07_tensor_core").model(p);
  CHECK(c.thread_blocks == blocks);
  CHECK(c.skipped_tiles == 0);
  CHECK(c.hbm_read_bytes == blocks * (R + 2 * C) * d * e);       // Qi once, Kj and Vj per block
  CHECK(c.hbm_write_bytes == blocks * R * (d * e + 4));           // O and L
  CHECK(c.sram_write_bytes == blocks * (R + 2 * C + R) * d * e);  // Qi, Kj, Vj in; O staged
  // Qi's fragments per K/V block, each warp all of Kj and Vj, O copied out.
  CHECK(c.sram_read_bytes == blocks * (n * R * d + W * 2 * C * d + R * d) * e);
  CHECK(c.matmul_flops == blocks * 4 * R * C * d);
  // 5 per score; 4 + d per row and K/V block; d + 4 per row at the end.
  CHECK(c.nonmatmul_flops == blocks * (5 * R * C + n * R * (4 + d) + R * (d + 4)));
}

TEST_CASE("stage 07: 32 rows a warp halve K and V's fragment reads, and their HBM reads") {
  // Non-causal, N a multiple of 128: step 4 (64 x 64, 4 warps of 16 rows)
  // against the stage's tiles at d = 64 (128 x 128) and d = 128 (128 x 64),
  // both 4 warps of 32 rows. Same FLOPs.
  const auto ladder = stage07_ladder();
  for (std::int64_t d : {64, 128}) {
    const Problem p = with_scale(make_problem(2, 4, 4096, 4096, d, false), 0.125, DType::kBf16);
    CAPTURE(p.describe());
    const Cost step4 = ladder[3]->model(p), step5 = ladder[4]->model(p);
    REQUIRE(step5.matmul_flops == step4.matmul_flops);
    const std::int64_t e = 2, q = p.q_elems() * e;  // bytes of Q, and of O
    // SRAM reads: Qi's fragments once per K/V block, K's and V's once per
    // warp and Q block, O copied out once.
    const std::int64_t bc = d == 64 ? 128 : 64;
    const std::int64_t q_frag4 = p.q_elems() * (p.Nk / 64) * e;
    const std::int64_t q_frag5 = p.q_elems() * (p.Nk / bc) * e;
    CHECK(step5.sram_read_bytes - q_frag5 - q == (step4.sram_read_bytes - q_frag4 - q) / 2);
    // At d = 64 the K/V blocks double too, and all the fragment reads halve.
    if (d == 64) CHECK(step5.sram_read_bytes - q == (step4.sram_read_bytes - q) / 2);
    // HBM: twice the rows per Q block, so half the Q blocks read all of K and V.
    CHECK(step5.hbm_read_bytes - q == (step4.hbm_read_bytes - q) / 2);
    CHECK(step5.hbm_write_bytes == step4.hbm_write_bytes);
  }
}

// Causal masking, FlashAttention-2's lesson (common/tile_mask.h): skip the
// tiles above the diagonal, test the mask only in the tiles that cross it.

namespace {

// Problems with every kind of tile: several Q and K/V blocks, Nq != Nk both
// ways, rows that see no key (causal, Nq > Nk), ragged ends, and a square one.
std::vector<Problem> mask_problems() {
  std::vector<Problem> out;
  for (const Problem& p : flashstep::test::ragged_problems()) {
    if (p.Nq * p.Nk <= 256 * 256) out.push_back(p);
  }
  for (bool causal : {false, true}) {
    out.push_back(make_problem(1, 2, 300, 290, 64, causal));
    out.push_back(make_problem(2, 1, 200, 70, 40, causal));
    out.push_back(make_problem(1, 1, 70, 300, 59, causal));
    out.push_back(make_problem(1, 1, 256, 256, 16, causal));
  }
  return out;
}

MirrorRun run_mode(Cost (*mirror)(const Problem&, const flashstep::HostTensors&, CausalMode),
                   const Problem& p, const flashstep::Inputs& in, CausalMode mode) {
  MirrorRun run;
  run.O.assign(static_cast<size_t>(p.q_elems()), NAN);
  run.L.assign(static_cast<size_t>(p.lse_elems()), NAN);
  run.counted = mirror(p, {in.Q.data(), in.K.data(), in.V.data(), run.O.data(), run.L.data()},
                       mode);
  return run;
}

// Scores a forward computes: its matmul FLOPs are 4 d per score (Qi Kj^T and P~ Vj).
std::int64_t scores(const Cost& c, const Problem& p) { return c.matmul_flops / (4 * p.d); }

}  // namespace

TEST_CASE("stage 04 in each causal mode: the same O and L bit for bit, the counts of fa2::model") {
  namespace s04 = flashstep::fa2_q_outer;
  std::uint64_t seed = 4000;
  for (const Problem& p : mask_problems()) {
    CAPTURE(p.describe());
    const auto in = flashstep::random_inputs(p, seed++);
    const MirrorRun fast = run_mode(s04::mirror, p, in, CausalMode::kFast);
    check_outputs(stage_named("04_fa2_q_outer"), p, flashstep::forward_truth(p, in), fast);
    std::map<CausalMode, Cost> counted;
    for (CausalMode mode : {CausalMode::kFast, CausalMode::kNoSkip, CausalMode::kMaskEvery}) {
      CAPTURE(static_cast<int>(mode));
      const MirrorRun run = run_mode(s04::mirror, p, in, mode);
      CHECK(same_bits(run.O, fast.O));
      CHECK(same_bits(run.L, fast.L));
      flashstep::test::check_counts_equal(run.counted, flashstep::fa2::model(p, p.heads(), mode));
      counted[mode] = run.counted;
    }
    const Cost& f = counted[CausalMode::kFast];
    const Cost& no_skip = counted[CausalMode::kNoSkip];
    const Cost& every = counted[CausalMode::kMaskEvery];
    // Skipping off visits every tile: the whole Nq x Nk, nothing skipped.
    CHECK(no_skip.skipped_tiles == 0);
    CHECK(scores(no_skip, p) == p.score_elems());
    // Masking every tile tests every score it computes, and skips what kFast skips.
    CHECK(every.mask_tests == scores(every, p));
    CHECK(every.skipped_tiles == f.skipped_tiles);
    // kFast tests only some of its scores: none at all when no tile crosses
    // the diagonal or an end (a non-causal problem in whole tiles).
    CHECK(f.mask_tests <= every.mask_tests);
    const bool whole_tiles = p.Nq % flashstep::fa2::kBr == 0 && p.Nk % flashstep::fa2::kBc == 0;
    if (!p.causal && whole_tiles) CHECK(f.mask_tests == 0);
    // Causal with two Q blocks and two K/V blocks or more: some block lies
    // wholly below the diagonal and goes untested.
    const bool below = p.Nq >= 2 * flashstep::fa2::kBr && p.Nk >= 2 * flashstep::fa2::kBc;
    if (p.causal && below) CHECK(f.mask_tests < every.mask_tests);
  }
}

TEST_CASE("stage 03 masking every tile as FlashAttention-1 does: the same O and L bit for bit") {
  namespace s03 = flashstep::fa1_kv_outer;
  std::uint64_t seed = 3000;
  for (const Problem& p : mask_problems()) {
    CAPTURE(p.describe());
    const auto in = flashstep::random_inputs(p, seed++);
    const MirrorRun fast = run_mode(s03::mirror, p, in, CausalMode::kFast);
    flashstep::test::check_counts_equal(fast.counted, s03::model(p));
    for (CausalMode mode : {CausalMode::kNoSkip, CausalMode::kMaskEvery}) {
      CAPTURE(static_cast<int>(mode));
      const MirrorRun run = run_mode(s03::mirror, p, in, mode);
      CHECK(same_bits(run.O, fast.O));
      CHECK(same_bits(run.L, fast.L));
      // FlashAttention-1 visits every tile: only the mask tests differ.
      Cost rest = run.counted;
      rest.mask_tests = fast.counted.mask_tests;
      CHECK(rest == fast.counted);
      const std::int64_t tests = mode == CausalMode::kMaskEvery ? p.score_elems()
                                                                 : fast.counted.mask_tests;
      CHECK(run.counted.mask_tests == tests);
    }
  }
}

TEST_CASE("mask tests by hand: one head, Nq = Nk = 256, 64 x 64 tiles (stages 03, 04, 05)") {
  // Causal and square: of the 4 x 4 tiles, the 4 on the diagonal are tested
  // (64 x 64 scores each), the 6 below it are not, the 6 above are skipped
  // (stage 04) or visited and tested whole (stage 03, or skipping off).
  const Problem causal = make_problem(1, 1, 256, 256, 64, true);
  const Cost c04 = stage_named("04_fa2_q_outer").model(causal);
  CHECK(c04.skipped_tiles == 6);
  CHECK(c04.mask_tests == 4 * 64 * 64);
  CHECK(stage_named("05_sequence_parallel").model(causal).mask_tests == 4 * 64 * 64);
  CHECK(stage_named("03_fa1_kv_outer").model(causal).mask_tests == (4 + 6) * 64 * 64);
  CHECK(flashstep::fa2::model(causal, 1, CausalMode::kNoSkip).mask_tests == (4 + 6) * 64 * 64);
  CHECK(flashstep::fa2::model(causal, 1, CausalMode::kMaskEvery).mask_tests == 10 * 64 * 64);
  // Non-causal in whole tiles: nothing to test. With Nk = 200, each Q block's
  // last K/V block holds 200 - 3 * 64 = 8 keys and 56 of padding: tested.
  CHECK(stage_named("04_fa2_q_outer").model(make_problem(1, 1, 256, 256, 64, false)).mask_tests ==
        0);
  CHECK(stage_named("04_fa2_q_outer").model(make_problem(1, 1, 256, 200, 64, false)).mask_tests ==
        256 * 8);
  // Split-Q classifies the 16 rows of each warp (Bc = 64 at d = 64): each of
  // the 16 warp slices of 256 rows crosses the diagonal in one K/V tile.
  CHECK(stage_named("06_warp_split_q").model(causal).mask_tests == 16 * 16 * 64);
}
