#include "check.h"

#include <cmath>
#include <random>
#include <sstream>

#include "error.h"
#include "rounding.h"

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
  if (skipped > 0) s << " (" << skipped << " not compared: NaN in the reference)";
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
    if (std::isnan(w)) {
      ++c.skipped;
      continue;
    }
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

std::int64_t reference_row_step(const Problem& p) {
  const double macs = static_cast<double>(p.heads()) * static_cast<double>(p.Nq) *
                      static_cast<double>(p.Nk) * static_cast<double>(p.d);
  return std::max<std::int64_t>(static_cast<std::int64_t>(std::ceil(macs / kReferenceMacBudget)),
                                1);
}

ForwardTruth forward_truth(const Problem& p, const Inputs& in, std::int64_t row_step) {
  ForwardTruth truth;
  truth.dtype = p.dtype;
  if (p.dtype == DType::kFp32) {
    truth.reference = reference_forward_rows(p, in.Q.data(), in.K.data(), in.V.data(), row_step);
    return truth;
  }
  Inputs rounded = in;
  for (std::vector<float>* x : {&rounded.Q, &rounded.K, &rounded.V}) {
    round_to_dtype(p.dtype, x->data(), static_cast<std::int64_t>(x->size()));
  }
  truth.reference = reference_forward_rows(p, rounded.Q.data(), rounded.K.data(),
                                           rounded.V.data(), row_step);
  truth.naive_O = naive_low_precision_rows(p, rounded.Q.data(), rounded.K.data(),
                                           rounded.V.data(), row_step);
  return truth;
}

bool ForwardCheck::ok() const { return O.ok() && (!L || L->ok()); }

std::string ForwardCheck::summary() const {
  std::ostringstream s;
  s.precision(3);
  s << "O: " << O.summary();
  if (dtype != DType::kFp32) {
    s << " (bound " << o_tolerance.atol << " = 2 x the naive low-precision error " << naive_error
      << " + " << kLowPrecisionFloor << ")";
  }
  if (O.checked == 0) s << " (nothing compared: unchecked, not a pass)";
  if (L) {
    s << "; L: " << L->summary();
    if (L->checked == 0) s << " (nothing compared: unchecked, not a pass)";
  }
  return s.str();
}

ForwardCheck check_forward(const Problem& p, const float* O, const float* L,
                           const ForwardTruth& truth) {
  if (truth.dtype != p.dtype) {
    throw Error("check_forward: the reference was computed from " +
                std::string(dtype_name(truth.dtype)) + " inputs, the run is " +
                std::string(dtype_name(p.dtype)));
  }
  const std::vector<double>& want = truth.reference.O;
  ForwardCheck c;
  c.dtype = p.dtype;
  c.o_tolerance = kFp32Tolerance;
  if (p.dtype != DType::kFp32) {
    // Elements where both are finite: a naive NaN or inf must not widen the bound.
    for (size_t k = 0; k < want.size(); ++k) {
      const double naive = truth.naive_O[k];
      if (std::isfinite(want[k]) && std::isfinite(naive)) {
        c.naive_error = std::max(c.naive_error, std::abs(naive - want[k]));
      }
    }
    // max |O - O_ref| <= bound is every element within the bound: compare's
    // absolute part with no relative part.
    c.o_tolerance = {2.0 * c.naive_error + kLowPrecisionFloor, 0.0};
  }
  c.O = compare(O, want, c.o_tolerance);
  if (L) c.L = compare(L, truth.reference.L, kFp32Tolerance);
  return c;
}

}  // namespace flashstep
