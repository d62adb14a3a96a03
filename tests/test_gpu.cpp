// The shared GPU test body: every selected stage, in each element type it
// runs in, against the fp64 reference on the ragged grid, causal and not,
// outputs poisoned before each run. fp32 is held to kFp32Tolerance, fp16 and
// bf16 to FlashAttention's rule (common/check.h); the backwards likewise, in
// each type they run in (kFp32GradTolerance, or the gradients' rule).
//
//   test_gpu --stage=03     stages whose name starts "03_" (what CTest runs)
//   test_gpu                every registered stage
//
// Without a usable CUDA device it prints why and exits FLASHSTEP_SKIP_EXIT,
// which CTest reports as skipped, not passed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <initializer_list>
#include <string_view>
#include <vector>

#include "common/check.h"
#include "common/device.h"
#include "common/error.h"
#include "common/reference.h"
#include "common/stage.h"
#include "shapes.h"

using flashstep::DeviceRun;
using flashstep::DType;
using flashstep::Problem;
using flashstep::Stage;

namespace {

std::string g_selector = "all";

// The selected stages this GPU can run: a stage built for another
// architecture (Stage::arch) is left out, and main() says so in one line.
std::vector<const Stage*> selected() {
  std::vector<const Stage*> out;
  for (const Stage* s : flashstep::select_stages(g_selector)) {
    if (flashstep::stage_available(*s)) out.push_back(s);
  }
  return out;
}

}  // namespace

/// Whether the stage named `name` is among those --stage selects (for test
/// cases in other files: test_kvcache_gpu.cpp).
bool gpu_test_selects(std::string_view name) {
  for (const Stage* s : selected()) {
    if (s->name == name) return true;
  }
  return false;
}

