#include "check.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>
#include <string>
#include <utility>

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

namespace {

// fp32's unit roundoff, and gamma_n = n u / (1 - n u) (Higham, "Accuracy and
// Stability of Numerical Algorithms", Lemma 3.1): the relative error bound
// of n successive fp32 roundings.
constexpr double kFp32UnitRoundoff = 0x1p-24;
double gamma_fp32(std::int64_t n) {
  const double nu = static_cast<double>(n) * kFp32UnitRoundoff;
  return nu / (1.0 - nu);
}

// A type's unit roundoff: 2^-11 for fp16's 11 significant bits, 2^-8 for bf16's 8.
double unit_roundoff(DType t) { return t == DType::kFp16 ? 0x1p-11 : 0x1p-8; }

// check.h's cancellation floors of dQ and dK (without the fp32 absolute part),
// in fp64, from the rounded inputs and the naive O. Grouped heads: query head
// bh reads K/V head p.kv_head(bh), and dK's bound sums over the group's query
// heads (consecutive: head bh is member bh % G), as dK does.
std::pair<double, double> cancellation_floors(const Problem& p, const Inputs& r,
                                              const std::vector<float>& dO,
                                              const std::vector<double>& O) {
  const double scale = std::abs(p.softmax_scale());
  const double gamma = gamma_fp32(p.d + 2) * (1.0 + unit_roundoff(p.dtype));
  const auto d = static_cast<size_t>(p.d);
  double floor_dQ = 0.0, floor_dK = 0.0;
  std::vector<double> dK_bound(static_cast<size_t>(p.Nk) * d, 0.0);  // of bh's K/V head
  for (std::int64_t bh = 0; bh < p.heads(); ++bh) {
    const float* Qh = r.Q.data() + bh * p.Nq * p.d;
    const float* Kh = r.K.data() + p.kv_head(bh) * p.Nk * p.d;
    const float* Vh = r.V.data() + p.kv_head(bh) * p.Nk * p.d;
    const float* dOh = dO.data() + bh * p.Nq * p.d;
    const double* Oh = O.data() + bh * p.Nq * p.d;
    if (bh % p.group() == 0) std::fill(dK_bound.begin(), dK_bound.end(), 0.0);
    for (std::int64_t i = 0; i < p.Nq; ++i) {
      const std::int64_t visible = p.visible_keys(i);
      if (visible == 0) continue;
      std::vector<double> s(static_cast<size_t>(visible));
      double m = -INFINITY;
      for (std::int64_t j = 0; j < visible; ++j) {
        double dot = 0.0;
        for (size_t k = 0; k < d; ++k) dot += double{Qh[i * p.d + k]} * Kh[j * p.d + k];
        s[j] = p.softmax_scale() * dot;
        m = std::max(m, s[j]);
      }
      double l = 0.0;
      for (double& x : s) l += (x = std::exp(x - m));
      double dO_O = 0.0;
      for (size_t k = 0; k < d; ++k) dO_O += std::abs(dOh[i * p.d + k] * Oh[i * p.d + k]);
      std::vector<double> dQ_bound(d, 0.0);
      for (std::int64_t j = 0; j < visible; ++j) {
        double dO_V = 0.0;
        for (size_t k = 0; k < d; ++k) dO_V += std::abs(double{dOh[i * p.d + k]} * Vh[j * p.d + k]);
        const double dS_error = s[j] / l * gamma * (dO_V + dO_O);
        for (size_t k = 0; k < d; ++k) {
          dQ_bound[k] += dS_error * std::abs(Kh[j * p.d + k]);
          dK_bound[j * d + k] += dS_error * std::abs(Qh[i * p.d + k]);
        }
      }
      for (double x : dQ_bound) floor_dQ = std::max(floor_dQ, scale * x);
    }
    if (bh % p.group() == p.group() - 1) {  // the group's last query head
      for (double x : dK_bound) floor_dK = std::max(floor_dK, scale * x);
    }
  }
  return {floor_dQ, floor_dK};
}

GradientCheck check_gradient(const float* got, const std::vector<double>& want,
                             const std::vector<double>& naive, double floor, DType t) {
  GradientCheck g;
  g.tolerance = kFp32GradTolerance;
  if (t != DType::kFp32) {
    for (size_t k = 0; k < want.size(); ++k) {
      if (std::isfinite(want[k]) && std::isfinite(naive[k])) {
        g.naive_error = std::max(g.naive_error, std::abs(naive[k] - want[k]));
      }
    }
    g.floor = floor;
    g.tolerance = {2.0 * g.naive_error + floor, 0.0};
  }
  g.c = compare(got, want, g.tolerance);
  return g;
}

}  // namespace

