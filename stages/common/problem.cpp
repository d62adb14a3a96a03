#include "problem.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <utility>

#include "error.h"

namespace flashstep {

namespace {
// A grid dimension or loop bound in a kernel is a 32-bit int.
constexpr std::int64_t kMaxDim = 2147483647;
// The models' counts grow as B*H*Nq*Nk*d, plus per-row and per-tile terms
// that dominate below 64 keys or 64 dimensions (a tile's width): so their size
// is measured by B*H*Nq*max(Nk, 64)*max(d, 64). Per unit of it they count at
// most ~49 bytes or FLOPs (stage 05's backward shared-memory traffic, read
// plus write, over a grid of shapes), so below 2^57 every field and every
// read + write sum stays under int64's 2^63. This also keeps every element
// count far inside int64. A problem at the bound is some 2^59 FLOPs: hours
// on the fastest stage.
constexpr double kPadTo = 64;
constexpr double kMaxWork = 144115188075855872.0;  // 2^57

// A number as printf's %g writes it, for messages.
std::string short_number(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}
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
  s << "B=" << B << " H=" << H;
  if (grouped()) s << " H_kv=" << kv_heads();
  s << " Nq=" << Nq << " Nk=" << Nk << " d=" << d
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
  if (p.H_kv) {
    positive("H_kv", *p.H_kv);
    if (p.H % *p.H_kv != 0) {
      throw Error("H must be a multiple of H_kv (each K/V head serves H / H_kv query heads), got H=" +
                  std::to_string(p.H) + " H_kv=" + std::to_string(*p.H_kv));
    }
  }
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
  const double work = static_cast<double>(p.B) * static_cast<double>(p.H) *
                      static_cast<double>(p.Nq) * std::max(static_cast<double>(p.Nk), kPadTo) *
                      std::max(static_cast<double>(p.d), kPadTo);
  if (work > kMaxWork) {
    throw Error("problem too large: B*H*Nq*max(Nk,64)*max(d,64) = " + short_number(work) +
                " exceeds 2^57 = " + short_number(kMaxWork) +
                ", the most the 64-bit traffic and FLOP models count");
  }
  // The kernels scale in fp32: a double beyond FLT_MAX would become inf there.
  if (p.scale && !(std::abs(*p.scale) <= std::numeric_limits<float>::max())) {
    throw Error("scale must be finite in fp32 (|scale| <= " +
                short_number(std::numeric_limits<float>::max()) + "), got " +
                short_number(*p.scale));
  }
}

}  // namespace flashstep
