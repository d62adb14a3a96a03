/// \file shapes.h
/// \brief The shared ragged problem grid every stage is checked on.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/problem.h"

namespace flashstep::test {

/// (B, H, Nq, Nk, d): a covering set over the (Nq, Nk) pairs
/// {(1,1), (1,239), (113,203), (128,217), (239,1), (1023,1024)} and head
/// dimensions {1, 16, 40, 59, 64, 96, 128, 256}, always with B*H > 1. Sizes
/// that are not multiples of any tile catch the ragged-edge bugs; Nq > Nk with
/// causal gives rows that see no key.
struct Shape {
  std::int64_t B, H, Nq, Nk, d;
};

inline const std::vector<Shape> kRaggedShapes = {
    {2, 1, 1, 1, 1},        {1, 2, 1, 239, 16},    {2, 2, 113, 203, 40},
    {1, 3, 128, 217, 59},   {2, 1, 239, 1, 64},    {1, 2, 1023, 1024, 64},
    {2, 1, 113, 203, 96},   {1, 2, 128, 217, 128}, {2, 1, 239, 1, 256},
    {1, 2, 1023, 1024, 256}, {2, 1, 1, 239, 128},   {1, 2, 128, 217, 1},
};

/// A problem with the default softmax scale.
inline Problem make_problem(std::int64_t B, std::int64_t H, std::int64_t Nq, std::int64_t Nk,
                            std::int64_t d, bool causal) {
  Problem p;
  p.B = B;
  p.H = H;
  p.Nq = Nq;
  p.Nk = Nk;
  p.d = d;
  p.causal = causal;
  return p;
}

/// The problems of the grid, each non-causal and causal.
inline std::vector<Problem> ragged_problems() {
  std::vector<Problem> out;
  for (const Shape& s : kRaggedShapes) {
    for (bool causal : {false, true}) out.push_back(make_problem(s.B, s.H, s.Nq, s.Nk, s.d, causal));
  }
  return out;
}

/// (B, H, H_kv, Nq, Nk, d): grouped-query problems, H / H_kv in {1, 4, 8, 32}
/// (32 with H_kv = 1: multi-query), on ragged sizes; Nq > Nk causal leaves
/// rows that see no key.
struct GroupedShape {
  std::int64_t B, H, H_kv, Nq, Nk, d;
};

inline const std::vector<GroupedShape> kGroupedShapes = {
    {2, 4, 4, 113, 203, 40}, {1, 8, 2, 1, 239, 64},  {2, 8, 1, 128, 217, 59},
    {1, 32, 1, 3, 257, 128}, {2, 4, 1, 239, 1, 16},  {1, 16, 2, 16, 100, 96},
};

/// The grouped problems, each non-causal and causal.
inline std::vector<Problem> grouped_problems() {
  std::vector<Problem> out;
  for (const GroupedShape& s : kGroupedShapes) {
    for (bool causal : {false, true}) {
      Problem p = make_problem(s.B, s.H, s.Nq, s.Nk, s.d, causal);
      p.H_kv = s.H_kv;
      out.push_back(p);
    }
  }
  return out;
}

/// K or V [B, H_kv, Nk, d] copied out to [B, H, Nk, d]: query head h's own copy
/// of K/V head h / (H / H_kv), written without kv_head_of.
inline std::vector<float> expand_heads(const Problem& p, const std::vector<float>& kv) {
  const std::int64_t group = p.H / p.kv_heads();
  const std::int64_t head = p.Nk * p.d;  // elements of one head
  std::vector<float> out(static_cast<size_t>(p.B * p.H * head));
  for (std::int64_t b = 0; b < p.B; ++b) {
    for (std::int64_t h = 0; h < p.H; ++h) {
      const std::int64_t from = (b * p.kv_heads() + h / group) * head;
      const std::int64_t to = (b * p.H + h) * head;
      for (std::int64_t e = 0; e < head; ++e) out[to + e] = kv[from + e];
    }
  }
  return out;
}

/// p with H_kv = H: the expanded problem.
inline Problem ungrouped(Problem p) {
  p.H_kv.reset();
  return p;
}

/// p with the softmax scale `scale` in element type `t` (the mirror tests'
/// negative, zero and large scales).
inline Problem with_scale(Problem p, double scale, DType t) {
  p.scale = scale;
  p.dtype = t;
  return p;
}

/// Whether a and b hold the same floats bit for bit (NaNs included).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace flashstep::test
