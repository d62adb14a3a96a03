// The forward check (common/check.h) on the host: fp32's fixed bound, and
// FlashAttention's rule for fp16 and bf16 (at most twice the error of the
// naive computation in that type, against the fp64 reference of the rounded
// inputs): a correct result passes, a wrong one fails, nothing checked is no pass.
// The same rule for the gradients, with a floor for the cancellation in dS.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "common/check.h"
#include "common/error.h"
#include "common/reference.h"
#include "common/rounding.h"
#include "shapes.h"

using flashstep::check_forward;
using flashstep::DType;
using flashstep::forward_truth;
using flashstep::ForwardTruth;
using flashstep::Inputs;
using flashstep::Problem;

namespace {

constexpr DType kLowTypes[] = {DType::kFp16, DType::kBf16};

Problem typed(Problem p, DType t) {
  p.dtype = t;
  return p;
}

std::vector<float> to_floats(const std::vector<double>& x) { return {x.begin(), x.end()}; }

// Q, K, V rounded to the problem's type: what a stage in that type sees.
Inputs rounded(const Problem& p, Inputs in) {
  for (std::vector<float>* x : {&in.Q, &in.K, &in.V}) {
    flashstep::round_to_dtype(p.dtype, x->data(), static_cast<std::int64_t>(x->size()));
  }
  return in;
}

// The naive computation in the type, from the rounded inputs (check.h's O_naive).
std::vector<float> naive(const Problem& p, const Inputs& in, std::int64_t row_step = 1) {
  const Inputs r = rounded(p, in);
  return to_floats(
      flashstep::naive_low_precision_rows(p, r.Q.data(), r.K.data(), r.V.data(), row_step));
}

// A perfect kernel: the exact O of the rounded inputs, rounded once to the type.
std::vector<float> exact_then_rounded(const Problem& p, const ForwardTruth& truth) {
  std::vector<float> O = to_floats(truth.reference.O);
  flashstep::round_to_dtype(p.dtype, O.data(), static_cast<std::int64_t>(O.size()));
  return O;
}

// Attention done wholly in the type: the scores too rounded before the
// softmax (what a stage storing S in 16 bits would compute). Rows see every key.
std::vector<float> scores_rounded(const Problem& p, const Inputs& in) {
  const Inputs r = rounded(p, in);
  const auto scale = static_cast<float>(p.softmax_scale());
  std::vector<float> O(static_cast<size_t>(p.q_elems()));
  for (std::int64_t bh = 0; bh < p.heads(); ++bh) {
    for (std::int64_t i = 0; i < p.Nq; ++i) {
      std::vector<float> s(static_cast<size_t>(p.Nk));
      float m = -std::numeric_limits<float>::infinity();
      for (std::int64_t j = 0; j < p.Nk; ++j) {
        float dot = 0.0f;
        for (std::int64_t k = 0; k < p.d; ++k) {
          dot += r.Q[(bh * p.Nq + i) * p.d + k] * r.K[(bh * p.Nk + j) * p.d + k];
        }
        s[j] = flashstep::round_to_dtype(p.dtype, scale * dot);
        m = std::max(m, s[j]);
      }
      float l = 0.0f;
      for (float& x : s) l += (x = std::exp(x - m));
      for (std::int64_t k = 0; k < p.d; ++k) {
        float o = 0.0f;
        for (std::int64_t j = 0; j < p.Nk; ++j) {
          o += flashstep::round_to_dtype(p.dtype, s[j] / l) * r.V[(bh * p.Nk + j) * p.d + k];
        }
        O[(bh * p.Nq + i) * p.d + k] = flashstep::round_to_dtype(p.dtype, o);
      }
    }
  }
  return O;
}

}  // namespace

