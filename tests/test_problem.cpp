// The contract's rules: validation, the causal mask, the FLOP convention, the
// element types a stage declares.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/device.h"
#include "common/error.h"
#include "common/problem.h"
#include "common/stage.h"
#include "shapes.h"

using flashstep::Error;
using flashstep::Problem;

TEST_CASE("validate names the field that breaks the contract") {
  Problem p;
  CHECK_NOTHROW(flashstep::validate(p));
  p.B = 0;
  CHECK_THROWS_WITH_AS(flashstep::validate(p), "B must be >= 1, got 0", Error);
  p = Problem{};
  p.Nk = -3;
  CHECK_THROWS_WITH_AS(flashstep::validate(p), "Nk must be >= 1, got -3", Error);
  p = Problem{};
  p.d = 257;
  CHECK_THROWS_WITH_AS(flashstep::validate(p), "d must be <= 256, got 257", Error);
  p.d = 256;
  CHECK_NOTHROW(flashstep::validate(p));
  p.scale = NAN;
  CHECK_THROWS_AS(flashstep::validate(p), Error);
  p = Problem{};
  p.Nq = 3'000'000'000;
  CHECK_THROWS_AS(flashstep::validate(p), Error);
}

TEST_CASE("validate refuses a scale that fp32 cannot hold, as the kernels would get inf") {
  Problem p;
  p.scale = 3e38;  // just below FLT_MAX
  CHECK_NOTHROW(flashstep::validate(p));
  for (double scale : {1e39, -1e39, 1e300}) {
    p.scale = scale;
    CHECK_THROWS_WITH_AS(flashstep::validate(p), doctest::Contains("scale must be finite in fp32"),
                         Error);
  }
}

namespace {
// Problems at validate's bound B*H*Nq*max(Nk,64)*max(d,64) <= 2^57, each
// stretched along another axis: square, the longest Nq (thin and wide), the
// longest Nk, d = 1, the most heads, and the shape where the models count the
// most per unit of the bound (one query, 65 keys, d = 65).
std::vector<Problem> largest_accepted_problems() {
  const std::int64_t kMaxDim = 2147483647;
  std::vector<Problem> out;
  auto add = [&](std::int64_t B, std::int64_t H, std::int64_t Nq, std::int64_t Nk, std::int64_t d) {
    for (bool causal : {false, true}) {
      out.push_back(flashstep::test::make_problem(B, H, Nq, Nk, d, causal));
    }
  };
  add(2, 1, 1 << 24, 1 << 24, 256);
  add(1 << 14, 1, kMaxDim, 1, 1);
  add(64, 64, kMaxDim, 1, 256);
  add(1 << 9, 1 << 9, 1, kMaxDim, 256);
  add(1, 1, 1 << 25, 1 << 26, 1);
  add(kMaxDim, 1 << 14, 1, 1, 1);
  add(kMaxDim, 15880, 1, 65, 65);
  return out;
}
}  // namespace

TEST_CASE("validate's bound keeps every model's counts in int64: none negative at the largest problems") {
  // Under the sanitizer build (ctest --preset sanitize) an overflow aborts here.
  for (const Problem& p : largest_accepted_problems()) {
    CAPTURE(p.describe());
    REQUIRE_NOTHROW(flashstep::validate(p));
    Problem over = p;
    over.H *= 2;
    CHECK_THROWS_WITH_AS(flashstep::validate(over), doctest::Contains("problem too large"), Error);
    for (const flashstep::Stage& s : flashstep::all_stages()) {
      for (flashstep::DType t : s.dtypes) {
        CAPTURE(s.name);
        CAPTURE(flashstep::dtype_name(t));
        Problem typed = p;
        typed.dtype = t;
        const bool backward = s.backward_supports(t);
        std::vector<flashstep::Cost> costs = {s.model(typed)};
        if (backward) costs.push_back(s.backward_model(typed));
        for (const flashstep::Cost& c : costs) {
          for (std::int64_t field : {c.hbm_read_bytes, c.hbm_write_bytes, c.sram_read_bytes,
                                     c.sram_write_bytes, c.matmul_flops, c.nonmatmul_flops,
                                     c.thread_blocks, c.skipped_tiles, c.barriers,
                                     c.mask_tests}) {
            CHECK(field >= 0);
          }
          CHECK(c.hbm_bytes() >= 0);
          CHECK(c.sram_bytes() >= 0);
        }
        // Every forward computes the whole non-causal problem: exactly 4*B*H*Nq*Nk*d.
        if (!p.causal) CHECK(static_cast<double>(costs[0].matmul_flops) == p.forward_flops());
        CHECK(flashstep::device_bytes_needed(s, typed) >=
              2 * (p.q_elems() + p.kv_elems()) * typed.elem_bytes());
        if (backward) CHECK(flashstep::device_bytes_needed(s, typed, true) > 0);
      }
    }
  }
}

