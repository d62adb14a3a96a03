// Every stage's CPU mirror, in its stage's native type, against the fp64
// reference (fp32 within kFp32Tolerance, fp16 and bf16 by FlashAttention's
// rule: common/check.h), and its counts against the stage's closed-form model;
// plus the model facts the stage READMEs state.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/check.h"
#include "common/device.h"
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

TEST_CASE("models count 2-byte Q, K, V and O in fp16 and bf16; L, S and fp32 workspaces stay 4") {
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
      CHECK(low.nonmatmul_flops == full.nonmatmul_flops);
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

TEST_CASE("stage 06: split-Q and split-K move FA2's HBM bytes; split-K pays in SRAM and barriers") {
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

