// The closed-form model of stage 05's backward (FlashAttention-2, Algorithm 2),
// host only. Conventions are common/cost.h's, as in the forward's model:
// valid elements only (the kernel zero-fills padding on chip).
//
// Per head, K/V block j holds C_j keys and is visited by the Q blocks from
// i_first(j) on (0 unless causal): rows_j = Nq - i_first(j) * Br rows.
// - HBM read: Kj and Vj once (2 C_j d); per visited row: Qi, dOi (2 d), Li,
//   Di (2), and dQ_i's atomic read-modify-write (d).
// - HBM write: dK_j and dV_j once (2 C_j d); per visited row the atomics' d.
// - SRAM writes: Kj, Vj once; per visited row Qi, dOi, Li, Di (2 d + 2) and
//   its C_j entries of each of P_ij, dS_ij, dS_ij^T (3 C_j).
// - SRAM reads: 2 operands per multiply-add of the five products (10 C_j d per
//   row) and Li, Di once per row (2).
// - Matmul FLOPs: five products of 2 C_j d per row: 10 C_j d (2.5 times the
//   forward's 4 C_j d).
// - Non-matmul FLOPs: per score, the scale, - Li, exp, dP - Di, times P, times
//   the softmax scale (6); per row, Li into log2 units (1). Masked scores are
//   computed and then dropped, so they count.
// - Mask tests: the C_j scores of every visited row, less those of the whole
//   Q blocks that see all of block j (common/tile_mask.h: unmasked_q_tiles).
// Plus the D kernel (common/row_dot) and the zeroing of dQ (written once).
// Q, K, V, dO, dK and dV count p.dtype's bytes; L, D and dQ, which the
// atomics accumulate in fp32, four.
#include <algorithm>

#include "backward_tiles.h"
#include "common/row_dot.h"
#include "common/tile_mask.h"
#include "sequence_parallel.h"

namespace flashstep::sequence_parallel {

std::int64_t backward_workspace_bytes(const Problem& p) { return p.lse_elems() * kFloatBytes; }

Cost backward_model(const Problem& p) {
  const std::int64_t d = p.d;
  const std::int64_t Bc = bwd::block_keys(head_dim_bucket(d));
  const std::int64_t Tc = (p.Nk + Bc - 1) / Bc;
  Cost head;
  for (std::int64_t j = 0; j < Tc; ++j) {
    const std::int64_t key0 = j * Bc;
    const std::int64_t C = std::min(Bc, p.Nk - key0);
    // The bottom-right mask: row r sees key0 iff r >= key0 - (Nk - Nq); the
    // last row sees every key, so i_first < Tr.
    const std::int64_t first_row = p.causal ? std::max<std::int64_t>(0, key0 - p.Nk + p.Nq) : 0;
    const std::int64_t i_first = first_row / bwd::kBr;
    head.skipped_tiles += i_first;
    const std::int64_t rows = p.Nq - i_first * bwd::kBr;
    head.hbm_read_bytes +=
        (2 * C * d + rows * 2 * d) * p.elem_bytes() + rows * (d + 2) * kFloatBytes;
    head.hbm_write_bytes += 2 * C * d * p.elem_bytes() + rows * d * kFloatBytes;
    head.sram_write_bytes += (2 * C * d + rows * (2 * d + 2 + 3 * C)) * kFloatBytes;
    head.sram_read_bytes += rows * (10 * C * d + 2) * kFloatBytes;
    head.matmul_flops += 10 * rows * C * d;
    head.nonmatmul_flops += rows * (6 * C + 1);
    const TileRange whole = unmasked_q_tiles({p.Nq, p.Nk, p.causal}, key0, Bc, bwd::kBr);
    const std::int64_t whole_rows = std::max<std::int64_t>(0, whole.last - whole.first) * bwd::kBr;
    head.mask_tests += (rows - whole_rows) * C;
  }
  Cost c = head.times(p.heads());
  c.hbm_write_bytes += p.q_elems() * kFloatBytes;  // dQ = 0 first
  c.thread_blocks = Tc * std::min(p.heads(), bwd::kMaxGridY);
  c += row_dot_cost(p);
  return c;
}

}  // namespace flashstep::sequence_parallel
