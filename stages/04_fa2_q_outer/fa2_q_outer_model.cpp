// Stage 04's model and registry entry (host only). The closed form itself,
// with its counting conventions, is fa2::model in common/fa2_model.cpp, shared
// with stage 05: only the number of thread blocks differs.
#include <algorithm>

#include "fa2_q_outer.h"

namespace flashstep::fa2_q_outer {

std::int64_t workspace_bytes(const Problem&) { return 0; }

// One thread block per (batch, head), capped at grid x's limit.
Cost model(const Problem& p) { return fa2::model(p, std::min(p.heads(), kMaxBlocks)); }

}  // namespace flashstep::fa2_q_outer

namespace flashstep {

std::vector<Stage> stages_04_fa2_q_outer() {
  Stage s;
  s.name = "04_fa2_q_outer";
  s.title = "FlashAttention-2, Q outer";
  s.writes_lse = true;
  s.forward = fa2_q_outer::forward;
  s.workspace_bytes = fa2_q_outer::workspace_bytes;
  s.model = fa2_q_outer::model;
  s.mirror = fa2_q_outer::mirror;
  s.grouped_heads = true;  // K/V of head bh at kv_head_of(bh, H, H_kv): an index
  return {s};
}

}  // namespace flashstep
