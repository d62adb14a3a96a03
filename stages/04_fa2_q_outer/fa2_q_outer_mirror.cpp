// Stage 04's CPU mirror (host only): Algorithm 1 of the FlashAttention-2 paper
// in plain C++, with the kernel's loop order, tiles (Br = Bc = 64), log2-unit
// softmax and -inf guards, in float like the kernel. Data moves between the
// HBM arrays and the on-chip tiles only through Chip (common/mirror_chip.h),
// which counts every element moved, every shared-memory access and every
// FLOP; the tests check those counts against model() and the outputs against
// the fp64 reference.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/error.h"
#include "common/mirror_chip.h"
#include "fa2_q_outer.h"

namespace flashstep::fa2_q_outer {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

using mirror::Chip;
using mirror::Tile;

// Lines 4-15 of Algorithm 1 for Q block i of head bh (attend_q_block in the kernel).
void attend_q_block(const Problem& p, const HostTensors& t, std::int64_t bh, std::int64_t i,
                    float scale_log2, CausalMode mode, Chip& chip) {
  const std::int64_t d = p.d;
  const std::int64_t row0 = i * kBr;
  const std::int64_t R = std::min<std::int64_t>(kBr, p.Nq - row0);
  const std::int64_t Tc = (p.Nk + kBc - 1) / kBc;
  // Causal: blocks past Tc_i are wholly masked and skipped (not with kNoSkip).
  const std::int64_t Tc_i = kv_blocks_visited(p, i, mode);
  chip.cost.skipped_tiles += Tc - Tc_i;
  float* Oi = t.O + (bh * p.Nq + row0) * d;  // [R, d]
  float* Li = t.L + bh * p.Nq + row0;        // [R]
  if (Tc_i == 0) {  // every row of the block sees no key
    for (std::int64_t e = 0; e < R * d; ++e) chip.store(Oi + e, 0.0f);
    for (std::int64_t r = 0; r < R; ++r) chip.store(Li + r, -kInf);
    return;
  }
  const float* K = t.K + p.kv_head(bh) * p.Nk * d;  // [Nk, d] of this head's group
  const float* V = t.V + p.kv_head(bh) * p.Nk * d;  // [Nk, d] of this head's group

  // Line 4.
  Tile Qi, Kj, Vj, P_tilde_ij;
  chip.load(t.Q + (bh * p.Nq + row0) * d, R, d, Qi);
  // Line 5, in registers; m_i in log2 units.
  std::vector<float> O_tilde(static_cast<size_t>(R * d), 0.0f);
  std::vector<float> l_i(static_cast<size_t>(R), 0.0f);
  std::vector<float> m_i(static_cast<size_t>(R), -kInf);
  std::vector<float> S_ij;
  P_tilde_ij.rows = R;
  P_tilde_ij.cols = kBc;
  P_tilde_ij.v.assign(static_cast<size_t>(R * kBc), 0.0f);

  for (std::int64_t j = 0; j < Tc_i; ++j) {  // line 6
    const std::int64_t key0 = j * kBc;
    const std::int64_t C = std::min<std::int64_t>(kBc, p.Nk - key0);
    // Line 7.
    chip.load(K + key0 * d, C, d, Kj);
    chip.load(V + key0 * d, C, d, Vj);

    // Line 8, scaled into log2 units; keys above the diagonal -> -inf, tested
    // one by one only in a block that the rows do not all see whole (the kernel
    // pads the block to Br x Bc: rows past Nq and keys past Nk count as hidden).
    const bool test = mode == CausalMode::kMaskEvery ||
                      tile_mask({p.Nq, p.Nk, p.causal}, row0, kBr, key0, kBc) != TileMask::kNone;
    S_ij.assign(static_cast<size_t>(R * C), 0.0f);
    for (std::int64_t r = 0; r < R; ++r) {
      const std::int64_t visible = p.visible_keys(row0 + r) - key0;
      for (std::int64_t c = 0; c < C; ++c) {
        const float s = chip.mul(chip.dot(Qi, r, Kj, c, d), scale_log2);
        S_ij[static_cast<size_t>(r * C + c)] = !test || chip.mask_test(c < visible) ? s : -kInf;
      }
    }

    // BEGIN ASSIGNMENT: lines 9-10 (first half) of Algorithm 1 for each row r: m_new, P~_ij into P_tilde_ij, l_i, and O~_i rescaled by e^(m_old - m_new); count every FLOP through chip
    for (std::int64_t r = 0; r < R; ++r) {
      float* S_r = &S_ij[static_cast<size_t>(r * C)];
      float* O_r = &O_tilde[static_cast<size_t>(r * d)];
      // Line 9: m_new = max(m_i, rowmax(S_ij)).
      float m_new = m_i[static_cast<size_t>(r)];
      for (std::int64_t c = 0; c < C; ++c) m_new = chip.max(m_new, S_r[c]);
      // A row that has seen no key yet has m_new = -inf: subtracting 0
      // instead keeps exp(-inf - -inf) from giving NaN (P~ = 0, l = 0, O~ = 0).
      const float m_safe = m_new == -kInf ? 0.0f : m_new;
      const float alpha = chip.exp2(chip.sub(m_i[static_cast<size_t>(r)], m_safe));
      m_i[static_cast<size_t>(r)] = m_new;
      // Line 9: P~_ij = exp(S_ij - m_new), l_i = e^(m_old - m_new) l_i + rowsum(P~_ij).
      float l = chip.mul(alpha, l_i[static_cast<size_t>(r)]);
      for (std::int64_t c = 0; c < C; ++c) {
        const float P = chip.exp2(chip.sub(S_r[c], m_safe));
        chip.write(P_tilde_ij, r, c, P);
        l = chip.add(l, P);
      }
      l_i[static_cast<size_t>(r)] = l;
      // Line 10, first half: O~_i = diag(e^(m_old - m_new)) O~_i.
      for (std::int64_t k = 0; k < d; ++k) O_r[k] = chip.mul(O_r[k], alpha);
    }
    // END ASSIGNMENT
    // Line 10, second half: O~_i += P~_ij Vj, keys in order like the kernel.
    for (std::int64_t r = 0; r < R; ++r) {
      for (std::int64_t c = 0; c < C; ++c) {
        chip.axpy(P_tilde_ij, r, c, Vj, c, d, &O_tilde[static_cast<size_t>(r * d)]);
      }
    }
  }

  // Lines 12-15: one reciprocal per row, L = m ln2 + log(l) back in natural
  // units; a row that saw no key (l = 0) gets O = 0 and L = -inf.
  const float ln2 = static_cast<float>(kLn2);
  for (std::int64_t r = 0; r < R; ++r) {
    const float l = l_i[static_cast<size_t>(r)];
    const float recip = chip.div(1.0f, l);
    const float inv_l = l > 0.0f ? recip : 0.0f;
    for (std::int64_t k = 0; k < d; ++k) {
      chip.store(Oi + r * d + k, chip.mul(O_tilde[static_cast<size_t>(r * d + k)], inv_l));
    }
    const float lse = chip.add(chip.mul(m_i[static_cast<size_t>(r)], ln2), chip.log(l));
    chip.store(Li + r, l > 0.0f ? lse : -kInf);
  }
}

}  // namespace

Cost mirror(const Problem& p, const HostTensors& t) { return mirror(p, t, CausalMode::kFast); }

Cost mirror(const Problem& p, const HostTensors& t, CausalMode mode) {
  validate(p);
  if (!t.Q || !t.K || !t.V || !t.O || !t.L) throw Error("stage 04 mirror: null tensor pointer");
  const float scale_log2 = static_cast<float>(p.softmax_scale() * kLog2e);
  Chip chip;
  // The kernel's grid: one block per head, a block taking several heads only
  // past grid x's limit; line 3 is the loop over Q blocks inside a block.
  const std::int64_t grid = std::min(p.heads(), kMaxBlocks);
  chip.cost.thread_blocks = grid;
  for (std::int64_t block = 0; block < grid; ++block) {
    for (std::int64_t bh = block; bh < p.heads(); bh += grid) {
      for (std::int64_t i = 0; i < q_blocks(p); ++i) attend_q_block(
          p, t, bh, i, scale_log2, mode, chip);
    }
  }
  return chip.cost;
}

}  // namespace flashstep::fa2_q_outer
