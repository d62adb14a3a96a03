// Stage 08's CPU mirror (host only): the kernel of hopper.cuh on the host, its
// grid, tiles and numerics, counting what hopper_model.cpp counts. Read it
// beside attend_q_block:
// - one thread block per (Q block, head), heaviest first: 64 rows per
//   consumer warpgroup, one in steps 1-2 and two from step 3 (three at
//   d <= 64: consumer_warpgroups); K/V blocks of
//   Bc = key_tile(d bucket) keys (128 at d <= 128, 64 at d = 256) from the
//   last visited one down, the causal blocks above the diagonal skipped,
//   and at d = 64 from step 3 by each consumer those above its own rows'
//   diagonal (consumers_skip_tiles);
// - each consumer warpgroup's wgmma chains read its rows of Qi (S's A
//   operand) once per tile and Kj, Vj (the B operands) once for its 64 rows;
// - bf16 or fp16 Q, K, V, O; fp32 S, O~, m, l, L; the online softmax in log2
//   units with the scale inside the exponential (P~ = 2^fma(S, scale log2 e,
//   -m) through ex2.approx.ftz); a negative scale as |scale| on -Qi (wgmma's
//   imm-scale-a = -1, exact), a zero one as the smallest normal float;
// - P~ rounded to the element type in the registers (the A operand of
//   O~ += P~ Vj); O = O~ / l rounded, L = (m + log2 l) ln 2; O through a
//   shared-memory tile from step 3 at d <= 128 (output_through_smem).
// Where it departs from the kernel, as stage 07's mirror does: the tensor
// cores' order and precision of the products' sums and ex2.approx are not
// reproduced bit for bit; l is one sum per row (the kernel splits it over a
// quad); O~'s rescale is always applied (the kernel skips a factor of 1);
// the tiles hold valid rows and columns only (the kernel computes on zeros).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/mirror_chip.h"
#include "hopper.h"

namespace flashstep::hopper {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kMinNormal = std::numeric_limits<float>::min();

using mirror::Chip;
using mirror::online_softmax_row;
using mirror::Tile;

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }



/// Lines 4-13 for Q block i of head bh (attend_q_block).
void attend_q_block(const Problem& p, const HostTensors& t, std::int64_t bh, std::int64_t i,
                    std::int64_t consumers, bool o_smem, bool skip_tiles, float scale_log2,
                    bool negate_q, Chip& chip) {
  const std::int64_t d = p.d;
  const float* Qh = t.Q + bh * p.Nq * d;  // [Nq, d]
  const float* Kh = t.K + p.kv_head(bh) * p.Nk * d;  // [Nk, d] of this head's group
  const float* Vh = t.V + p.kv_head(bh) * p.Nk * d;  // [Nk, d] of this head's group
  const std::int64_t Br = consumers * kBr;
  const std::int64_t Bc = key_tile(head_dim_bucket(d));
  const std::int64_t row0 = i * Br;
  const std::int64_t R = std::min<std::int64_t>(Br, p.Nq - row0);
  const std::int64_t n = ceil_div(p.visible_keys(row0 + R - 1), Bc);
  chip.cost.skipped_tiles += ceil_div(p.Nk, Bc) - n;

  Tile Qi(p.dtype), Kj(p.dtype), Vj(p.dtype);
  chip.load(Qh + row0 * d, R, d, Qi);  // line 4, even when n = 0
  std::vector<float> O_tilde(static_cast<size_t>(R * d), 0.0f);  // line 5, registers
  std::vector<float> m_i(static_cast<size_t>(R), -kInf), l_i(static_cast<size_t>(R), 0.0f);

  for (std::int64_t j = n - 1; j >= 0; --j) {  // line 6
    const std::int64_t key0 = j * Bc;
    const std::int64_t C = std::min<std::int64_t>(Bc, p.Nk - key0);
    chip.load(Kh + key0 * d, C, d, Kj);  // line 7
    chip.load(Vh + key0 * d, C, d, Vj);
    // Each consumer warpgroup w in turn, on its rows r0 .. r0 + rows - 1; one
    // whose rows all lie past Nq computes nothing (pass_tiles), nor, at
    // d = 64 from step 3, one for which tile j lies wholly above the causal
    // diagonal (skip_tiles: consumers_skip_tiles).
    for (std::int64_t w = 0; w * kBr < R && w < consumers; ++w) {
      const std::int64_t r0 = w * kBr;
      const std::int64_t rows = std::min<std::int64_t>(kBr, R - r0);
      if (skip_tiles && j >= ceil_div(p.visible_keys(row0 + r0 + rows - 1), Bc)) continue;
      // Line 8: one wgmma chain reads the warpgroup's rows of Qi (negated by
      // imm-scale-a when the scale is negative) and all of Kj.
      std::vector<float> Q_frag = chip.fragments(Qi, r0, rows);  // [rows, d]
      if (negate_q) {
        for (float& q : Q_frag) q = -q;
      }
      const std::vector<float> K_frag = chip.fragments_transposed(Kj);  // [d, C]
      std::vector<float> S(static_cast<size_t>(rows * C), 0.0f);       // [rows, C]
      for (std::int64_t r = 0; r < rows; ++r) {
        float* S_r = &S[static_cast<size_t>(r * C)];
        chip.mma_row(&Q_frag[static_cast<size_t>(r * d)], K_frag.data(), d, C, S_r);
        const std::int64_t visible = p.visible_keys(row0 + r0 + r) - key0;
        for (std::int64_t c = std::max<std::int64_t>(visible, 0); c < C; ++c) S_r[c] = -kInf;
      }
      for (std::int64_t r = 0; r < rows; ++r) {  // lines 9-10
        const auto row = static_cast<size_t>(r0 + r);
        online_softmax_row(&S[static_cast<size_t>(r * C)], C,
                           &O_tilde[row * static_cast<size_t>(d)], d, scale_log2, m_i[row],
                           l_i[row], chip);
      }
      // P~ rounded in the registers: the A operand of O~ += P~ Vj.
      round_to_dtype(p.dtype, S.data(), rows * C);
      const std::vector<float> V_frag = chip.fragments(Vj, 0, C);  // [C, d]
      for (std::int64_t r = 0; r < rows; ++r) {
        chip.mma_row(&S[static_cast<size_t>(r * C)], V_frag.data(), C, d,
                     &O_tilde[static_cast<size_t>((r0 + r) * d)]);
      }
    }
  }

  // Lines 12-13: O_i from the registers straight to HBM, or (o_smem) into
  // a shared-memory tile of its own and from there by TMA.
  const float ln2 = static_cast<float>(kLn2);
  Tile Oi(R, d, std::vector<float>(static_cast<size_t>(R * d)), p.dtype);
  for (std::int64_t r = 0; r < R; ++r) {
    const float l = l_i[static_cast<size_t>(r)];
    const float recip = chip.div(1.0f, l);
    const float inv_l = l == 0.0f ? 0.0f : recip;
    for (std::int64_t k = 0; k < d; ++k) {
      float* out = t.O + (bh * p.Nq + row0 + r) * d + k;
      const float o = chip.mul(O_tilde[static_cast<size_t>(r * d + k)], inv_l);
      if (o_smem) {
        chip.write(Oi, r, k, o);
        chip.store(out, chip.read(Oi, r, k), p.dtype);
      } else {
        chip.store(out, o, p.dtype);
      }
    }
    const float lse = chip.mul(chip.add(m_i[static_cast<size_t>(r)], chip.log2(l)), ln2);
    chip.store(t.L + bh * p.Nq + row0 + r, l == 0.0f ? -kInf : lse);
  }
}

}  // namespace

