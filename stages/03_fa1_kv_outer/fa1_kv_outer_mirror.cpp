// Stage 03's CPU mirror (host only): Algorithm 1 of the FlashAttention paper in
// plain C++, with the kernel's loop order and tile sizes (Br, Bc from
// fa1_kv_outer.h), computed in float like the kernel.
//
// The HBM arrays are the HostTensors plus the l and m workspace. The on-chip
// buffers are the ones the kernel keeps: Qi, Kj, Vj and P_ij in shared memory
// ("SRAM"), S_ij, O_i, l_i and m_i in registers. Data moves between them only
// through the counting helpers of Chip, and every arithmetic operation is one
// of Chip's, so the Cost returned is what these loops did. The tests check it
// against the closed-form model(), and O and L against the fp64 reference.
//
// Mask tests count the scores tested one by one: every score of a tile that
// tile_mask does not call kNone (valid ones only, as every count here).
//
// Differences from the kernel that change no count: tiles here are exactly
// rows x d (the kernel pads d up to 64/128/256 and the tiles up to Br x Bc with
// zeros, which it does not count), and lines 9-11 run row by row where the
// kernel gives each row to a half-warp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/error.h"
#include "fa1_kv_outer.h"

namespace flashstep::fa1_kv_outer {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The mirror's chip: its meters count every element that crosses the HBM /
// on-chip boundary, every shared-memory access and every FLOP.
class Chip {
 public:
  // n elements HBM -> shared memory (Qi, Kj, Vj).
  void load_to_sram(const float* hbm, float* sram, std::int64_t n) {
    std::copy(hbm, hbm + n, sram);
    cost_.hbm_read_bytes += n * kFloatBytes;
    cost_.sram_write_bytes += n * kFloatBytes;
  }
  // n elements HBM -> registers (O_i, l_i, m_i).
  void load_to_registers(const float* hbm, float* regs, std::int64_t n) {
    std::copy(hbm, hbm + n, regs);
    cost_.hbm_read_bytes += n * kFloatBytes;
  }
  // n elements registers -> HBM (O_i, l_i, m_i, L_i).
  void store_from_registers(const float* regs, float* hbm, std::int64_t n) {
    std::copy(regs, regs + n, hbm);
    cost_.hbm_write_bytes += n * kFloatBytes;
  }
  // n copies of one value -> HBM (the initialisation of O, l, m).
  void fill_hbm(float* hbm, float value, std::int64_t n) {
    std::fill(hbm, hbm + n, value);
    cost_.hbm_write_bytes += n * kFloatBytes;
  }
  float read_sram(float x) {
    cost_.sram_read_bytes += kFloatBytes;
    return x;
  }
  void write_sram(float& x, float value) {
    cost_.sram_write_bytes += kFloatBytes;
    x = value;
  }

  // One multiply-add of Qi Kj^T or P~_ij Vj.
  float madd(float acc, float a, float b) {
    cost_.matmul_flops += 2;
    return acc + a * b;
  }
  float add(float a, float b) { return count(a + b); }
  float sub(float a, float b) { return count(a - b); }
  float mul(float a, float b) { return count(a * b); }
  // 1 / x, or 0 while a row has seen no key (x = 0), as the kernel guards it.
  float reciprocal(float x) { return count(x > 0.0f ? 1.0f / x : 0.0f); }
  float max(float a, float b) { return count(std::max(a, b)); }
  float exp(float a) { return count(std::exp(a)); }
  float log(float a) { return count(std::log(a)); }

  // One score's visibility, tested on its own (the per-element mask).
  bool mask_test(bool visible) {
    ++cost_.mask_tests;
    return visible;
  }

  void launch(std::int64_t blocks) { cost_.thread_blocks += blocks; }
  const Cost& cost() const { return cost_; }

 private:
  float count(float result) {
    ++cost_.nonmatmul_flops;
    return result;
  }
  Cost cost_;
};

}  // namespace

Cost mirror(const Problem& p, const HostTensors& t) { return mirror(p, t, CausalMode::kFast); }