TEST_CASE("low precision: the naive computation and an exactly rounded result pass") {
  std::uint64_t seed = 500;
  for (DType t : kLowTypes) {
    for (const auto& shape : flashstep::test::kRaggedShapes) {
      for (bool causal : {false, true}) {
        const Problem p = typed(flashstep::test::make_problem(shape.B, shape.H, shape.Nq, shape.Nk,
                                                              shape.d, causal), t);
        CAPTURE(p.describe());
        const Inputs in = flashstep::random_inputs(p, seed++);
        const ForwardTruth truth = forward_truth(p, in);
        const auto ok_naive = check_forward(p, naive(p, in).data(), nullptr, truth);
        CHECK_MESSAGE(ok_naive.ok(), ok_naive.summary());
        CHECK(ok_naive.O.max_abs_error == doctest::Approx(ok_naive.naive_error));
        const auto ok_exact = check_forward(p, exact_then_rounded(p, truth).data(), nullptr, truth);
        CHECK_MESSAGE(ok_exact.ok(), ok_exact.summary());
        CHECK(ok_exact.o_tolerance.rtol == 0.0);  // one absolute bound over all of O
        CHECK(ok_exact.o_tolerance.atol == doctest::Approx(2 * ok_exact.naive_error +
                                                           flashstep::kLowPrecisionFloor));
      }
    }
  }
}

TEST_CASE("low precision: a wrong scale, or scores rounded to 16 bits, fail") {
  for (DType t : kLowTypes) {
    CAPTURE(flashstep::dtype_name(t));
    const Problem p = typed(flashstep::test::make_problem(2, 2, 97, 203, 64, false), t);
    const Inputs in = flashstep::random_inputs(p, 7);
    const ForwardTruth truth = forward_truth(p, in);
    Problem wrong = p;
    wrong.scale = 1.25 * p.softmax_scale();
    const auto bad_scale = check_forward(p, naive(wrong, in).data(), nullptr, truth);
    CHECK_FALSE(bad_scale.ok());
    CHECK(bad_scale.O.max_abs_error > 2 * bad_scale.o_tolerance.atol);

    // Logits near 36 (Q and K rows near 2.1): rounded to bf16 a score moves by
    // up to 1/8 and its exp by 13% (fp16: 1/64, 1.6%). The rule's naive
    // computation keeps S in fp32, and a result that rounds it fails.
    Inputs large = in;
    for (float& x : large.Q) x = 2.0f + 0.25f * x;
    for (float& x : large.K) x = 2.0f + 0.25f * x;
    const ForwardTruth large_truth = forward_truth(p, large);
    const auto right = check_forward(p, naive(p, large).data(), nullptr, large_truth);
    CHECK_MESSAGE(right.ok(), right.summary());
    const auto bad_scores = check_forward(p, scores_rounded(p, large).data(), nullptr, large_truth);
    CHECK_FALSE(bad_scores.ok());
  }
}

TEST_CASE("low precision: the row-sampled reference checks the sampled rows, by the same rule") {
  for (DType t : kLowTypes) {
    CAPTURE(flashstep::dtype_name(t));
    const Problem p = typed(flashstep::test::make_problem(1, 3, 130, 67, 40, true), t);
    const Inputs in = flashstep::random_inputs(p, 11);
    constexpr std::int64_t kStep = 7;
    const ForwardTruth truth = forward_truth(p, in, kStep);
    const std::int64_t rows = (p.Nq + kStep - 1) / kStep;  // 0, 7, ..., 126 of each head
    const auto good = check_forward(p, naive(p, in).data(), nullptr, truth);
    CHECK_MESSAGE(good.ok(), good.summary());
    CHECK(good.O.checked == p.heads() * rows * p.d);
    Problem wrong = p;
    wrong.scale = 1.25 * p.softmax_scale();
    CHECK_FALSE(check_forward(p, naive(wrong, in).data(), nullptr, truth).ok());
  }
}

TEST_CASE("low precision: L is held to the fp32 bound, against the rounded inputs' reference") {
  const Problem p = typed(flashstep::test::make_problem(2, 1, 45, 33, 59, true), DType::kBf16);
  const Inputs in = flashstep::random_inputs(p, 13);
  const ForwardTruth truth = forward_truth(p, in);
  const std::vector<float> O = exact_then_rounded(p, truth);
  std::vector<float> L = to_floats(truth.reference.L);
  CHECK(check_forward(p, O.data(), L.data(), truth).ok());
  // The fp64 reference of the unrounded inputs differs by the inputs' rounding:
  // far more than fp32's bound, so L from unrounded inputs fails.
  const auto unrounded = flashstep::reference_forward(p, in.Q.data(), in.K.data(), in.V.data());
  const std::vector<float> L_unrounded = to_floats(unrounded.L);
  const auto c = check_forward(p, O.data(), L_unrounded.data(), truth);
  REQUIRE(c.L);
  CHECK_FALSE(c.ok());
  CHECK_FALSE(c.L->ok());
}

