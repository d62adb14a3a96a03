// Stage 05's model and registry entry (host only). The traffic and FLOPs are
// stage 04's (fa2::model in common/fa2_model.cpp): the same tiles are loaded
// and computed, only spread over more thread blocks.
#include <algorithm>

#include "sequence_parallel.h"

namespace flashstep::sequence_parallel {

std::int64_t workspace_bytes(const Problem&) { return 0; }

// The launch's grid: Tr Q blocks along x, B * H heads (capped) along y.
Cost model(const Problem& p) {
  return fa2::model(p, fa2::q_blocks(p) * std::min(p.heads(), kMaxGridY));
}

}  // namespace flashstep::sequence_parallel

namespace flashstep {

std::vector<Stage> stages_05_sequence_parallel() {
  Stage s;
  s.name = "05_sequence_parallel";
  s.title = "FlashAttention-2, Q blocks over thread blocks";
  s.writes_lse = true;
  s.forward = sequence_parallel::forward;
  s.workspace_bytes = sequence_parallel::workspace_bytes;
  s.model = sequence_parallel::model;
  // No mirror of its own: the algorithm and its counts are stage 04's, which
  // stage 04's mirror checks; only the mapping onto thread blocks differs.
  s.mirror = nullptr;
  s.grouped_heads = true;  // K/V of head bh at kv_head_of(bh, H, H_kv): an index
  // FlashAttention-2's backward (Algorithm 2) lives here because its
  // parallelism is this stage's idea turned around: one thread block per K/V
  // block of one head (README.md, "Backward").
  s.backward = sequence_parallel::backward;
  s.backward_workspace_bytes = sequence_parallel::backward_workspace_bytes;
  s.backward_model = sequence_parallel::backward_model;
  s.backward_mirror = sequence_parallel::backward_mirror;
  return {s};
}

}  // namespace flashstep
