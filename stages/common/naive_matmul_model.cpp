// Closed-form models of kernels 1 and 3 and of gemm_kernel (naive_matmul.cu), host-only.
#include "naive_matmul.h"

namespace flashstep {

namespace {
std::int64_t tiles(std::int64_t n) { return (n + kNaiveTile - 1) / kNaiveTile; }
}  // namespace

Cost scores_cost(const Problem& p) {
  const std::int64_t BH = p.heads();
  // Block (ti, tj) loads its 32 rows of Q and 32 rows of K, all d columns:
  // Q is read once per key tile, K once per query tile.
  const std::int64_t loaded = BH * (p.Nq * p.d * tiles(p.Nk) + p.Nk * p.d * tiles(p.Nq));
  const std::int64_t scores = p.score_elems();
  Cost c;
  c.hbm_read_bytes = loaded * p.elem_bytes();
  c.hbm_write_bytes = scores * kFloatBytes;
  c.sram_write_bytes = loaded * kFloatBytes;          // each loaded element is staged once
  c.sram_read_bytes = 2 * scores * p.d * kFloatBytes;  // one Q and one K element per FMA
  c.matmul_flops = 2 * scores * p.d;
  c.nonmatmul_flops = scores;  // the scale multiply
  c.thread_blocks = BH * tiles(p.Nq) * tiles(p.Nk);
  return c;
}

Cost pv_cost(const Problem& p) {
  const std::int64_t BH = p.heads();
  // Block (ti, tc) loads its 32 rows of P (all Nk) and the 32 columns of V
  // it produces: P is read once per 32-column tile of d, V once per query tile.
  const std::int64_t loaded = BH * (p.Nq * p.Nk * tiles(p.d) + p.Nk * p.d * tiles(p.Nq));
  Cost c;
  c.hbm_read_bytes = loaded * p.elem_bytes();
  c.hbm_write_bytes = p.q_elems() * p.elem_bytes();
  c.sram_write_bytes = loaded * kFloatBytes;
  c.sram_read_bytes = 2 * p.score_elems() * p.d * kFloatBytes;
  c.matmul_flops = 2 * p.score_elems() * p.d;
  c.thread_blocks = BH * tiles(p.Nq) * tiles(p.d);
  return c;
}

Cost gemm_cost(const Gemm& g) {
  // Block (tm, tn) loads its 32 rows of op(A) and 32 columns of op(B), all K
  // of each: op(A) is read once per column tile of C, op(B) once per row
  // tile. Transposes change the order of the loads, not their number.
  const std::int64_t loaded = g.batch * (g.M * g.K * tiles(g.N) + g.K * g.N * tiles(g.M));
  const std::int64_t outputs = g.batch * g.M * g.N;
  // The GEMMs are fp32 kernels (stage 02's backward runs in fp32 only).
  Cost c;
  c.hbm_read_bytes = loaded * kFloatBytes;
  c.hbm_write_bytes = outputs * kFloatBytes;
  c.sram_write_bytes = loaded * kFloatBytes;            // each loaded element is staged once
  c.sram_read_bytes = 2 * outputs * g.K * kFloatBytes;  // an op(A) and an op(B) element per FMA
  c.matmul_flops = 2 * outputs * g.K;
  c.nonmatmul_flops = g.alpha != 1.0f ? outputs : 0;   // the alpha multiply, skipped at 1
  c.thread_blocks = g.batch * tiles(g.M) * tiles(g.N);
  return c;
}

}  // namespace flashstep