namespace {

struct Outputs {
  std::vector<float> O, L;
};

Outputs run_stage(const Stage& s, const Problem& p, const flashstep::Inputs& in) {
  DeviceRun run(s, p, in.Q.data(), in.K.data(), in.V.data());
  Outputs out;
  run.run(out.O, out.L);
  return out;
}

// O (and L, for a stage that writes it) against the truth, by p.dtype's rule.
void check_outputs(const Stage& s, const Problem& p, const Outputs& got,
                   const flashstep::ForwardTruth& truth) {
  const auto c = flashstep::check_forward(p, got.O.data(), s.writes_lse ? got.L.data() : nullptr,
                                          truth);
  CHECK_MESSAGE(c.ok(), c.summary());
}

// p in the element type t.
Problem typed(Problem p, DType t) {
  p.dtype = t;
  return p;
}

// Runs s on p with fresh inputs drawn from `seed`, checks O and L against the
// truth, and checks that rows that see no key are exactly O = 0 and L = -inf,
// never NaN.
void check_stage_on(const Stage& s, const Problem& p, std::uint64_t seed) {
  const auto in = flashstep::random_inputs(p, seed);
  const Outputs got = run_stage(s, p, in);
  check_outputs(s, p, got, flashstep::forward_truth(p, in));
  for (std::int64_t bh = 0; bh < p.heads(); ++bh) {
    for (std::int64_t i = 0; i < p.Nq && p.visible_keys(i) == 0; ++i) {
      const std::int64_t row = bh * p.Nq + i;
      for (std::int64_t k = 0; k < p.d; ++k) REQUIRE(got.O[row * p.d + k] == 0.0f);
      if (s.writes_lse) REQUIRE(got.L[row] == -INFINITY);
    }
  }
}

// A problem whose logits lie near 64 * 16 / sqrt(64) = 128, beyond fp32 exp's
// range (~88.7): B = 1, H = 2, Nq = 37, Nk = 45, d = 64 in type t.
Problem large_logit_problem(DType t) {
  Problem p = flashstep::test::make_problem(1, 2, 37, 45, 64, false);
  p.dtype = t;
  return p;
}

// Random inputs with Q and K rows near 4, so that every logit of
// large_logit_problem is near 128. The spread must survive rounding to the
// type: bf16's spacing near 4 is 1/32, which would flatten fp32's 0.01 to
// equal rows.
flashstep::Inputs large_logit_inputs(const Problem& p, std::uint64_t seed) {
  auto in = flashstep::random_inputs(p, seed);
  const float spread = p.dtype == DType::kFp32 ? 0.01f : 0.25f;
  for (float& x : in.Q) x = 4.0f + spread * x;
  for (float& x : in.K) x = 4.0f + spread * x;
  return in;
}

bool all_finite(const std::vector<float>& v) {
  for (float x : v) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("every stage, in each of its types, matches the reference on the ragged grid") {
  std::uint64_t seed = 1000;
  for (const Stage* s : selected()) {
    for (DType t : s->dtypes) {
      for (const Problem& ragged : flashstep::test::ragged_problems()) {
        const Problem p = typed(ragged, t);
        CAPTURE(s->name);
        CAPTURE(p.describe());
        check_stage_on(*s, p, seed++);  // fresh data for every check
      }
    }
  }
}

TEST_CASE("grouped-query heads (H / H_kv in 1, 4, 8, 32): the stages that run them match the reference") {
  std::uint64_t seed = 6000;
  for (const Stage* s : selected()) {
    if (!s->grouped_heads) continue;
    for (DType t : s->dtypes) {
      for (const Problem& grouped : flashstep::test::grouped_problems()) {
        const Problem p = typed(grouped, t);
        CAPTURE(s->name);
        CAPTURE(p.describe());
        check_stage_on(*s, p, seed++);  // fresh data for every check
      }
    }
  }
}

TEST_CASE("stage 08: several K/V tiles and items a block at d = 128, ragged, causal and not, grouped") {
  // The ragged grid gives stage 08's persistent kernels (steps 3-5) at most
  // two K/V tiles and one item a block at d = 128, so no K/V buffer is
  // filled twice there. Here Nk = 600 keys are 5 tiles of 128 (the last 88
  // keys), and 70 heads of two 128-row Q blocks are 140 items, more than an H100 or
  // H200 has SMs: each buffer's later phases, and a block's next item.
  std::vector<const Stage*> stage08;
  for (const Stage* s : selected()) {
    if (s->name.substr(0, 3) == "08_") stage08.push_back(s);
  }
  if (stage08.empty()) return;  // the reference below is seconds of CPU time
  // Each type with a K/V head a query head, then bf16 with grouped heads: 70
  // query heads on 7 K/V heads (groups of 10), so a block's items change K/V
  // head within its run of heads.
  struct Run {
    DType t;
    std::int64_t H_kv;
  };
  const Run runs[] = {{DType::kBf16, 70}, {DType::kFp16, 70}, {DType::kBf16, 7}};
  std::uint64_t seed = 5000;
  for (bool causal : {false, true}) {
    for (const Run& run : runs) {
      const DType t = run.t;
      Problem p = typed(flashstep::test::make_problem(1, 70, 200, 600, 128, causal), t);
      p.H_kv = run.H_kv;
      const auto in = flashstep::random_inputs(p, seed++);
      const flashstep::ForwardTruth truth = flashstep::forward_truth(p, in);
      for (const Stage* s : stage08) {
        if (!s->supports(t)) continue;
        CAPTURE(s->name);
        CAPTURE(p.describe());
        check_outputs(*s, p, run_stage(*s, p, in), truth);
      }
    }
  }
}

TEST_CASE("stage 09: long decodes (many splits, many K/V tiles a split) in every type") {
  // Nq = 1 and 4 against 9k to 40k keys: dozens of splits of hundreds to
  // thousands of keys, so the K/V pipeline of each split kernel runs many
  // tiles deep (the one-block entry: the whole sequence in one block); MQA
  // with 32 query heads (a full 32-row tile), GQA, MHA; every d bucket. MQA
  // at 140k keys takes 137 splits of 1,024 keys (past kShortSplitCap),
  // merged by 8 warps a row in runs of 18; at 40k 125 in runs of 16; Nq = 4,
  // 49 in runs of 13.
  struct Decode {
    std::int64_t B, H, H_kv, Nq, Nk, d;
    bool causal;
  };
  const Decode shapes[] = {{1, 32, 1, 1, 40000, 128, false}, {2, 8, 2, 4, 20011, 64, true},
                           {1, 4, 4, 1, 9000, 256, false},   {1, 32, 1, 4, 12345, 128, true},
                           {1, 8, 1, 3, 9999, 59, true},     {1, 32, 1, 1, 140000, 128, false}};
  std::uint64_t seed = 6500;
  for (const Stage* s : selected()) {
    if (std::string_view(s->name).substr(0, 3) != "09_") continue;
    for (DType t : s->dtypes) {
      for (const Decode& sh : shapes) {
        Problem p = flashstep::test::make_problem(sh.B, sh.H, sh.Nq, sh.Nk, sh.d, sh.causal);
        p.H_kv = sh.H_kv;
        p.dtype = t;
        CAPTURE(s->name);
        CAPTURE(p.describe());
        check_stage_on(*s, p, seed++);
      }
    }
  }
}

TEST_CASE("stage 09 in fp32: both register-tile layouts at every d bucket, either side of the rule") {
  // fp32_wide (split_kv_plan.h): groups of up to 8 rows take the narrow
  // layout (a row a warp), from 9 the wide one (4-row register tiles). 8 and
  // 9 rows (G = 8, Nq = 1; G = 3, Nq = 3), a full 32-row tile and a ragged
  // second one (G = 8, Nq = 5), at d = 64 (two key groups in P~ V), 128,
  // 256 (two column quads a lane) and 40 (element-by-element copies), with
  // ragged key counts (the last tile part padding), causal and not.
  struct Decode {
    std::int64_t H, H_kv, Nq, Nk, d;
  };
  const Decode shapes[] = {{8, 1, 1, 1000, 64}, {3, 1, 3, 1000, 64},  {8, 1, 1, 777, 128},
                           {3, 1, 3, 777, 128}, {8, 1, 5, 2049, 128}, {8, 1, 1, 555, 256},
                           {3, 1, 3, 555, 256}, {8, 1, 1, 333, 40},   {3, 1, 3, 333, 40}};
  std::uint64_t seed = 6600;
  for (const Stage* s : selected()) {
    if (std::string_view(s->name).substr(0, 3) != "09_") continue;
    for (const Decode& sh : shapes) {
      for (bool causal : {false, true}) {
        Problem p = flashstep::test::make_problem(2, sh.H, sh.Nq, sh.Nk, sh.d, causal);
        p.H_kv = sh.H_kv;
        p.dtype = DType::kFp32;
        CAPTURE(s->name);
        CAPTURE(p.describe());
        check_stage_on(*s, p, seed++);
      }
    }
  }
}

TEST_CASE("grouped-query heads: a stage without them is refused by the runner, in one line") {
  Problem p = flashstep::test::make_problem(1, 8, 4, 4, 16, false);
  p.H_kv = 2;
  const auto in = flashstep::random_inputs(p, 61);
  for (const Stage* s : selected()) {
    if (s->grouped_heads) continue;
    CAPTURE(s->name);
    p.dtype = s->dtypes.front();
    CHECK_THROWS_WITH_AS(DeviceRun(*s, p, in.Q.data(), in.K.data(), in.V.data()),
                         doctest::Contains("does not run grouped-query attention"),
                         flashstep::Error);
  }
}

TEST_CASE("logits beyond fp32 exp's range (~88.7): only a stage that declares it fails") {
  for (const Stage* s : selected()) {
    for (DType t : s->dtypes) {
      const Problem p = large_logit_problem(t);
      CAPTURE(s->name);
      CAPTURE(p.describe());
      const flashstep::Inputs in = large_logit_inputs(p, 77);
      const Outputs got = run_stage(*s, p, in);
      if (!s->known_failure.empty()) {
        // Stage 01 knowingly fails here: exp overflows and the rows become NaN.
        CHECK_FALSE(all_finite(got.O));
        MESSAGE("stage " << s->name << " knowingly fails on logits near 128: " << s->known_failure);
      } else {
        check_outputs(*s, p, got, flashstep::forward_truth(p, in));
      }
    }
  }
}

namespace {

// Stage s in type t on `base` under each of `scales`, causal and not, against
// fp64, with fresh inputs each (seeds from `seed` on).
void check_scales(const Stage& s, const Problem& base, DType t, std::initializer_list<double> scales,
                  std::uint64_t& seed) {
  for (double scale : scales) {
    for (bool causal : {false, true}) {
      Problem p = base;
      p.causal = causal;
      p.dtype = t;
      p.scale = scale;
      CAPTURE(s.name);
      CAPTURE(p.describe());
      const auto in = flashstep::random_inputs(p, seed++);
      check_outputs(s, p, run_stage(s, p, in), flashstep::forward_truth(p, in));
    }
  }
}

}  // namespace

TEST_CASE("any finite softmax scale: negative, zero and large, causal and not") {
  // The contract allows any finite scale. A kernel that takes the row max
  // over raw scores and scales inside the exponential (stage 07, as
  // FlashAttention-2 does) is right only for a positive scale unless it
  // handles the others: a negative scale flips which raw score is largest,
  // and 0 turns a masked key's -inf into -inf * 0 = NaN. The large scale, 8x
  // the default at d = 64, keeps the largest logit near 55 (q.k has mean 16
  // and spread 10 here), inside stage 01's exp range (88.7).
  std::uint64_t seed = 4000;
  const Problem base = flashstep::test::make_problem(1, 2, 97, 131, 64, false);
  for (const Stage* s : selected()) {
    for (DType t : s->dtypes) check_scales(*s, base, t, {-0.5, 0.0, 1.0}, seed);
  }
}

TEST_CASE("stage 09, wide groups (the Hopper kernel in 16 bits): negative, zero and large scales") {
  // MQA on 32 heads with Nq = 4 at d = 128: 128 rows a K/V head, which on
  // sm_90 run split_wgmma_kernel, whose softmax takes the max over raw
  // scores for a positive scale and scales first otherwise (the test above
  // runs d = 64, where the group stays on the mma.sync kernel).
  std::uint64_t seed = 4100;
  Problem base = flashstep::test::make_problem(1, 32, 4, 300, 128, false);
  base.H_kv = 1;
  for (const Stage* s : selected()) {
    if (std::string_view(s->name).substr(0, 3) != "09_") continue;
    for (DType t : {DType::kBf16, DType::kFp16}) check_scales(*s, base, t, {-0.5, 0.0, 0.5}, seed);
  }
}

TEST_CASE("NaN in Q or K reaches exactly the rows it touches; the rest stay right") {
  // Causal with Nk > Nq: query i sees keys 0 .. i + 30, so a key near the end
  // is seen by the last rows only. One NaN in Q and one in K, in different
  // heads: the fp64 reference (which lets NaN flow through its arithmetic)
  // says which rows of O become NaN. The stages must give NaN exactly there
  // (flashstep.h promises it) and match the reference everywhere else. (NaN
  // in V is not tested this way: a kernel multiplies whole tiles of V, and
  // 0 x NaN = NaN reaches rows that give that key zero weight, as in
  // PyTorch's math backend; flashstep.h says so.)
  for (const Stage* s : selected()) {
    for (DType t : s->dtypes) {
      Problem p;
      p.B = 1;
      p.H = 2;
      p.Nq = 100;
      p.Nk = 130;
      p.d = 64;
      p.causal = true;
      p.dtype = t;
      CAPTURE(s->name);
      CAPTURE(p.describe());
      auto in = flashstep::random_inputs(p, 91);
      const float nan = std::nanf("");
      in.Q[(0 * p.Nq + 17) * p.d + 5] = nan;    // head 0, row 17: that row of O
      in.K[(1 * p.Nk + 120) * p.d + 3] = nan;   // head 1, key 120: rows that see it
      const auto truth = flashstep::forward_truth(p, in);
      const std::vector<double>& ref_O = truth.reference.O;
      std::int64_t poisoned = 0;
      for (double x : ref_O) poisoned += std::isnan(x) ? 1 : 0;
      REQUIRE(poisoned > 0);
      REQUIRE(poisoned < static_cast<std::int64_t>(ref_O.size()));
      const Outputs got = run_stage(*s, p, in);
      std::int64_t wrong_nan = 0;
      for (size_t e = 0; e < ref_O.size(); ++e) {
        wrong_nan += std::isnan(ref_O[e]) != std::isnan(got.O[e]) ? 1 : 0;
      }
      CHECK_MESSAGE(wrong_nan == 0, wrong_nan << " elements of O are NaN where the reference's "
                                                 "are not, or the other way round");
      const auto o = flashstep::check_forward(p, got.O.data(), nullptr, truth);
      CHECK_MESSAGE(o.ok(), "NaN elements skipped: " << o.summary());
    }
  }
}

TEST_CASE("two runs on the same input give bit-identical outputs (no races)") {
  for (const Stage* s : selected()) {
    for (DType t : s->dtypes) {
      Problem p;
      p.B = 2;
      p.H = 2;
      p.Nq = 777;
      p.Nk = 1031;
      p.d = 72;
      p.causal = true;
      p.dtype = t;
      CAPTURE(s->name);
      CAPTURE(p.describe());
      const auto in = flashstep::random_inputs(p, 5);
      const Outputs a = run_stage(*s, p, in);
      const Outputs b = run_stage(*s, p, in);
      CHECK(std::memcmp(a.O.data(), b.O.data(), a.O.size() * sizeof(float)) == 0);
      if (s->writes_lse) {
        CHECK(std::memcmp(a.L.data(), b.L.data(), a.L.size() * sizeof(float)) == 0);
      }
    }
  }
}

namespace {

// The stages that have a backward; each runs in its backward_dtypes, fp32
// held to kFp32GradTolerance, fp16 and bf16 to the low-precision gradient
// rule (common/check.h, BackwardTruth).
std::vector<const Stage*> with_backward() {
  std::vector<const Stage*> out;
  for (const Stage* s : selected()) {
    if (s->backward && !s->backward_dtypes.empty()) out.push_back(s);
  }
  return out;
}

struct Gradients {
  std::vector<float> dQ, dK, dV;
  std::vector<float> O;  // the forward's O that the backward read
};

Gradients run_backward(const Stage& s, const Problem& p, const flashstep::Inputs& in,
                       const std::vector<float>& dO) {
  DeviceRun run(s, p, in.Q.data(), in.K.data(), in.V.data(), dO.data());
  Gradients g;
  run.run_backward(g.dQ, g.dK, g.dV, &g.O);
  return g;
}

// The gradients against the truth for p.dtype, whose naive backward reads the
// O the stage's backward read (common/check.h, backward_truth).
void check_gradients(const Problem& p, const flashstep::Inputs& in, const std::vector<float>& dO,
                     const Gradients& got) {
  const auto want = flashstep::backward_truth(p, in, dO, &got.O);
  const auto c = flashstep::check_backward(p, got.dQ.data(), got.dK.data(), got.dV.data(), want);
  CHECK_MESSAGE(c.ok(), c.summary());
}

// Whether the stage promises bit-identical dQ from run to run (its name says
// so: 07_tensor_core_deterministic); the others may sum dQ by atomics.
bool deterministic_dq(const Stage& s) {
  return s.name.find("deterministic") != std::string_view::npos;
}

}  // namespace

TEST_CASE("every backward, in each of its types, matches the fp64 gradients on the ragged grid") {
  std::uint64_t seed = 3000;
  for (const Stage* s : with_backward()) {
    for (DType t : s->backward_dtypes) {
      for (const Problem& ragged : flashstep::test::ragged_problems()) {
        const Problem p = typed(ragged, t);
        CAPTURE(s->name);
        CAPTURE(p.describe());
        const auto in = flashstep::random_inputs(p, seed++);
        const auto dO = flashstep::random_output_grad(p, seed++);
        const Gradients got = run_backward(*s, p, in, dO);
        check_gradients(p, in, dO, got);
        // Rows that see no key: exactly dQ = 0, never NaN.
        for (std::int64_t bh = 0; bh < p.heads(); ++bh) {
          for (std::int64_t i = 0; i < p.Nq && p.visible_keys(i) == 0; ++i) {
            for (std::int64_t k = 0; k < p.d; ++k) REQUIRE(got.dQ[(bh * p.Nq + i) * p.d + k] == 0.0f);
          }
        }
        for (const auto* g : {&got.dQ, &got.dK, &got.dV}) CHECK(all_finite(*g));
      }
    }
  }
}

TEST_CASE("grouped-query heads in the backward (H / H_kv in 4, 8, 32, MQA): the stages that run them") {
  // dK and dV of a K/V head sum over its group's query heads: checked against
  // the grouped fp64 reference and naive backward (a wrong head map, or a
  // member of the group left out or counted twice, fails dK and dV by whole
  // heads' gradients). The grouped grid has no d = 256 (the kernels' d
  // split) and few rows past Nk: two more shapes for them, and K/V heads past
  // grid y's 65535 (B H_kv = 70002) for the kernels' grid-stride loops.
  std::vector<Problem> problems = flashstep::test::grouped_problems();
  for (bool causal : {false, true}) {
    for (Problem p : {flashstep::test::make_problem(1, 8, 77, 150, 256, causal),
                      flashstep::test::make_problem(2, 4, 200, 130, 128, causal),
                      flashstep::test::make_problem(35001, 4, 5, 7, 3, causal)}) {
      p.H_kv = p.B == 35001 ? 2 : p.H / 4;
      problems.push_back(p);
    }
  }
  std::uint64_t seed = 7000;
  for (const Stage* s : with_backward()) {
    if (!s->grouped_backward) continue;
    for (DType t : s->backward_dtypes) {
      for (const Problem& grouped : problems) {
        const Problem p = typed(grouped, t);
        CAPTURE(s->name);
        CAPTURE(p.describe());
        const auto in = flashstep::random_inputs(p, seed++);
        const auto dO = flashstep::random_output_grad(p, seed++);
        const Gradients got = run_backward(*s, p, in, dO);
        REQUIRE(got.dK.size() == static_cast<size_t>(p.kv_elems()));
        check_gradients(p, in, dO, got);
        for (std::int64_t bh = 0; bh < p.heads(); ++bh) {  // rows that see no key: dQ = 0
          for (std::int64_t i = 0; i < p.Nq && p.visible_keys(i) == 0; ++i) {
            for (std::int64_t k = 0; k < p.d; ++k) REQUIRE(got.dQ[(bh * p.Nq + i) * p.d + k] == 0.0f);
          }
        }
        for (const auto* g : {&got.dQ, &got.dK, &got.dV}) CHECK(all_finite(*g));
      }
    }
  }
}

TEST_CASE("grouped-query heads: a backward without them is refused by the runner, in one line") {
  Problem p = flashstep::test::make_problem(1, 8, 4, 4, 16, false);
  p.H_kv = 2;
  const auto in = flashstep::random_inputs(p, 62);
  const auto dO = flashstep::random_output_grad(p, 63);
  for (const Stage* s : with_backward()) {
    if (!s->grouped_heads || s->grouped_backward) continue;
    CAPTURE(s->name);
    p.dtype = s->backward_dtypes.front();
    CHECK_THROWS_WITH_AS(DeviceRun(*s, p, in.Q.data(), in.K.data(), in.V.data(), dO.data()),
                         doctest::Contains("'s backward does not run grouped-query attention"),
                         flashstep::Error);
  }
}

TEST_CASE("more heads than a grid axis holds (B * H > 65535): every forward and backward") {
  // Grid y and z stop at 65535 blocks; stages that put heads there walk the
  // rest with a grid-stride loop. Tiny heads keep the problem small.
  Problem p;
  p.B = 35001;
  p.H = 2;
  p.Nq = 5;
  p.Nk = 7;
  p.d = 3;
  for (bool causal : {false, true}) {
    p.causal = causal;
    CAPTURE(p.describe());
    const auto in = flashstep::random_inputs(p, 93);
    const auto dO = flashstep::random_output_grad(p, 94);
    for (const Stage* s : selected()) {
      CAPTURE(s->name);
      for (DType t : s->dtypes) {
        const Problem pt = typed(p, t);
        CAPTURE(pt.describe());
        check_outputs(*s, pt, run_stage(*s, pt, in), flashstep::forward_truth(pt, in));
      }
      if (!s->backward) continue;
      for (DType t : s->backward_dtypes) {
        const Problem pt = typed(p, t);
        check_gradients(pt, in, dO, run_backward(*s, pt, in, dO));
      }
    }
  }
}

TEST_CASE("backward on logits beyond fp32 exp's range (~88.7) stays within the bound") {
  for (const Stage* s : with_backward()) {
    for (DType t : s->backward_dtypes) {
      const Problem p = large_logit_problem(t);
      CAPTURE(s->name);
      CAPTURE(p.describe());
      const flashstep::Inputs in = large_logit_inputs(p, 78);
      const auto dO = flashstep::random_output_grad(p, 79);
      check_gradients(p, in, dO, run_backward(*s, p, in, dO));
    }
  }
}

TEST_CASE("every backward, any finite softmax scale: negative, zero and large, causal and not") {
  const double scales[] = {-0.5, 0.0, 1.0};
  std::uint64_t seed = 4500;
  for (const Stage* s : with_backward()) {
    for (DType t : s->backward_dtypes) {
      for (double scale : scales) {
        for (bool causal : {false, true}) {
          Problem p = flashstep::test::make_problem(1, 2, 97, 131, 64, causal);
          p.dtype = t;
          p.scale = scale;
          CAPTURE(s->name);
          CAPTURE(p.describe());
          const auto in = flashstep::random_inputs(p, seed++);
          const auto dO = flashstep::random_output_grad(p, seed++);
          check_gradients(p, in, dO, run_backward(*s, p, in, dO));
        }
      }
    }
  }
}

TEST_CASE("backward repeat runs: dK and dV bit-identical; dQ's atomics reorder its sums (measured)") {
  Problem p;
  p.B = 2;
  p.H = 4;
  p.Nq = p.Nk = 2048;
  p.d = 64;
  p.causal = true;
  const auto in = flashstep::random_inputs(p, 6);
  const auto dO = flashstep::random_output_grad(p, 7);
  constexpr int kRepeats = 5;
  for (const Stage* s : with_backward()) {
    const Problem pt = typed(p, s->backward_dtypes.front());
    CAPTURE(s->name);
    CAPTURE(pt.describe());
    DeviceRun run(*s, pt, in.Q.data(), in.K.data(), in.V.data(), dO.data());
    Gradients first;
    run.run_backward(first.dQ, first.dK, first.dV);
    double max_rel = 0.0;
    std::int64_t differing = 0;
    for (int r = 1; r < kRepeats; ++r) {
      Gradients again;
      run.run_backward(again.dQ, again.dK, again.dV);
      CHECK(std::memcmp(first.dK.data(), again.dK.data(), first.dK.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(first.dV.data(), again.dV.data(), first.dV.size() * sizeof(float)) == 0);
      if (deterministic_dq(*s)) {
        CHECK(std::memcmp(first.dQ.data(), again.dQ.data(), first.dQ.size() * sizeof(float)) == 0);
      }
      for (size_t e = 0; e < first.dQ.size(); ++e) {
        if (first.dQ[e] == again.dQ[e]) continue;
        ++differing;
        max_rel = std::max(max_rel, std::fabs(static_cast<double>(first.dQ[e]) - again.dQ[e]) /
                                        std::max(std::fabs(static_cast<double>(first.dQ[e])),
                                                 static_cast<double>(FLT_MIN)));
      }
    }
    // Reported, not bounded (the fp64 comparison bounds it): how much the
    // order of dQ's fp32 atomic adds moves it. Printed, so the test log has it.
    std::printf("%s: dQ over %d repeats of %s: %lld of %zu elements differ from the first run, "
                "max relative difference %.3g\n",
                std::string(s->name).c_str(), kRepeats - 1, pt.describe().c_str(),
                static_cast<long long>(differing), (kRepeats - 1) * first.dQ.size(), max_rel);
  }
}

TEST_CASE("a problem too large for device memory is refused with a clear error, before allocating") {
  Problem p;
  p.Nq = p.Nk = 1 << 20;  // the N x N scores alone would need 4 TiB
  p.d = 64;
  const flashstep::Inputs none;  // never read: the check comes first
  for (const Stage* s : selected()) {
    p.dtype = s->dtypes.front();
    if (flashstep::device_bytes_needed(*s, p) < flashstep::device_info().total_bytes) continue;
    CAPTURE(s->name);
    CHECK_THROWS_WITH_AS(DeviceRun(*s, p, none.Q.data(), none.K.data(), none.V.data()),
                         doctest::Contains("of device memory"), flashstep::Error);
  }
}

int main(int argc, char** argv) {
  std::vector<char*> args;
  for (int k = 0; k < argc; ++k) {
    if (std::strncmp(argv[k], "--stage=", 8) == 0) g_selector = argv[k] + 8;
    else args.push_back(argv[k]);
  }
  std::string why;
  if (!flashstep::cuda_device_available(&why)) {
    std::printf("GPU tests skipped: %s\n", why.c_str());
    return FLASHSTEP_SKIP_EXIT;
  }
  try {
    const auto chosen = flashstep::select_stages(g_selector);
    for (const Stage* s : chosen) {
      if (std::string unavailable; !flashstep::stage_available(*s, &unavailable)) {
        std::printf("%s: skipped\n", unavailable.c_str());
      }
    }
    if (selected().empty()) {
      std::printf("GPU tests skipped: no selected stage runs on this GPU\n");
      return FLASHSTEP_SKIP_EXIT;
    }
  } catch (const flashstep::Error& e) {
    std::fprintf(stderr, "test_gpu: %s\n", e.what());
    return 2;
  }
  std::printf("GPU: %s; stages: %s\n", flashstep::device_info().name.c_str(), g_selector.c_str());
  doctest::Context context(static_cast<int>(args.size()), args.data());
  return context.run();
}