TEST_CASE("forward check: a check that compared nothing is not a pass, in any type") {
  for (DType t : {DType::kFp32, DType::kFp16, DType::kBf16}) {
    CAPTURE(flashstep::dtype_name(t));
    const Problem p = typed(flashstep::test::make_problem(1, 1, 4, 5, 8, false), t);
    Inputs in = flashstep::random_inputs(p, 17);
    for (float& x : in.Q) x = std::nanf("");  // every row of the reference is NaN: skipped
    const ForwardTruth truth = forward_truth(p, in);
    const std::vector<float> O(static_cast<size_t>(p.q_elems()), 0.0f);
    const std::vector<float> L(static_cast<size_t>(p.lse_elems()), 0.0f);
    const auto c = check_forward(p, O.data(), L.data(), truth);
    CHECK(c.O.checked == 0);
    CHECK(c.O.mismatches == 0);
    CHECK_FALSE(c.ok());
    CHECK(c.summary().find("nothing compared") != std::string::npos);
  }
}

TEST_CASE("forward check: fp32 keeps kFp32Tolerance, a truth of another type is refused") {
  const Problem p = flashstep::test::make_problem(2, 2, 33, 47, 24, true);
  const Inputs in = flashstep::random_inputs(p, 19);
  const ForwardTruth truth = forward_truth(p, in);
  CHECK(truth.naive_O.empty());
  std::vector<float> O = to_floats(truth.reference.O);
  const auto c = check_forward(p, O.data(), nullptr, truth);
  CHECK(c.ok());
  CHECK(c.o_tolerance.atol == flashstep::kFp32Tolerance.atol);
  CHECK(c.o_tolerance.rtol == flashstep::kFp32Tolerance.rtol);
  O[5] += 1e-3f;  // ten times the relative bound
  CHECK_FALSE(check_forward(p, O.data(), nullptr, truth).ok());
  CHECK_THROWS_WITH_AS(check_forward(typed(p, DType::kBf16), O.data(), nullptr, truth),
                       doctest::Contains("computed from fp32 inputs, the run is bf16"),
                       flashstep::Error);
}

TEST_CASE("forward_truth rounds the inputs to the type, the fp32 truth uses them as given") {
  const Problem p = typed(flashstep::test::make_problem(1, 2, 9, 11, 16, false), DType::kFp16);
  const Inputs in = flashstep::random_inputs(p, 23);
  const Inputs r = rounded(p, in);
  const auto want = flashstep::reference_forward(p, r.Q.data(), r.K.data(), r.V.data());
  const ForwardTruth truth = forward_truth(p, in);
  CHECK(truth.dtype == DType::kFp16);
  CHECK(truth.reference.O == want.O);
  CHECK(truth.reference.L == want.L);
  CHECK(truth.naive_O.size() == want.O.size());
}

// ---------------------------------------------------------------------------
// The gradients' rule (check.h, BackwardTruth).