BackwardTruth backward_truth(const Problem& p, const Inputs& in, const std::vector<float>& dO,
                             const std::vector<float>* O_read) {
  BackwardTruth truth;
  truth.dtype = p.dtype;
  if (p.dtype == DType::kFp32) {
    truth.reference = reference_backward(p, in.Q.data(), in.K.data(), in.V.data(), dO.data());
    return truth;
  }
  Inputs r = in;
  std::vector<float> dO16 = dO;
  for (std::vector<float>* x : {&r.Q, &r.K, &r.V, &dO16}) {
    round_to_dtype(p.dtype, x->data(), static_cast<std::int64_t>(x->size()));
  }
  truth.reference = reference_backward(p, r.Q.data(), r.K.data(), r.V.data(), dO16.data());
  if (O_read != nullptr) {
    if (O_read->size() != static_cast<size_t>(p.q_elems())) {
      throw Error("backward_truth: O has " + std::to_string(O_read->size()) +
                  " elements, the problem " + std::to_string(p.q_elems()));
    }
    const ForwardCheck forward = check_forward(p, O_read->data(), nullptr, forward_truth(p, in));
    if (!forward.ok()) {
      throw Error("backward_truth: the O the backward read fails the forward's rule: " +
                  forward.summary());
    }
  }
  const std::vector<double> O =
      O_read != nullptr ? std::vector<double>(O_read->begin(), O_read->end())
                        : naive_low_precision_rows(p, r.Q.data(), r.K.data(), r.V.data(), 1);
  std::vector<float> O32(O.begin(), O.end());
  truth.naive = naive_low_precision_backward(p, r.Q.data(), r.K.data(), r.V.data(), dO16.data(),
                                             O32.data());
  const auto [dQ, dK] = cancellation_floors(p, r, dO16, O);
  truth.floor_dQ = kFp32GradTolerance.atol + dQ;
  truth.floor_dK = kFp32GradTolerance.atol + dK;
  truth.floor_dV = kFp32GradTolerance.atol;
  return truth;
}

bool BackwardCheck::ok() const { return dQ.c.ok() && dK.c.ok() && dV.c.ok(); }

std::string BackwardCheck::summary() const {
  std::ostringstream s;
  s.precision(3);
  const char* names[] = {"dQ", "dK", "dV"};
  const GradientCheck* grads[] = {&dQ, &dK, &dV};
  for (int k = 0; k < 3; ++k) {
    const GradientCheck& g = *grads[k];
    s << (k > 0 ? "\n" : "") << names[k] << ": " << g.c.summary();
    if (dtype != DType::kFp32) {
      s << " (bound " << g.tolerance.atol << " = 2 x the naive low-precision error "
        << g.naive_error << " + floor " << g.floor << ")";
    }
    if (g.c.checked == 0) s << " (nothing compared: unchecked, not a pass)";
  }
  return s.str();
}

BackwardCheck check_backward(const Problem& p, const float* dQ, const float* dK, const float* dV,
                             const BackwardTruth& truth) {
  if (truth.dtype != p.dtype) {
    throw Error("check_backward: the reference was computed from " +
                std::string(dtype_name(truth.dtype)) + " inputs, the run is " +
                std::string(dtype_name(p.dtype)));
  }
  BackwardCheck c;
  c.dtype = p.dtype;
  c.dQ = check_gradient(dQ, truth.reference.dQ, truth.naive.dQ, truth.floor_dQ, p.dtype);
  c.dK = check_gradient(dK, truth.reference.dK, truth.naive.dK, truth.floor_dK, p.dtype);
  c.dV = check_gradient(dV, truth.reference.dV, truth.naive.dV, truth.floor_dV, p.dtype);
  return c;
}

}  // namespace flashstep