TEST_CASE("causal mask is aligned bottom-right: key j visible iff j <= i + Nk - Nq") {
  Problem p;
  p.causal = true;
  SUBCASE("square: row i sees keys 0..i") {
    p.Nq = p.Nk = 4;
    for (std::int64_t i = 0; i < 4; ++i) CHECK(p.visible_keys(i) == i + 1);
  }
  SUBCASE("more keys than queries: the last query sees every key") {
    p.Nq = 2;
    p.Nk = 5;
    CHECK(p.visible_keys(0) == 4);
    CHECK(p.visible_keys(1) == 5);
  }
  SUBCASE("more queries than keys: the first Nq - Nk rows see no key") {
    p.Nq = 5;
    p.Nk = 2;
    CHECK(p.visible_keys(0) == 0);
    CHECK(p.visible_keys(2) == 0);
    CHECK(p.visible_keys(3) == 1);
    CHECK(p.visible_keys(4) == 2);
  }
  SUBCASE("non-causal: every row sees every key") {
    p.causal = false;
    p.Nq = 5;
    p.Nk = 2;
    CHECK(p.visible_keys(0) == 2);
  }
}

TEST_CASE("FLOPs follow the FlashAttention convention, halved when causal") {
  Problem p;
  p.B = 2;
  p.H = 3;
  p.Nq = 5;
  p.Nk = 7;
  p.d = 11;
  CHECK(p.forward_flops() == doctest::Approx(4.0 * 2 * 3 * 5 * 7 * 11));
  p.causal = true;
  CHECK(p.forward_flops() == doctest::Approx(2.0 * 2 * 3 * 5 * 7 * 11));
}

TEST_CASE("softmax scale defaults to 1/sqrt(d)") {
  Problem p;
  p.d = 64;
  CHECK(p.softmax_scale() == doctest::Approx(0.125));
  p.scale = 0.5;
  CHECK(p.softmax_scale() == doctest::Approx(0.5));
}

TEST_CASE("float4-sized access needs 16-byte rows: d % 4 == 0 in fp32, d % 8 == 0 in 16 bits") {
  alignas(16) float buffer[8] = {};
  Problem p;
  p.dtype = flashstep::DType::kBf16;
  flashstep::ForwardTensors t;
  t.Q = t.K = t.V = buffer;
  t.O = buffer;
  p.d = 64;
  CHECK(flashstep::float4_ok(p, t));
  p.d = 60;  // 120-byte rows: a float4 of fp32 would fit, 16 bytes of bf16 would not
  CHECK_FALSE(flashstep::float4_ok(p, t));
  p.dtype = flashstep::DType::kFp32;
  CHECK(flashstep::float4_ok(p, t));
}

TEST_CASE("stages declare their element types, native first, and asking for another is one clear error") {
  using flashstep::DType;
  for (const flashstep::Stage& s : flashstep::all_stages()) {
    CAPTURE(s.name);
    REQUIRE_FALSE(s.dtypes.empty());
    for (DType t : s.dtypes) CHECK(s.supports(t));
    if (s.backward) {
      CHECK_FALSE(s.backward_dtypes.empty());
      for (DType t : s.backward_dtypes) CHECK(s.backward_supports(t));
    } else {
      CHECK_FALSE(s.backward_supports(DType::kFp32));
    }
  }
  const flashstep::Stage& s07 = *flashstep::select_stages("07_tensor_core").front();
  CHECK(s07.backward_dtypes == std::vector<DType>{DType::kBf16, DType::kFp16});
  CHECK_FALSE(s07.backward_supports(DType::kFp32));
  const flashstep::Stage& s02 = *flashstep::select_stages("02").front();
  const flashstep::Stage& s04 = *flashstep::select_stages("04").front();
  CHECK(s02.dtypes == std::vector<DType>{DType::kFp32, DType::kFp16, DType::kBf16});
  CHECK(flashstep::select_stages("03").front()->supports(DType::kBf16));
  CHECK(s04.dtypes == std::vector<DType>{DType::kFp32});  // the default
  CHECK_FALSE(s02.backward_supports(DType::kBf16));
  CHECK_NOTHROW(flashstep::require_dtype(s02, DType::kFp16));
  CHECK_THROWS_WITH_AS(flashstep::require_dtype(s04, DType::kBf16),
                       "stage 04_fa2_q_outer does not run in bf16 (it runs in fp32)", Error);
  CHECK_THROWS_WITH_AS(flashstep::require_dtype(s02, DType::kBf16, true),
                       "stage 02_safe_softmax's backward does not run in bf16 (it runs in fp32)",
                       Error);
  CHECK_THROWS_WITH_AS(flashstep::require_dtype(s04, DType::kFp32, true),
                       "stage 04_fa2_q_outer has no backward pass", Error);
  // The runner asks before it touches the GPU.
  Problem p;
  p.dtype = DType::kFp16;
  const std::vector<float> x(static_cast<size_t>(p.q_elems()), 1.0f);
  CHECK_THROWS_WITH_AS(flashstep::DeviceRun(s04, p, x.data(), x.data(), x.data()),
                       doctest::Contains("does not run in fp16"), Error);
}

TEST_CASE("float4 access needs d % 4 == 0 and 16-byte aligned tensors") {
  alignas(16) float buffer[8] = {};
  Problem p;
  p.d = 64;
  flashstep::ForwardTensors t;
  t.Q = t.K = t.V = buffer;
  t.O = buffer;
  CHECK(flashstep::float4_ok(p, t));
  p.d = 59;
  CHECK_FALSE(flashstep::float4_ok(p, t));
  p.d = 64;
  t.V = buffer + 1;  // 4 bytes off
  CHECK_FALSE(flashstep::float4_ok(p, t));
}