Cost mirror(const Problem& p, const HostTensors& t, CausalMode mode) {
  validate(p);
  if (!t.Q || !t.K || !t.V || !t.O || !t.L) throw Error("stage 03 mirror: null tensor pointer");
  const std::int64_t Nq = p.Nq, Nk = p.Nk, d = p.d;
  const std::int64_t Br = kBr;
  const std::int64_t Bc = kv_tile_rows(head_dim_bucket(d));
  const std::int64_t Tr = (Nq + Br - 1) / Br;
  const std::int64_t Tc = kv_tiles(p);
  const float scale = static_cast<float>(p.softmax_scale());

  Chip chip;
  chip.launch(launched_blocks(p));
  // HBM workspace: the running row sums and maxima, [B, H, Nq] each.
  std::vector<float> l(static_cast<size_t>(p.lse_elems()));
  std::vector<float> m(static_cast<size_t>(p.lse_elems()));
  // Shared memory of one thread block.
  std::vector<float> Qi(static_cast<size_t>(Br * d));    // [Br, d]
  std::vector<float> Kj(static_cast<size_t>(Bc * d));    // [Bc, d]
  std::vector<float> Vj(static_cast<size_t>(Bc * d));    // [Bc, d]
  std::vector<float> P_ij(static_cast<size_t>(Br * Bc)); // [Br, Bc], scaled as in the kernel
  // Registers of one thread block.
  std::vector<float> S_ij(static_cast<size_t>(Br * Bc)); // [Br, Bc]
  std::vector<float> O_i(static_cast<size_t>(Br * d));   // [Br, d]
  std::vector<float> l_i(static_cast<size_t>(Br));       // [Br]
  std::vector<float> m_i(static_cast<size_t>(Br));       // [Br]
  std::vector<float> L_i(static_cast<size_t>(Br));       // [Br]

  // One thread block per (batch, head).
  for (std::int64_t bh = 0; bh < p.heads(); ++bh) {
    const float* Qh = t.Q + bh * Nq * d;  // [Nq, d]
    const float* Kh = t.K + bh * Nk * d;  // [Nk, d]
    const float* Vh = t.V + bh * Nk * d;  // [Nk, d]
    float* Oh = t.O + bh * Nq * d;        // [Nq, d]
    float* Lh = t.L + bh * Nq;            // [Nq]
    float* lh = l.data() + bh * Nq;       // [Nq]
    float* mh = m.data() + bh * Nq;       // [Nq]

    // Line 2: O = 0, l = 0, m = -inf in HBM.
    chip.fill_hbm(Oh, 0.0f, Nq * d);
    chip.fill_hbm(lh, 0.0f, Nq);
    chip.fill_hbm(mh, -kInf, Nq);

    // Line 5: outer loop over K/V blocks.
    for (std::int64_t j = 0; j < Tc; ++j) {
      const std::int64_t j0 = j * Bc;
      const std::int64_t cols = std::min(Bc, Nk - j0);
      // Line 6: load Kj, Vj to SRAM.
      chip.load_to_sram(Kh + j0 * d, Kj.data(), cols * d);
      chip.load_to_sram(Vh + j0 * d, Vj.data(), cols * d);

      // Line 7: inner loop over Q blocks.
      for (std::int64_t i = 0; i < Tr; ++i) {
        const std::int64_t i0 = i * Br;
        const std::int64_t rows = std::min(Br, Nq - i0);
        // Line 8: load Qi to SRAM, O_i, l_i, m_i on chip.
        chip.load_to_sram(Qh + i0 * d, Qi.data(), rows * d);
        chip.load_to_registers(Oh + i0 * d, O_i.data(), rows * d);
        chip.load_to_registers(lh + i0, l_i.data(), rows);
        chip.load_to_registers(mh + i0, m_i.data(), rows);

        // Line 9: S_ij = scale Qi Kj^T; FA1 computes every score, then masks.
        // Each score is tested only in a tile its rows do not all see whole
        // (the kernel's Br x Bc tile: rows past Nq, keys past Nk hidden).
        const bool test = mode == CausalMode::kMaskEvery ||
                          tile_mask({Nq, Nk, p.causal}, i0, Br, j0, Bc) != TileMask::kNone;
        for (std::int64_t r = 0; r < rows; ++r) {
          for (std::int64_t c = 0; c < cols; ++c) {
            float acc = 0.0f;
            for (std::int64_t k = 0; k < d; ++k) {
              acc = chip.madd(acc, chip.read_sram(Qi[r * d + k]), chip.read_sram(Kj[c * d + k]));
            }
            const float s = chip.mul(scale, acc);
            const bool visible = !p.causal || j0 + c <= i0 + r + Nk - Nq;
            S_ij[r * Bc + c] = !test || chip.mask_test(visible) ? s : -kInf;
          }
        }

        for (std::int64_t r = 0; r < rows; ++r) {
          // BEGIN ASSIGNMENT: lines 10-12 of Algorithm 1 for each row r: m~_ij, P~_ij, l~_ij; m_new, l_new; write diag(l_new)^-1 e^(m~_ij - m_new) P~_ij to P_ij and rescale O_i; update l_i, m_i (all through chip)
          float* S = &S_ij[r * Bc];  // this row, turned into P~_ij in place
          // Line 10: m~_ij = rowmax(S_ij), P~_ij = exp(S_ij - m~_ij),
          // l~_ij = rowsum(P~_ij); against 0 when no key is visible (m~_ij = -inf).
          float m_tilde_ij = -kInf;
          for (std::int64_t c = 0; c < cols; ++c) m_tilde_ij = chip.max(m_tilde_ij, S[c]);
          const float m_tilde_ref = m_tilde_ij == -kInf ? 0.0f : m_tilde_ij;
          float l_tilde_ij = 0.0f;
          for (std::int64_t c = 0; c < cols; ++c) {
            S[c] = chip.exp(chip.sub(S[c], m_tilde_ref));
            l_tilde_ij = chip.add(l_tilde_ij, S[c]);
          }

          // Line 11: m_new = max(m_i, m~_ij),
          // l_new = e^(m_i - m_new) l_i + e^(m~_ij - m_new) l~_ij,
          // with exponents against 0 while the row has seen no key.
          const float m_new = chip.max(m_i[r], m_tilde_ij);
          const float m_ref = m_new == -kInf ? 0.0f : m_new;
          const float l_i_scaled = chip.mul(chip.exp(chip.sub(m_i[r], m_ref)), l_i[r]);
          const float p_factor = chip.exp(chip.sub(m_tilde_ij, m_ref));
          const float l_new = chip.add(l_i_scaled, chip.mul(p_factor, l_tilde_ij));
          const float inv_l_new = chip.reciprocal(l_new);

          // Line 12, with diag(l_new)^-1 distributed over both terms: O_i is
          // rescaled here, P~_ij goes to SRAM already multiplied by its factor.
          const float o_factor = chip.mul(l_i_scaled, inv_l_new);
          const float p_out_factor = chip.mul(p_factor, inv_l_new);
          for (std::int64_t c = 0; c < cols; ++c) {
            chip.write_sram(P_ij[r * Bc + c], chip.mul(p_out_factor, S[c]));
          }
          for (std::int64_t k = 0; k < d; ++k) O_i[r * d + k] = chip.mul(o_factor, O_i[r * d + k]);
          l_i[r] = l_new;
          m_i[r] = m_new;
          // END ASSIGNMENT
        }

        // Line 12: O_i += P_ij Vj (the kernel's barrier separates this from the above).
        for (std::int64_t r = 0; r < rows; ++r) {
          for (std::int64_t k = 0; k < d; ++k) {
            float acc = O_i[r * d + k];
            for (std::int64_t c = 0; c < cols; ++c) {
              acc = chip.madd(acc, chip.read_sram(P_ij[r * Bc + c]), chip.read_sram(Vj[c * d + k]));
            }
            O_i[r * d + k] = acc;
          }
        }

        // Lines 12-13: write O_i, l_i <- l_new, m_i <- m_new to HBM; after the
        // last K/V block also L_i = m_i + log(l_i) (-inf for a row that saw no key).
        chip.store_from_registers(O_i.data(), Oh + i0 * d, rows * d);
        chip.store_from_registers(l_i.data(), lh + i0, rows);
        chip.store_from_registers(m_i.data(), mh + i0, rows);
        if (j == Tc - 1) {
          for (std::int64_t r = 0; r < rows; ++r) L_i[r] = chip.add(m_i[r], chip.log(l_i[r]));
          chip.store_from_registers(L_i.data(), Lh + i0, rows);
        }
      }
    }
  }
  return chip.cost();
}

}  // namespace flashstep::fa1_kv_outer