namespace {

using flashstep::BackwardTruth;
using flashstep::ReferenceGradients;

struct Grads {
  std::vector<float> dQ, dK, dV;
};

Grads to_grads(const ReferenceGradients& g) {
  return {to_floats(g.dQ), to_floats(g.dK), to_floats(g.dV)};
}

flashstep::BackwardCheck check(const Problem& p, const Grads& g, const BackwardTruth& truth) {
  return flashstep::check_backward(p, g.dQ.data(), g.dK.data(), g.dV.data(), truth);
}

std::vector<float> rounded_grad(const Problem& p, std::vector<float> dO) {
  flashstep::round_to_dtype(p.dtype, dO.data(), static_cast<std::int64_t>(dO.size()));
  return dO;
}

// The naive backward in the type of problem `run` (which may carry a wrong
// scale) from the inputs rounded to it.
Grads naive_grads(const Problem& run, const Inputs& in, const std::vector<float>& dO) {
  const Inputs r = rounded(run, in);
  const std::vector<float> dO16 = rounded_grad(run, dO);
  return to_grads(flashstep::naive_low_precision_backward(run, r.Q.data(), r.K.data(), r.V.data(),
                                                          dO16.data()));
}

// A backward that rounds dP = dO V^T to the type before subtracting D (as
// one that kept dP in 16-bit registers would): dP and D agree in their
// leading digits, so the rounding of dP survives the subtraction whole.
// Rows see every key.
Grads dp_rounded(const Problem& p, const Inputs& in, const std::vector<float>& dO_in) {
  const Inputs r = rounded(p, in);
  const std::vector<float> dO = rounded_grad(p, dO_in);
  const std::vector<double> O =
      flashstep::naive_low_precision_rows(p, r.Q.data(), r.K.data(), r.V.data(), 1);
  const auto scale = static_cast<float>(p.softmax_scale());
  const auto d = static_cast<size_t>(p.d);
  Grads g{std::vector<float>(static_cast<size_t>(p.q_elems()), 0.0f),
          std::vector<float>(static_cast<size_t>(p.kv_elems()), 0.0f),
          std::vector<float>(static_cast<size_t>(p.kv_elems()), 0.0f)};
  for (std::int64_t bh = 0; bh < p.heads(); ++bh) {
    for (std::int64_t i = 0; i < p.Nq; ++i) {
      const size_t qi = static_cast<size_t>((bh * p.Nq + i) * p.d);
      std::vector<float> P(static_cast<size_t>(p.Nk));
      float m = -std::numeric_limits<float>::infinity(), l = 0.0f, D = 0.0f;
      for (std::int64_t j = 0; j < p.Nk; ++j) {
        float dot = 0.0f;
        for (size_t k = 0; k < d; ++k) dot += r.Q[qi + k] * r.K[(bh * p.Nk + j) * p.d + k];
        m = std::max(m, P[j] = scale * dot);
      }
      for (float& x : P) l += (x = std::exp(x - m));
      for (size_t k = 0; k < d; ++k) D += dO[qi + k] * static_cast<float>(O[qi + k]);
      for (std::int64_t j = 0; j < p.Nk; ++j) {
        const size_t kj = static_cast<size_t>((bh * p.Nk + j) * p.d);
        float dP = 0.0f;
        for (size_t k = 0; k < d; ++k) dP += dO[qi + k] * r.V[kj + k];
        const float Pij = P[j] / l;
        const float dS = flashstep::round_to_dtype(
            p.dtype, Pij * (flashstep::round_to_dtype(p.dtype, dP) - D));
        for (size_t k = 0; k < d; ++k) {
          g.dV[kj + k] += flashstep::round_to_dtype(p.dtype, Pij) * dO[qi + k];
          g.dK[kj + k] += scale * dS * r.Q[qi + k];
          g.dQ[qi + k] += scale * dS * r.K[kj + k];
        }
      }
    }
  }
  for (std::vector<float>* x : {&g.dQ, &g.dK, &g.dV}) {
    flashstep::round_to_dtype(p.dtype, x->data(), static_cast<std::int64_t>(x->size()));
  }
  return g;
}

}  // namespace

TEST_CASE("low precision gradients: the naive backward and exactly rounded gradients pass") {
  std::uint64_t seed = 700;
  for (DType t : kLowTypes) {
    for (const auto& shape : flashstep::test::kRaggedShapes) {
      if (shape.Nq * shape.Nk * shape.d > 5'000'000) continue;  // the CPU test's time
      for (bool causal : {false, true}) {
        const Problem p = typed(flashstep::test::make_problem(shape.B, shape.H, shape.Nq, shape.Nk,
                                                              shape.d, causal), t);
        CAPTURE(p.describe());
        const Inputs in = flashstep::random_inputs(p, seed++);
        const auto dO = flashstep::random_output_grad(p, seed++);
        const BackwardTruth truth = flashstep::backward_truth(p, in, dO);
        const auto ok_naive = check(p, naive_grads(p, in, dO), truth);
        CHECK_MESSAGE(ok_naive.ok(), ok_naive.summary());
        CHECK(ok_naive.dQ.c.max_abs_error == doctest::Approx(ok_naive.dQ.naive_error));
        Grads exact = to_grads(truth.reference);
        for (std::vector<float>* x : {&exact.dQ, &exact.dK, &exact.dV}) {
          flashstep::round_to_dtype(t, x->data(), static_cast<std::int64_t>(x->size()));
        }
        const auto ok_exact = check(p, exact, truth);
        CHECK_MESSAGE(ok_exact.ok(), ok_exact.summary());
        CHECK(ok_exact.dQ.tolerance.rtol == 0.0);
        CHECK(ok_exact.dV.floor == flashstep::kFp32GradTolerance.atol);
        CHECK(ok_exact.dQ.floor >= flashstep::kFp32GradTolerance.atol);
      }
    }
  }
}

