// Stage 02's models (forward and backward), backward GEMM shapes and registry
// entry (host only).
#include <algorithm>

#include "common/naive_matmul.h"
#include "common/row_dot.h"
#include "safe_softmax.h"

namespace flashstep::safe_softmax {

namespace {
std::int64_t round_up(std::int64_t bytes, std::int64_t align) {
  return (bytes + align - 1) / align * align;
}
}  // namespace

std::int64_t probabilities_offset(const Problem& p) {
  if (p.dtype == DType::kFp32) return 0;
  return round_up(p.score_elems() * kFloatBytes, kArrayAlignBytes);
}

std::int64_t workspace_bytes(const Problem& p) {
  return probabilities_offset(p) + p.score_elems() * p.elem_bytes();
}

Cost model(const Problem& p) {
  Cost softmax;
  const std::int64_t scores = p.score_elems();
  const std::int64_t rows = p.heads() * p.Nq;
  // Pass 1 reads S (fp32) for the max, pass 2 for the sum, pass 3 reads it
  // again and writes P (p.dtype); one L per row.
  softmax.hbm_read_bytes = 3 * scores * kFloatBytes;
  softmax.hbm_write_bytes = scores * p.elem_bytes() + rows * kFloatBytes;
  // Per element: max (pass 1); subtract, exp, add (pass 2); subtract, exp,
  // multiply by 1/l (pass 3). Per row: the reciprocal, log and add of L.
  softmax.nonmatmul_flops = 7 * scores + 3 * rows;
  softmax.thread_blocks = rows;
  Cost c = scores_cost(p);
  c += softmax;
  c += pv_cost(p);
  return c;
}

BackwardGemms backward_gemms(const Problem& p) {
  const std::int64_t BH = p.heads();
  const auto scale = static_cast<float>(p.softmax_scale());
  BackwardGemms g;
  // dV = P^T dO: P is stored [Nq, Nk], so op(A) = P^T.
  g.dV.batch = BH;
  g.dV.M = p.Nk;
  g.dV.N = p.d;
  g.dV.K = p.Nq;
  g.dV.transpose_A = true;
  // dP = dO V^T: V is stored [Nk, d], so op(B) = V^T.
  g.dP.batch = BH;
  g.dP.M = p.Nq;
  g.dP.N = p.Nk;
  g.dP.K = p.d;
  g.dP.transpose_B = true;
  // dQ = scale dS K: both as stored.
  g.dQ.batch = BH;
  g.dQ.M = p.Nq;
  g.dQ.N = p.d;
  g.dQ.K = p.Nk;
  g.dQ.alpha = scale;
  // dK = scale dS^T Q: dS is stored [Nq, Nk], so op(A) = dS^T.
  g.dK.batch = BH;
  g.dK.M = p.Nk;
  g.dK.N = p.d;
  g.dK.K = p.Nq;
  g.dK.transpose_A = true;
  g.dK.alpha = scale;
  return g;
}

// The backward runs in fp32 only (backward_dtypes): its arrays are fp32.
std::int64_t backward_D_offset(const Problem& p) {
  return round_up(p.score_elems() * kFloatBytes, kArrayAlignBytes);
}

std::int64_t backward_workspace_bytes(const Problem& p) {
  return backward_D_offset(p) + p.lse_elems() * kFloatBytes;
}

Cost backward_model(const Problem& p) {
  const std::int64_t scores = p.score_elems();
  const std::int64_t rows = p.heads() * p.Nq;
  Cost ds;
  // P and dP read once, D once per row; dS written once over dP.
  ds.hbm_read_bytes = (2 * scores + rows) * kFloatBytes;
  ds.hbm_write_bytes = scores * kFloatBytes;
  ds.nonmatmul_flops = 2 * scores;  // subtract D_r, multiply by P
  ds.thread_blocks = std::min(rows, kDsMaxBlocks);
  const BackwardGemms g = backward_gemms(p);
  // In launch order.
  Cost c = row_dot_cost(p);
  c += gemm_cost(g.dV);
  c += gemm_cost(g.dP);
  c += ds;
  c += gemm_cost(g.dQ);
  c += gemm_cost(g.dK);
  return c;
}

}  // namespace flashstep::safe_softmax

namespace flashstep {

std::vector<Stage> stages_02_safe_softmax() {
  Stage s;
  s.name = "02_safe_softmax";
  s.title = "safe softmax + L, S and P in HBM";
  s.writes_lse = true;
  s.forward = safe_softmax::forward;
  s.workspace_bytes = safe_softmax::workspace_bytes;
  s.model = safe_softmax::model;
  s.backward = safe_softmax::backward;
  s.backward_workspace_bytes = safe_softmax::backward_workspace_bytes;
  s.backward_model = safe_softmax::backward_model;
  s.dtypes = {DType::kFp32, DType::kFp16, DType::kBf16};
  s.backward_dtypes = {DType::kFp32};
  return {s};
}

}  // namespace flashstep
