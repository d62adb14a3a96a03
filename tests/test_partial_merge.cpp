// The partial merge (common/partial_merge.h) against the fp64 reference:
// attention over disjoint key slices, merged, equals attention over all keys.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/check.h"
#include "common/partial_merge.h"
#include "common/reference.h"

using flashstep::Problem;

namespace {

constexpr float kNoKey = -std::numeric_limits<float>::infinity();

/// One partial: attention of every query row over keys [k0, k1) only (with
/// the full problem's causal visibility), in fp64, stored as fp32 the way a
/// kernel stores it. A row that sees no key of the slice gets O = 0, L = -inf.
struct Partial {
  std::vector<float> O;  // [B, H, Nq, d]
  std::vector<float> L;  // [B, H, Nq]
};

Partial slice_attention(const Problem& p, const flashstep::Inputs& in, std::int64_t k0,
                        std::int64_t k1) {
  Partial part{std::vector<float>(static_cast<size_t>(p.q_elems())),
               std::vector<float>(static_cast<size_t>(p.lse_elems()))};
  const double scale = p.softmax_scale();
  for (std::int64_t h = 0; h < p.heads(); ++h) {
    const float* K = in.K.data() + h * p.Nk * p.d;  // [Nk, d]
    const float* V = in.V.data() + h * p.Nk * p.d;  // [Nk, d]
    for (std::int64_t i = 0; i < p.Nq; ++i) {
      const float* Qi = in.Q.data() + (h * p.Nq + i) * p.d;  // [d]
      const std::int64_t end = std::min(k1, p.visible_keys(i));
      std::vector<double> s;
      double m = -std::numeric_limits<double>::infinity();
      for (std::int64_t j = k0; j < end; ++j) {
        double dot = 0.0;
        for (std::int64_t c = 0; c < p.d; ++c) dot += double(Qi[c]) * K[j * p.d + c];
        s.push_back(scale * dot);
        m = std::max(m, s.back());
      }
      double l = 0.0;
      std::vector<double> o(static_cast<size_t>(p.d), 0.0);
      for (std::int64_t j = k0; j < end; ++j) {
        const double e = std::exp(s[static_cast<size_t>(j - k0)] - m);
        l += e;
        for (std::int64_t c = 0; c < p.d; ++c) o[static_cast<size_t>(c)] += e * V[j * p.d + c];
      }
      const std::int64_t row = h * p.Nq + i;
      part.L[static_cast<size_t>(row)] = s.empty() ? kNoKey : static_cast<float>(m + std::log(l));
      for (std::int64_t c = 0; c < p.d; ++c) {
        part.O[static_cast<size_t>(row * p.d + c)] =
            s.empty() ? 0.0f : static_cast<float>(o[static_cast<size_t>(c)] / l);
      }
    }
  }
  return part;
}

/// Key slice boundaries: `splits` slices of Nk as even as integer division
/// makes them (the last one takes the rest), some empty when splits > Nk.
std::vector<std::int64_t> boundaries(std::int64_t Nk, std::int64_t splits) {
  std::vector<std::int64_t> b;
  for (std::int64_t s = 0; s <= splits; ++s) b.push_back(Nk * s / splits);
  return b;
}

/// Checks merged O and L against the fp64 reference, by the fp32 bound.
void check_merged(const Problem& p, const flashstep::Inputs& in, const std::vector<float>& O,
                  const std::vector<float>& L) {
  const auto ref = flashstep::reference_forward(p, in.Q.data(), in.K.data(), in.V.data());
  const auto o = flashstep::compare(O.data(), ref.O, flashstep::kFp32Tolerance);
  const auto l = flashstep::compare(L.data(), ref.L, flashstep::kFp32Tolerance);
  INFO("O: " << o.summary());
  INFO("L: " << l.summary());
  CHECK(o.ok());
  CHECK(l.ok());
}

}  // namespace