TEST_CASE("low precision gradients: one key per row, where the naive dS is exactly 0, has a floor") {
  // Nk = 1: P = 1, O = V, so dP - D cancels to 0 in the naive backward (same
  // order of the same products) and its dQ and dK are exact. A correct kernel
  // sums dP and D in other orders; the floor bounds what that costs.
  for (DType t : kLowTypes) {
    const Problem p = typed(flashstep::test::make_problem(2, 1, 239, 1, 64, false), t);
    const Inputs in = flashstep::random_inputs(p, 31);
    const auto dO = flashstep::random_output_grad(p, 32);
    const BackwardTruth truth = flashstep::backward_truth(p, in, dO);
    const Grads naive = naive_grads(p, in, dO);
    const auto c = check(p, naive, truth);
    CHECK_MESSAGE(c.ok(), c.summary());
    CHECK(c.dQ.naive_error < c.dQ.floor);
    CHECK(c.dQ.floor > flashstep::kFp32GradTolerance.atol);
    // An error the size of fp32's cancellation passes; a 16-bit one fails.
    Grads off = naive;
    off.dQ[3] += static_cast<float>(0.5 * (c.dQ.floor - flashstep::kFp32GradTolerance.atol));
    CHECK(check(p, off, truth).ok());
    off.dQ[3] += 1e-2f;
    CHECK_FALSE(check(p, off, truth).ok());
  }
}

TEST_CASE("low precision gradients: a wrong scale fails, and in bf16 dP rounded before the subtraction") {
  for (DType t : kLowTypes) {
    CAPTURE(flashstep::dtype_name(t));
    const Problem p = typed(flashstep::test::make_problem(1, 2, 97, 203, 64, false), t);
    const Inputs in = flashstep::random_inputs(p, 41);
    const auto dO = flashstep::random_output_grad(p, 42);
    const BackwardTruth truth = flashstep::backward_truth(p, in, dO);
    Problem wrong = p;
    wrong.scale = 1.25 * p.softmax_scale();
    const auto bad_scale = check(p, naive_grads(wrong, in, dO), truth);
    CHECK_FALSE(bad_scale.ok());
    CHECK_FALSE(bad_scale.dQ.c.ok());
    CHECK_FALSE(bad_scale.dV.c.ok());
    if (t == DType::kBf16) {
      // In fp16, whose dP keeps 11 bits, rounding it stays within twice what
      // the naive backward loses at this size: the rule cannot tell it apart.
      const auto bad_dp = check(p, dp_rounded(p, in, dO), truth);
      CHECK_FALSE(bad_dp.ok());
      CHECK_MESSAGE(bad_dp.dV.c.ok(), bad_dp.summary());  // dV never sees dP
    }
  }
}

TEST_CASE("backward check: fp32 keeps kFp32GradTolerance, a truth of another type is refused") {
  const Problem p = flashstep::test::make_problem(1, 2, 33, 47, 24, true);
  const Inputs in = flashstep::random_inputs(p, 51);
  const auto dO = flashstep::random_output_grad(p, 52);
  const BackwardTruth truth = flashstep::backward_truth(p, in, dO);
  CHECK(truth.naive.dQ.empty());
  Grads g = to_grads(truth.reference);
  const auto c = check(p, g, truth);
  CHECK(c.ok());
  CHECK(c.dK.tolerance.atol == flashstep::kFp32GradTolerance.atol);
  g.dK[7] += 1e-2f;
  CHECK_FALSE(check(p, g, truth).ok());
  CHECK_THROWS_WITH_AS(check(typed(p, DType::kFp16), g, truth),
                       doctest::Contains("computed from fp32 inputs, the run is fp16"),
                       flashstep::Error);
}
