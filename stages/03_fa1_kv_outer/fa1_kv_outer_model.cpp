// Stage 03's closed-form model and registry entry (host only).
//
// Every count is per (batch, head), then times B * H. Sums over tiles collapse
// because the valid rows of the Q blocks add up to Nq and those of the K/V
// blocks to Nk; only the number of K/V blocks Tc stays, since each of them
// sweeps the whole of Q, O, l and m. The mask tests alone take a term per Q
// block: how many K/V blocks a Q block sees whole depends on where it sits.
//
// Bytes: Q, K, V and the final O count p.dtype's; the running O_i (in O
// itself in fp32, in O_acc otherwise), l, m, L and the fp32 tiles in shared
// memory count four. In fp32 the two O terms are one array, and the total is
// the one the README derives.
#include <algorithm>

#include "fa1_kv_outer.h"

namespace flashstep::fa1_kv_outer {

std::int64_t stats_offset(const Problem& p) {
  return p.dtype == DType::kFp32 ? 0 : p.q_elems() * kFloatBytes;
}

std::int64_t workspace_bytes(const Problem& p) {
  return stats_offset(p) + 2 * p.lse_elems() * kFloatBytes;
}

Cost model(const Problem& p) {
  const std::int64_t Nq = p.Nq, Nk = p.Nk, d = p.d;
  const std::int64_t Tc = kv_tiles(p);
  const std::int64_t q_elems = Nq * d;   // elements of Q (or O) of one head
  const std::int64_t kv_elems = Nk * d;  // elements of K (or V) of one head
  const std::int64_t E = p.elem_bytes();

  Cost head;
  // Reads: Kj and Vj once; every (j, i) step reads Qi, O_i, l_i, m_i.
  head.hbm_read_bytes = (2 * kv_elems + Tc * q_elems) * E + Tc * (q_elems + 2 * Nq) * kFloatBytes;
  // Writes: O_i, l, m initialised; every step but the last writes O_i, the
  // last writes O; every step writes l_i, m_i; L once.
  head.hbm_write_bytes =
      ((q_elems + 2 * Nq) + (Tc - 1) * q_elems + Tc * 2 * Nq + Nq) * kFloatBytes + q_elems * E;
  // Shared memory in: Kj, Vj per j; Qi per step; P~_ij per step.
  head.sram_write_bytes = (2 * kv_elems + Tc * q_elems + Nq * Nk) * kFloatBytes;
  // Shared memory out, per multiply-add: a Qi and a Kj element for S_ij, a
  // P~_ij and a Vj element for P~_ij Vj.
  head.sram_read_bytes = 4 * Nq * Nk * d * kFloatBytes;
  head.matmul_flops = 2 * Nq * Nk * d + 2 * Nq * Nk * d;
  // Per score: scale, max, subtract, exp, add (l~), multiply by the P factor.
  // Per row and step: m_new (1), e^(m_i - m_new) (2), e^(m~ - m_new) (2), l_new
  // (3), 1 / l_new (1), the O and P factors (2). Per O_i element and step: the
  // rescale. Per row, once: L = m + log(l).
  head.nonmatmul_flops = 6 * Nq * Nk + Tc * (11 * Nq + q_elems) + 2 * Nq;

  // Mask tests: per Q block of R rows, its scores in the K/V blocks after the
  // ones it sees whole (common/tile_mask.h). One term per Q block.
  const std::int64_t Bc = kv_tile_rows(head_dim_bucket(d));
  for (std::int64_t row0 = 0; row0 < Nq; row0 += kBr) {
    const std::int64_t R = std::min<std::int64_t>(kBr, Nq - row0);
    head.mask_tests += R * (Nk - unmasked_kv_tiles({Nq, Nk, p.causal}, row0, kBr, Bc) * Bc);
  }

  // skipped_tiles stays 0: FA1 computes every tile.
  Cost c = head.times(p.heads());
  c.thread_blocks = launched_blocks(p);
  return c;
}

}  // namespace flashstep::fa1_kv_outer

namespace flashstep {

std::vector<Stage> stages_03_fa1_kv_outer() {
  Stage s;
  s.name = "03_fa1_kv_outer";
  s.title = "FlashAttention-1, K/V outer";
  s.writes_lse = true;
  s.forward = fa1_kv_outer::forward;
  s.workspace_bytes = fa1_kv_outer::workspace_bytes;
  s.model = fa1_kv_outer::model;
  s.mirror = fa1_kv_outer::mirror;
  s.dtypes = {DType::kFp32, DType::kFp16, DType::kBf16};
  return {s};
}

}  // namespace flashstep
