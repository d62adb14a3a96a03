// The FlashAttention-2 forward's closed-form model (host only), shared by
// stages 04 and 05.
//
// Counting conventions (common/cost.h), for one head, summed over its Q blocks
// i = 0 .. Tr-1 of R_i rows, where the block visits n_i K/V blocks holding
// C_i = min(n_i Bc, Nk) keys (n_i < Tc only when causal skips blocks):
// - HBM: Qi read once (if n_i > 0), Kj and Vj once per visited (i, j); O and L
//   written once. Valid elements only: the kernel zero-fills the padding on chip.
//   Q, K, V and O count p.dtype's bytes, L four.
// - SRAM is the kernel's shared memory: fp32 tiles Qi, Kj, Vj and P~_ij written
//   once each; reads counted per use, one per multiply-add operand (as in
//   stages 01-02). S_ij, O~_i, m_i and l_i live in registers: not SRAM.
// - Non-matmul FLOPs per visited tile of R x C scores: scale, max, subtract,
//   exp, add to the row sum (5 per score); per row e^(m_old - m_new)
//   (subtract, exp), its product with l_i, and d multiplies rescaling O~_i.
//   Per row at the end: 1/l, d multiplies, and L = m ln2 + log(l) (3).
//   Masked scores are computed and then set to -inf, so they count too.
// - Mask tests: the R x C_j scores of each visited K/V block j that the block's
//   rows do not all see whole (common/tile_mask.h: the first
//   unmasked_kv_tiles blocks need no test); every visited score with
//   CausalMode::kMaskEvery.
#include "fa2_model.h"

#include <algorithm>

#include "fa2_tiles.h"

namespace flashstep::fa2 {

namespace {
std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
}  // namespace

std::int64_t q_blocks(const Problem& p) { return ceil_div(p.Nq, kBr); }

std::int64_t kv_blocks_visited(const Problem& p, std::int64_t i, CausalMode mode) {
  if (mode == CausalMode::kNoSkip) return ceil_div(p.Nk, kBc);
  const std::int64_t last_row = std::min(p.Nq, (i + 1) * kBr) - 1;
  // The bottom-right mask: the block's last row sees the most keys.
  return ceil_div(p.visible_keys(last_row), kBc);
}

Cost model(const Problem& p, std::int64_t thread_blocks, CausalMode mode) {
  const std::int64_t d = p.d;
  const std::int64_t Tc = ceil_div(p.Nk, kBc);
  Cost head;
  for (std::int64_t i = 0; i < q_blocks(p); ++i) {
    const std::int64_t R = std::min<std::int64_t>(kBr, p.Nq - i * kBr);
    const std::int64_t n = kv_blocks_visited(p, i, mode);
    head.skipped_tiles += Tc - n;
    // O_i and L_i (0 and -inf if n = 0)
    head.hbm_write_bytes += R * (d * p.elem_bytes() + kFloatBytes);
    if (n == 0) continue;
    const std::int64_t C = std::min(n * kBc, p.Nk);
    head.hbm_read_bytes += (R + 2 * C) * d * p.elem_bytes();
    head.sram_write_bytes += ((R + 2 * C) * d + R * C) * kFloatBytes;
    head.sram_read_bytes += 4 * R * C * d * kFloatBytes;  // 2 operands x (S_ij and P~_ij Vj)
    head.matmul_flops += 4 * R * C * d;                   // 2 R C d, twice
    head.nonmatmul_flops += 5 * R * C + n * R * (3 + d) + R * (d + 4);
    const std::int64_t whole = mode == CausalMode::kMaskEvery
                                   ? 0
                                   : unmasked_kv_tiles({p.Nq, p.Nk, p.causal}, i * kBr, kBr, kBc);
    head.mask_tests += R * (C - whole * kBc);
  }
  Cost c = head.times(p.heads());
  c.thread_blocks = thread_blocks;
  return c;
}

}  // namespace flashstep::fa2