template <Step kStep>
Cost mirror(const Problem& p, const HostTensors& t) {
  validate(p);
  const std::string what = "stage 08 " + std::string(step_slug(kStep)) + " mirror";
  if (!t.Q || !t.K || !t.V || !t.O || !t.L) throw Error(what + ": null tensor pointer");
  if (p.dtype != DType::kBf16 && p.dtype != DType::kFp16) {
    throw Error(what + ": no kernel for " + std::string(dtype_name(p.dtype)));
  }
  const float scale = static_cast<float>(std::fabs(p.softmax_scale()) * kLog2e);
  const float scale_log2 = scale == 0.0f ? kMinNormal : scale;
  const bool negate_q = p.softmax_scale() < 0.0;
  Chip chip;
  const std::int64_t consumers = consumer_warpgroups(kStep, head_dim_bucket(p.d));
  const bool o_smem = output_through_smem(kStep, head_dim_bucket(p.d));
  const bool skip_tiles = consumers_skip_tiles(kStep, head_dim_bucket(p.d));
  const std::int64_t Tr = ceil_div(p.Nq, consumers * kBr);
  const std::int64_t grid_y = std::min(p.heads(), kMaxGridY);
  chip.cost.thread_blocks = Tr * grid_y;
  for (std::int64_t x = 0; x < Tr; ++x) {
    for (std::int64_t y = 0; y < grid_y; ++y) {
      for (std::int64_t bh = y; bh < p.heads(); bh += grid_y) {
        attend_q_block(p, t, bh, Tr - 1 - x, consumers, o_smem, skip_tiles, scale_log2, negate_q,
                       chip);
      }
    }
  }
  return chip.cost;
}

template Cost mirror<Step::kWgmmaSync>(const Problem&, const HostTensors&);
template Cost mirror<Step::kTmaPipeline>(const Problem&, const HostTensors&);
template Cost mirror<Step::kWarpSpecialized>(const Problem&, const HostTensors&);
template Cost mirror<Step::kPingPong>(const Problem&, const HostTensors&);
template Cost mirror<Step::kIntraOverlap>(const Problem&, const HostTensors&);

}  // namespace flashstep::hopper
