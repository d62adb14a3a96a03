#include "problem.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>

#include "error.h"

namespace flashstep {

namespace {
// A grid dimension or loop bound in a kernel is a 32-bit int.
constexpr std::int64_t kMaxDim = 2147483647;
// 2^62: products of two sizes stay below int64's 2^63 with room for bytes (x4).
constexpr double kMaxElems = 4.611686018427388e18 / 8.0;
}  // namespace

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kFp32: return "fp32";
    case DType::kFp16: return "fp16";
    case DType::kBf16: return "bf16";
  }
  return "unknown";  // not reached: every enumerator is named above
}

DType parse_dtype(std::string_view name) {
  for (DType t : {DType::kFp32, DType::kFp16, DType::kBf16}) {
    if (name == dtype_name(t)) return t;
  }
  throw Error("unknown element type '" + std::string(name) + "' (known: fp32, fp16, bf16)");
}

double Problem::softmax_scale() const {
  return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(d));
}

std::int64_t Problem::visible_keys(std::int64_t i) const {
  if (!causal) return Nk;
  return std::clamp<std::int64_t>(i + Nk - Nq + 1, 0, Nk);
}

double Problem::forward_flops() const {
  const double full = 4.0 * static_cast<double>(B) * static_cast<double>(H) *
                      static_cast<double>(Nq) * static_cast<double>(Nk) *
                      static_cast<double>(d);
  return causal ? full / 2.0 : full;
}

std::string Problem::describe() const {
  std::ostringstream s;
  s << "B=" << B << " H=" << H << " Nq=" << Nq << " Nk=" << Nk << " d=" << d
    << (causal ? " causal" : " non-causal");
  if (scale) s << " scale=" << *scale;
  if (dtype != DType::kFp32) s << " " << dtype_name(dtype);
  return s.str();
}

void validate(const Problem& p) {
  auto positive = [](const char* name, std::int64_t v) {
    if (v < 1) {
      throw Error(std::string(name) + " must be >= 1, got " + std::to_string(v));
    }
  };
  positive("B", p.B);
  positive("H", p.H);
  positive("Nq", p.Nq);
  positive("Nk", p.Nk);
  positive("d", p.d);
  if (p.d > kMaxHeadDim) {
    throw Error("d must be <= " + std::to_string(kMaxHeadDim) + ", got " +
                std::to_string(p.d));
  }
  for (auto [name, v] : {std::pair{"B", p.B}, {"H", p.H}, {"Nq", p.Nq}, {"Nk", p.Nk}}) {
    if (v > kMaxDim) {
      throw Error(std::string(name) + " must be <= " + std::to_string(kMaxDim) +
                  " (kernels index one dimension with 32 bits), got " + std::to_string(v));
    }
  }
  // Element counts are 64-bit; keep every product of sizes far from overflow.
  const double largest = static_cast<double>(p.B) * static_cast<double>(p.H) *
                         static_cast<double>(std::max(p.Nq, p.Nk)) *
                         static_cast<double>(std::max({p.Nq, p.Nk, p.d}));
  if (largest > kMaxElems) {
    throw Error("problem too large: B*H*N*max(N,d) = " + std::to_string(largest) +
                " elements exceeds 64-bit indexing headroom");
  }
  if (p.scale && !std::isfinite(*p.scale)) {
    throw Error("scale must be finite, got " + std::to_string(*p.scale));
  }
}

}  // namespace flashstep
