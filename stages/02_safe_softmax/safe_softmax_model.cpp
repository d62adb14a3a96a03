// Stage 02's model and registry entry (host only).
#include "common/naive_matmul.h"
#include "safe_softmax.h"

namespace flashstep::safe_softmax {

std::int64_t workspace_bytes(const Problem& p) { return p.score_elems() * kElemBytes; }

Cost model(const Problem& p) {
  Cost softmax;
  const std::int64_t scores = p.score_elems();
  const std::int64_t rows = p.heads() * p.Nq;
  // Pass 1 reads S for the max, pass 2 for the sum, pass 3 reads it again and
  // writes P over it; one L per row.
  softmax.hbm_read_bytes = 3 * scores * kElemBytes;
  softmax.hbm_write_bytes = (scores + rows) * kElemBytes;
  // Per element: max (pass 1); subtract, exp, add (pass 2); subtract, exp,
  // multiply by 1/l (pass 3). Per row: the reciprocal, log and add of L.
  softmax.nonmatmul_flops = 7 * scores + 3 * rows;
  softmax.thread_blocks = rows;
  Cost c = scores_cost(p);
  c += softmax;
  c += pv_cost(p);
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
  return {s};
}

}  // namespace flashstep
