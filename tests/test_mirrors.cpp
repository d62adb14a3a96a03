// Every stage's CPU mirror against the fp64 reference, and its counts against
// the stage's closed-form model; plus the model facts the stage READMEs state.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <string_view>

#include "common/check.h"
#include "common/device.h"
#include "common/reference.h"
#include "common/stage.h"
#include "check_cost.h"
#include "shapes.h"

using flashstep::Cost;
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

}  // namespace

TEST_CASE("CPU mirrors match the fp64 reference and count exactly what their model says") {
  int mirrors = 0;
  for (const Stage& s : flashstep::all_stages()) {
    if (!s.mirror) continue;
    ++mirrors;
    std::uint64_t seed = 1;
    for (const Problem& p : flashstep::test::ragged_problems()) {
      CAPTURE(s.name);
      CAPTURE(p.describe());
      const auto in = flashstep::random_inputs(p, seed++);
      std::vector<float> O(static_cast<size_t>(p.q_elems()), NAN);
      std::vector<float> L(static_cast<size_t>(p.lse_elems()), NAN);
      const Cost counted = s.mirror(p, {in.Q.data(), in.K.data(), in.V.data(), O.data(), L.data()});
      const auto ref = flashstep::reference_forward(p, in.Q.data(), in.K.data(), in.V.data());
      const auto o = flashstep::compare(O.data(), ref.O, flashstep::kFp32Tolerance);
      CHECK_MESSAGE(o.ok(), "O: " << o.summary());
      if (s.writes_lse) {
        const auto l = flashstep::compare(L.data(), ref.L, flashstep::kFp32Tolerance);
        CHECK_MESSAGE(l.ok(), "L: " << l.summary());
      }
      flashstep::test::check_counts_equal(counted, s.model(p));
    }
  }
  CHECK(mirrors >= 2);  // stages 03 and 04 have mirrors
}

TEST_CASE("models count 2-byte Q, K, V and O in fp16 and bf16; L, S and fp32 workspaces stay 4") {
  using flashstep::DType;
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
