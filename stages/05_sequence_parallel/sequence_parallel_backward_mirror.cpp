// Stage 05's backward mirror (host only): Algorithm 2 of the FlashAttention-2
// paper in plain C++, with the kernel's loop order, tiles (Br = 32, Bc = 64 or
// 32), log2-unit exponentials and masking, in float like the kernel. Data
// moves between the HBM arrays and the on-chip tiles only through Chip
// (common/mirror_chip.h, shared with stage 04's mirror), which counts every
// element moved, every shared-memory access and every FLOP; the tests check
// those counts against backward_model() and the gradients against the fp64
// reference.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backward_tiles.h"
#include "common/error.h"
#include "common/fa2_tiles.h"
#include "common/mirror_chip.h"
#include "common/row_dot.h"
#include "common/tile_mask.h"
#include "sequence_parallel.h"

namespace flashstep::sequence_parallel {

namespace {

using mirror::Chip;
using mirror::Tile;

// Line 4: D = rowsum(dO o O), one row at a time (common/row_dot.cu).
void row_dot(const Problem& p, const HostBackwardTensors& t, std::vector<float>& D, Chip& chip) {
  const std::int64_t rows = p.heads() * p.Nq;
  D.assign(static_cast<size_t>(rows), 0.0f);
  for (std::int64_t r = 0; r < rows; ++r) {
    float acc = 0.0f;
    for (std::int64_t k = 0; k < p.d; ++k) {
      acc += t.dO[r * p.d + k] * t.O[r * p.d + k];
      chip.cost.nonmatmul_flops += 2;
    }
    chip.cost.hbm_read_bytes += 2 * p.d * kFloatBytes;
    chip.store(&D[static_cast<size_t>(r)], acc);
  }
}

// Lines 6-18 for K/V block j of head bh (attend_kv_block in the kernel).
void attend_kv_block(const Problem& p, const HostBackwardTensors& t, const std::vector<float>& D,
                     std::int64_t bh, std::int64_t j, std::int64_t Bc, Chip& chip) {
  const std::int64_t d = p.d;
  const std::int64_t key0 = j * Bc;
  const std::int64_t C = std::min(Bc, p.Nk - key0);
  const std::int64_t Tr = (p.Nq + bwd::kBr - 1) / bwd::kBr;
  // Q blocks before i_first see nothing of the block (causal); the last row
  // sees every key, so i_first < Tr.
  const std::int64_t first_row = p.causal ? std::max<std::int64_t>(0, key0 - p.Nk + p.Nq) : 0;
  const std::int64_t i_first = first_row / bwd::kBr;
  chip.cost.skipped_tiles += i_first;
  const float scale = static_cast<float>(p.softmax_scale());
  const float scale_log2 = static_cast<float>(p.softmax_scale() * fa2::kLog2e);
  const float log2e = static_cast<float>(fa2::kLog2e);

  // Line 7, in registers.
  std::vector<float> dK_j(static_cast<size_t>(C * d), 0.0f), dV_j(dK_j);
  Tile Kj, Vj, Qi, dOi, Li, Di, P, dS, dST;
  chip.load(t.K + (bh * p.Nk + key0) * d, C, d, Kj);  // line 6
  chip.load(t.V + (bh * p.Nk + key0) * d, C, d, Vj);
  for (std::int64_t i = i_first; i < Tr; ++i) {  // line 8
    const std::int64_t row0 = i * bwd::kBr;
    const std::int64_t R = std::min<std::int64_t>(bwd::kBr, p.Nq - row0);
    // Line 9.
    chip.load(t.Q + (bh * p.Nq + row0) * d, R, d, Qi);
    chip.load(t.dO + (bh * p.Nq + row0) * d, R, d, dOi);
    chip.load(t.L + bh * p.Nq + row0, R, 1, Li);
    chip.load(D.data() + bh * p.Nq + row0, R, 1, Di);
    P = {R, C, std::vector<float>(static_cast<size_t>(R * C))};
    dS = P;
    dST = {C, R, std::vector<float>(static_cast<size_t>(C * R))};
    // The kernel tests each score against the mask only in a tile whose rows
    // do not all see its keys whole (its Br x Bc tile: rows past Nq and keys
    // past Nk hidden); the mask tests are counted through chip.mask_test.
    const bool whole =
        tile_mask({p.Nq, p.Nk, p.causal}, row0, bwd::kBr, key0, Bc) == TileMask::kNone;
    // BEGIN ASSIGNMENT(backward): lines 10-11 and 13-14 for each row r < R and key c < C, every FLOP through chip: L_i in log2 units (chip.mul by log2e), S = chip.dot(Qi, r, Kj, c, d), dP = chip.dot(dOi, r, Vj, c, d), P_rc = chip.exp2(S scale_log2 - L_log2) where c < visible (visible = p.visible_keys(row0 + r) - key0; tested through chip.mask_test unless `whole`), else 0; dS_rc = P_rc (dP - D_r) scale; chip.write P_rc to P, dS_rc to dS and to dST (transposed)
    for (std::int64_t r = 0; r < R; ++r) {
      const float L_log2 = chip.mul(chip.read(Li, r, 0), log2e);
      const float D_r = chip.read(Di, r, 0);
      const std::int64_t visible = p.visible_keys(row0 + r) - key0;
      for (std::int64_t c = 0; c < C; ++c) {
        // Lines 10-11 and 13-14, scale folded into dS; masked scores -> P = 0.
        const float S = chip.dot(Qi, r, Kj, c, d);
        const float dP = chip.dot(dOi, r, Vj, c, d);
        const float e = chip.exp2(chip.sub(chip.mul(S, scale_log2), L_log2));
        const float P_rc = whole || chip.mask_test(c < visible) ? e : 0.0f;
        const float dS_rc = chip.mul(chip.mul(P_rc, chip.sub(dP, D_r)), scale);
        chip.write(P, r, c, P_rc);
        chip.write(dS, r, c, dS_rc);
        chip.write(dST, c, r, dS_rc);
      }
    }
    // END ASSIGNMENT
    // Lines 12 and 16: query rows in order, as the kernel sums them.
    // BEGIN ASSIGNMENT(backward): lines 12 and 16, query rows r in order, keys c inside: dV_j[c] += P[r][c] dOi[r] and dK_j[c] += dS[r][c] Qi[r], each a chip.axpy into &dV_j[c * d] and &dK_j[c * d]
    for (std::int64_t r = 0; r < R; ++r) {
      for (std::int64_t c = 0; c < C; ++c) {
        chip.axpy(P, r, c, dOi, r, d, &dV_j[static_cast<size_t>(c * d)]);
        chip.axpy(dS, r, c, Qi, r, d, &dK_j[static_cast<size_t>(c * d)]);
      }
    }
    // END ASSIGNMENT
    // Line 15: dQ_i += dS_ij Kj, summed on chip over the block's keys, then
    // one atomic add per element.
    for (std::int64_t r = 0; r < R; ++r) {
      std::vector<float> dQ_r(static_cast<size_t>(d), 0.0f);
      for (std::int64_t c = 0; c < C; ++c) chip.axpy(dST, c, r, Kj, c, d, dQ_r.data());
      for (std::int64_t k = 0; k < d; ++k) {
        chip.atomic_add(t.dQ + (bh * p.Nq + row0 + r) * d + k, dQ_r[static_cast<size_t>(k)]);
      }
    }
  }
  // Line 18.
  for (std::int64_t e = 0; e < C * d; ++e) {
    chip.store(t.dK + (bh * p.Nk + key0) * d + e, dK_j[static_cast<size_t>(e)]);
    chip.store(t.dV + (bh * p.Nk + key0) * d + e, dV_j[static_cast<size_t>(e)]);
  }
}

}  // namespace

Cost backward_mirror(const Problem& p, const HostBackwardTensors& t) {
  validate(p);
  if (!t.Q || !t.K || !t.V || !t.O || !t.L || !t.dO || !t.dQ || !t.dK || !t.dV) {
    throw Error("stage 05 backward mirror: null tensor pointer");
  }
  Chip chip;
  for (std::int64_t e = 0; e < p.q_elems(); ++e) chip.store(t.dQ + e, 0.0f);  // line 3
  std::vector<float> D;
  row_dot(p, t, D, chip);  // line 4
  // The kernel's grid: K/V blocks along x, heads along y (a block taking
  // several heads only past grid y's limit); plus the D kernel's blocks.
  const std::int64_t Bc = bwd::block_keys(head_dim_bucket(p.d));
  const std::int64_t Tc = (p.Nk + Bc - 1) / Bc;
  const std::int64_t grid_y = std::min(p.heads(), bwd::kMaxGridY);
  for (std::int64_t y = 0; y < grid_y; ++y) {
    for (std::int64_t bh = y; bh < p.heads(); bh += grid_y) {
      for (std::int64_t j = 0; j < Tc; ++j) attend_kv_block(p, t, D, bh, j, Bc, chip);
    }
  }
  chip.cost.thread_blocks = Tc * grid_y + row_dot_cost(p).thread_blocks;
  return chip.cost;
}

}  // namespace flashstep::sequence_parallel
