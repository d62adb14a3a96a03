#include "check.h"

#include <cmath>
#include <random>
#include <sstream>

namespace flashstep {

namespace {
// How many mismatching elements a failure report lists before it stops.
constexpr int kMismatchesReported = 5;

std::vector<float> normal_vector(std::int64_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> dist(kInputMean, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}
}  // namespace

Inputs random_inputs(const Problem& p, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Inputs in;
  in.Q = normal_vector(p.q_elems(), rng);
  in.K = normal_vector(p.kv_elems(), rng);
  in.V = normal_vector(p.kv_elems(), rng);
  return in;
}

std::vector<float> random_output_grad(const Problem& p, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  return normal_vector(p.q_elems(), rng);
}

std::string Comparison::summary() const {
  std::ostringstream s;
  s.precision(3);
  s << "max abs " << max_abs_error << ", max rel " << max_rel_error << ", " << mismatches
    << " of " << checked << " outside the bound";
  if (!first_mismatches.empty()) s << "; first: " << first_mismatches;
  return s.str();
}

Comparison compare(const float* got, const std::vector<double>& want, Tolerance tol) {
  Comparison c;
  double worst_ratio = -1.0;
  std::ostringstream first;
  first.precision(9);
  int reported = 0;
  for (size_t k = 0; k < want.size(); ++k) {
    const double w = want[k];
    if (std::isnan(w)) continue;
    ++c.checked;
    const double g = got[k];
    const double bound = tol.atol + tol.rtol * std::abs(w);
    bool bad = false;
    double ratio = 0.0;
    if (std::isinf(w) || std::isinf(g) || std::isnan(g)) {
      bad = !(g == w);
      ratio = bad ? INFINITY : 0.0;
    } else {
      const double err = std::abs(g - w);
      c.max_abs_error = std::max(c.max_abs_error, err);
      if (std::abs(w) > tol.atol) c.max_rel_error = std::max(c.max_rel_error, err / std::abs(w));
      ratio = err / bound;
      bad = err > bound;
    }
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      c.worst_index = static_cast<std::int64_t>(k);
    }
    if (bad) {
      ++c.mismatches;
      if (reported++ < kMismatchesReported) {
        first << (reported > 1 ? "; " : "") << "[" << k << "] got " << g << ", want " << w;
      }
    }
  }
  c.first_mismatches = first.str();
  return c;
}

}  // namespace flashstep
