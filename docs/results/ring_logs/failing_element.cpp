// Stage 10's failing element at N = 2,097,152 (call2_ring_strong.log), emulated on the CPU:
// row 1048576 of head 3, B = 1, H = 8, d = 128, causal, the inputs of flashstep's
// random_inputs(p, 0) rounded to bf16 by the project's round_to_dtype. Prints, for columns
// 0..3, the fp64 reference, the merge of the three chunk partials in fp64, and the merge of the
// partials rounded to bf16 (each then rounded to bf16 too).
// The draws are random_inputs' (mt19937_64, normal(kInputMean, 1) floats: Q, then K, then V),
// streamed here rather than called: random_inputs would hold all of Q, K and V, 25.8 GB at
// this size, and this row needs one Q row and 1 GB of its head's K and V. Build from the
// repository root, without -march=native (FMA contraction changes the normal draws):
//   g++ -O2 -I stages docs/results/ring_logs/failing_element.cpp stages/common/rounding.cpp
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "common/check.h"
#include "common/rounding.h"
static float bf16(float x) { return flashstep::round_to_dtype(flashstep::DType::kBf16, x); }
int main() {
  const std::int64_t H = 8, N = std::int64_t{1} << 21, d = 128, h = 3, i = 1048576;
  const std::int64_t visible = i + 1, chunk = N / 4;
  std::mt19937_64 rng(0);
  std::normal_distribution<float> dist(flashstep::kInputMean, 1.0f);
  std::vector<float> q(d), K(visible * d), V(visible * d);
  const std::int64_t elems = H * N * d;
  const std::int64_t q_at = (h * N + i) * d, kv_at = h * N * d;
  for (std::int64_t k = 0; k < elems; ++k) { float x = dist(rng); if (k >= q_at && k < q_at + d) q[k - q_at] = bf16(x); }
  for (std::int64_t k = 0; k < elems; ++k) { float x = dist(rng); if (k >= kv_at && k < kv_at + visible * d) K[k - kv_at] = bf16(x); }
  for (std::int64_t k = 0; k < kv_at + visible * d; ++k) { float x = dist(rng); if (k >= kv_at) V[k - kv_at] = bf16(x); }
  const double scale = static_cast<float>(1.0 / std::sqrt(double(d)));
  std::vector<double> s(visible);
  for (std::int64_t j = 0; j < visible; ++j) { double a = 0; for (int c = 0; c < d; ++c) a += double(q[c]) * K[j * d + c]; s[j] = scale * a; }
  auto partial = [&](std::int64_t j0, std::int64_t j1, std::vector<double>& O, double& L) {
    double m = -INFINITY; for (std::int64_t j = j0; j < j1; ++j) m = std::max(m, s[j]);
    double l = 0; O.assign(d, 0.0);
    for (std::int64_t j = j0; j < j1; ++j) { double e = std::exp(s[j] - m); l += e; for (int c = 0; c < d; ++c) O[c] += e * V[j * d + c]; }
    for (auto& o : O) o /= l;
    L = m + std::log(l);
  };
  std::vector<double> Oref, P[3]; double Lref, Lp[3];
  partial(0, visible, Oref, Lref);
  partial(0, chunk, P[0], Lp[0]); partial(chunk, 2 * chunk, P[1], Lp[1]); partial(2 * chunk, visible, P[2], Lp[2]);
  for (int c = 0; c < 4; ++c) {
    double exact = 0, rounded = 0;
    for (int k = 0; k < 3; ++k) { double w = std::exp(Lp[k] - Lref); exact += w * P[k][c]; rounded += w * double(bf16(float(P[k][c]))); }
    std::printf("c=%d ref %.9f | fp64 partials -> %.9f (bf16 %.9f) | bf16 partials -> %.9f (bf16 %.9f) | partials %.6f %.6f w %.7f %.7f %.3g\n", c, Oref[c], exact,
                bf16(float(exact)), rounded, bf16(float(rounded)), P[0][c], P[1][c], std::exp(Lp[0] - Lref), std::exp(Lp[1] - Lref), std::exp(Lp[2] - Lref));
  }
}
