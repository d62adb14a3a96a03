// The fp64 reference against hand-computed cases and an independent loop.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "common/check.h"
#include "common/parallel.h"
#include "common/reference.h"
#include "shapes.h"

using flashstep::Problem;
using flashstep::reference_forward;

TEST_CASE("reference: two keys, hand-computed softmax") {
  // s = [0, ln 3] -> softmax [1/4, 3/4]; O = 2/4 + 6*3/4 = 5; L = ln(1 + 3).
  Problem p;
  p.Nq = 1;
  p.Nk = 2;
  p.d = 1;
  p.scale = 1.0;
  const std::vector<float> Q = {1.0f};
  const std::vector<float> K = {0.0f, static_cast<float>(std::log(3.0))};
  const std::vector<float> V = {2.0f, 6.0f};
  const auto r = reference_forward(p, Q.data(), K.data(), V.data());
  CHECK(r.O[0] == doctest::Approx(5.0).epsilon(1e-7));
  CHECK(r.L[0] == doctest::Approx(std::log(4.0)).epsilon(1e-7));
}

TEST_CASE("reference: rows that see no key give O = 0 and L = -inf") {
  Problem p;
  p.Nq = 3;
  p.Nk = 1;
  p.d = 2;
  p.causal = true;  // rows 0 and 1 see no key, row 2 sees key 0
  p.scale = 1.0;
  const std::vector<float> Q = {1, 1, 1, 1, 1, 2};
  const std::vector<float> K = {3, 4};
  const std::vector<float> V = {7, 8};
  const auto r = reference_forward(p, Q.data(), K.data(), V.data());
  for (int i = 0; i < 2; ++i) {
    CHECK(r.O[2 * i] == 0.0);
    CHECK(r.O[2 * i + 1] == 0.0);
    CHECK(r.L[i] == -std::numeric_limits<double>::infinity());
  }
  CHECK(r.O[4] == 7.0);  // one visible key: its value, weight 1
  CHECK(r.O[5] == 8.0);
  CHECK(r.L[2] == doctest::Approx(1 * 3 + 2 * 4));  // log(exp(s)) = s
}

TEST_CASE("reference: logits far beyond fp32 exp's range stay finite") {
  Problem p;
  p.Nq = 1;
  p.Nk = 2;
  p.d = 1;
  p.scale = 1.0;
  const std::vector<float> Q = {1000.0f};
  const std::vector<float> K = {1.0f, 1.0f};  // both logits 1000: equal weights
  const std::vector<float> V = {1.0f, 3.0f};
  const auto r = reference_forward(p, Q.data(), K.data(), V.data());
  CHECK(r.O[0] == doctest::Approx(2.0));
  CHECK(r.L[0] == doctest::Approx(1000.0 + std::log(2.0)));
}

TEST_CASE("reference agrees with an independent triple loop, causal and not") {
  for (bool causal : {false, true}) {
    Problem p;
    p.B = 2;
    p.H = 1;
    p.Nq = 7;
    p.Nk = 5;
    p.d = 3;
    p.causal = causal;
    const auto in = flashstep::random_inputs(p, 42);
    const auto r = reference_forward(p, in.Q.data(), in.K.data(), in.V.data());
    const double scale = 1.0 / std::sqrt(3.0);
    for (std::int64_t b = 0; b < p.B; ++b) {
      for (std::int64_t i = 0; i < p.Nq; ++i) {
        const std::int64_t visible = causal ? std::max<std::int64_t>(0, i + p.Nk - p.Nq + 1) : p.Nk;
        std::vector<double> w(static_cast<size_t>(visible));
        double sum = 0.0;
        for (std::int64_t j = 0; j < visible; ++j) {
          double s = 0.0;
          for (std::int64_t k = 0; k < p.d; ++k) {
            s += double(in.Q[(b * p.Nq + i) * p.d + k]) * double(in.K[(b * p.Nk + j) * p.d + k]);
          }
          w[j] = std::exp(s * scale);  // small logits: no max needed here
          sum += w[j];
        }
        for (std::int64_t k = 0; k < p.d; ++k) {
          double o = 0.0;
          for (std::int64_t j = 0; j < visible; ++j) o += w[j] * in.V[(b * p.Nk + j) * p.d + k];
          CHECK(r.O[(b * p.Nq + i) * p.d + k] == doctest::Approx(visible ? o / sum : 0.0));
        }
        if (visible) CHECK(r.L[b * p.Nq + i] == doctest::Approx(std::log(sum)));
      }
    }
  }
}