TEST_CASE("partial merge: lse_merge by hand, and without overflow") {
  CHECK(flashstep::lse_merge(0.0f, 0.0f) == doctest::Approx(std::log(2.0)));
  CHECK(flashstep::lse_merge(std::log(1.0f), std::log(3.0f)) == doctest::Approx(std::log(4.0)));
  // exp(100) overflows fp32; the merge never forms it.
  CHECK(flashstep::lse_merge(100.0f, 100.0f) == doctest::Approx(100.0 + std::log(2.0)));
  CHECK(flashstep::lse_merge(kNoKey, 5.0f) == 5.0f);
  CHECK(flashstep::lse_merge(5.0f, kNoKey) == 5.0f);
  CHECK(flashstep::lse_merge(kNoKey, kNoKey) == kNoKey);
}

TEST_CASE("partial merge: weights of empty partials are 0, never NaN") {
  CHECK(flashstep::partial_weight(kNoKey, 3.0f) == 0.0f);
  CHECK(flashstep::partial_weight(kNoKey, kNoKey) == 0.0f);
  CHECK(flashstep::partial_weight(3.0f, 3.0f) == 1.0f);
  // Two partials with no key merge to the contract's empty row: O = 0, L = -inf.
  std::vector<float> O_a = {0.0f, 0.0f};
  float L_a = kNoKey;
  const std::vector<float> O_b = {0.0f, 0.0f};
  flashstep::merge_into(O_a.data(), L_a, O_b.data(), kNoKey, 2);
  CHECK(L_a == kNoKey);
  CHECK(O_a[0] == 0.0f);
  CHECK(O_a[1] == 0.0f);
}

TEST_CASE("partial merge: slices merged in order, in reverse, and n-way equal the reference") {
  struct Shape {
    std::int64_t Nq, Nk, d, splits;
    bool causal;
  };
  // Ragged lengths, more slices than keys (empty slices), Nq > Nk causal (rows
  // that see no key at all), one key, and a row-per-slice split.
  const Shape shapes[] = {{17, 97, 40, 3, false}, {17, 97, 40, 3, true},  {113, 17, 59, 5, true},
                          {1, 1023, 64, 7, false}, {3, 2, 8, 5, false},   {3, 2, 8, 5, true},
                          {203, 203, 1, 203, true}, {1, 1, 111, 1, false}};
  for (const Shape& s : shapes) {
    Problem p;
    p.B = 2;
    p.H = 3;
    p.Nq = s.Nq;
    p.Nk = s.Nk;
    p.d = s.d;
    p.causal = s.causal;
    CAPTURE(p.describe());
    CAPTURE(s.splits);
    const auto in = flashstep::random_inputs(p, 7);
    const auto b = boundaries(p.Nk, s.splits);
    std::vector<Partial> parts;
    for (std::int64_t k = 0; k < s.splits; ++k) {
      parts.push_back(slice_attention(p, in, b[static_cast<size_t>(k)], b[static_cast<size_t>(k + 1)]));
    }

    // Pairwise, in place, first to last and last to first (as a ring meets them).
    for (const bool reverse : {false, true}) {
      Partial acc = reverse ? parts.back() : parts.front();
      for (std::int64_t k = 1; k < s.splits; ++k) {
        const Partial& next = parts[static_cast<size_t>(reverse ? s.splits - 1 - k : k)];
        for (std::int64_t row = 0; row < p.lse_elems(); ++row) {
          flashstep::merge_into(acc.O.data() + row * p.d, acc.L[static_cast<size_t>(row)],
                                next.O.data() + row * p.d, next.L[static_cast<size_t>(row)],
                                static_cast<int>(p.d));
        }
      }
      check_merged(p, in, acc.O, acc.L);
    }

    // n-way, as a split-KV combine kernel does: L first, then the weighted sum.
    std::vector<float> O(static_cast<size_t>(p.q_elems()), 0.0f);
    std::vector<float> L(static_cast<size_t>(p.lse_elems()), kNoKey);
    for (std::int64_t row = 0; row < p.lse_elems(); ++row) {
      float& Lr = L[static_cast<size_t>(row)];
      for (const Partial& part : parts) Lr = flashstep::lse_merge(Lr, part.L[static_cast<size_t>(row)]);
      for (const Partial& part : parts) {
        const float w = flashstep::partial_weight(part.L[static_cast<size_t>(row)], Lr);
        for (std::int64_t c = 0; c < p.d; ++c) {
          O[static_cast<size_t>(row * p.d + c)] += w * part.O[static_cast<size_t>(row * p.d + c)];
        }
      }
    }
    check_merged(p, in, O, L);
  }
}