TEST_CASE("reference on every k-th row computes those rows exactly and marks the rest") {
  Problem p;
  p.B = 1;
  p.H = 2;
  p.Nq = 9;
  p.Nk = 6;
  p.d = 4;
  const auto in = flashstep::random_inputs(p, 7);
  const auto full = reference_forward(p, in.Q.data(), in.K.data(), in.V.data());
  const auto some = flashstep::reference_forward_rows(p, in.Q.data(), in.K.data(), in.V.data(), 4);
  for (std::int64_t bh = 0; bh < 2; ++bh) {
    for (std::int64_t i = 0; i < p.Nq; ++i) {
      const size_t row = static_cast<size_t>(bh * p.Nq + i);
      if (i % 4 == 0) CHECK(some.L[row] == full.L[row]);
      else CHECK(std::isnan(some.L[row]));
    }
  }
}

TEST_CASE("compare: the bound, infinities and NaN") {
  const std::vector<double> want = {1.0, -std::numeric_limits<double>::infinity(), 0.0,
                                    std::numeric_limits<double>::quiet_NaN()};
  const float ok[] = {1.00001f, -INFINITY, 5e-6f, 123.0f};
  CHECK(flashstep::compare(ok, want, flashstep::kFp32Tolerance).ok());
  CHECK(flashstep::compare(ok, want, flashstep::kFp32Tolerance).checked == 3);
  const float off[] = {1.001f, -INFINITY, 0.0f, 0.0f};
  const auto c = flashstep::compare(off, want, flashstep::kFp32Tolerance);
  CHECK(c.mismatches == 1);
  CHECK(c.worst_index == 0);
  const float nan[] = {NAN, -INFINITY, 0.0f, 0.0f};
  CHECK(flashstep::compare(nan, want, flashstep::kFp32Tolerance).mismatches == 1);
  const float inf[] = {1.0f, 0.0f, 0.0f, 0.0f};  // finite where -inf is wanted
  CHECK(flashstep::compare(inf, want, flashstep::kFp32Tolerance).mismatches == 1);
}

TEST_CASE("compare: a reference NaN everywhere compares nothing, and that is no pass") {
  // All-NaN inputs give a NaN reference; so did a scale so large that the
  // scores overflow. Nothing is compared: the check must not say ok.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> want(4, nan);
  const float got[] = {NAN, NAN, 1.0f, 0.0f};
  const auto c = flashstep::compare(got, want, flashstep::kFp32Tolerance);
  CHECK(c.checked == 0);
  CHECK(c.skipped == 4);
  CHECK(c.mismatches == 0);
  CHECK_FALSE(c.ok());
  CHECK(c.summary().find("4 not compared: NaN in the reference") != std::string::npos);
  CHECK_FALSE(flashstep::compare(got, {}, flashstep::kFp32Tolerance).ok());
}

TEST_CASE("parallel_for: every index once, and a thrown error reaches the caller") {
  for (const std::int64_t n : {0, 1, 7, 1000}) {
    std::vector<int> seen(static_cast<size_t>(n), 0);
    flashstep::parallel_for(n, [&](std::int64_t i) { ++seen[static_cast<size_t>(i)]; });
    CHECK(std::count(seen.begin(), seen.end(), 1) == n);
  }
  CHECK_THROWS_WITH(flashstep::parallel_for(100,
                                            [](std::int64_t i) {
                                              if (i == 42) throw std::runtime_error("head 42");
                                            }),
                    "head 42");
}

TEST_CASE("reference: the heads shared out to threads give the one-thread loop's numbers") {
  // Each head computed alone (B = H = 1 problems) against all heads at once:
  // bit for bit, since a head's rows never depend on another head's.
  const Problem p = flashstep::test::make_problem(3, 4, 37, 53, 8, true);
  const flashstep::Inputs in = flashstep::random_inputs(p, 11);
  const flashstep::ReferenceResult all = reference_forward(p, in.Q.data(), in.K.data(), in.V.data());
  Problem one = p;
  one.B = 1;
  one.H = 1;
  for (std::int64_t bh = 0; bh < p.heads(); ++bh) {
    const flashstep::ReferenceResult head = reference_forward(
        one, in.Q.data() + bh * p.Nq * p.d, in.K.data() + bh * p.Nk * p.d,
        in.V.data() + bh * p.Nk * p.d);
    CAPTURE(bh);
    CHECK(std::equal(head.O.begin(), head.O.end(), all.O.begin() + bh * p.Nq * p.d));
    CHECK(std::equal(head.L.begin(), head.L.end(), all.L.begin() + bh * p.Nq));
  }
}
