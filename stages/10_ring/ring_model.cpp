// Ring attention's problem rules and model (ring_model.h).
#include "ring_model.h"

#include <string>

#include "common/error.h"

namespace flashstep::ring {

namespace {
// The merge's non-matmul FLOPs per row: lse_merge (max, min, subtract, exp,
// log1p, add) and the two weights (a subtract and an exp each).
constexpr std::int64_t kMergeRowFlops = 10;
// Per element: w_a * O_a + w_b * O_b.
constexpr std::int64_t kMergeElemFlops = 3;

std::int64_t blocks_for(std::int64_t rows) {
  return (rows + kMergeRowsPerBlock - 1) / kMergeRowsPerBlock;
}
}  // namespace

void validate_ring(const Problem& p) {
  validate(p);
  if (p.Nq != p.Nk) {
    throw Error("ring attention splits one sequence into chunks of queries and keys alike: it "
                "needs Nq = Nk (use --N), got Nq = " + std::to_string(p.Nq) + ", Nk = " +
                std::to_string(p.Nk));
  }
}

void require_partial_stage(const Stage& stage, const Problem& p) {
  if (!stage.writes_lse) {
    std::string have;
    for (const Stage& s : all_stages()) {
      if (s.writes_lse) have += (have.empty() ? "" : ", ") + std::string(s.name);
    }
    throw Error("stage " + std::string(stage.name) + " does not write L, which the ring's merge " +
                "weighs the partials by (these do: " + have + ")");
  }
  require_dtype(stage, p.dtype);
}

Problem pair_problem(const Problem& p, const Schedule& s, const Pair& pair) {
  Problem sub = p;
  sub.Nq = s.chunk(pair.q_chunk).size();
  sub.Nk = s.chunk(pair.kv_chunk).size();
  sub.causal = pair.kind == PairKind::kDiagonal;
  sub.scale = p.softmax_scale();
  return sub;
}

Cost merge_cost(const Problem& p, std::int64_t rows) {
  const std::int64_t heads_rows = p.heads() * rows;
  Cost c;
  c.hbm_read_bytes = heads_rows * (p.d * (kFloatBytes + p.elem_bytes()) + 2 * kFloatBytes);
  c.hbm_write_bytes = heads_rows * (p.d * kFloatBytes + kFloatBytes);
  c.nonmatmul_flops = heads_rows * (kMergeRowFlops + kMergeElemFlops * p.d);
  c.thread_blocks = blocks_for(heads_rows);
  return c;
}

Cost init_finish_cost(const Problem& p, std::int64_t rows) {
  const std::int64_t heads_rows = p.heads() * rows;
  Cost c;
  c.hbm_read_bytes = heads_rows * p.d * kFloatBytes;  // finish: O_acc
  // init: O_acc and L_acc; finish: O.
  c.hbm_write_bytes = heads_rows * (p.d * kFloatBytes + kFloatBytes + p.d * p.elem_bytes());
  c.thread_blocks = 2 * blocks_for(heads_rows);
  return c;
}

RankCost rank_cost(const Problem& p, const Schedule& s, const Stage& stage, int rank) {
  RankCost r;
  const std::int64_t row_bytes = 2 * p.heads() * p.d * p.elem_bytes();  // one K row and one V row
  r.bytes_sent = row_bytes * (s.tokens() - s.rows_held(s.next(rank)));
  r.bytes_received = row_bytes * (s.tokens() - s.rows_held(rank));
  for (int c : s.held(rank)) {
    const Chunk a = s.chunk(c);
    r.scores += s.causal() ? a.size() * a.begin + a.size() * (a.size() + 1) / 2
                           : a.size() * s.tokens();
  }
  for (int t = 0; t < s.ranks(); ++t) {
    for (const Pair& pair : s.step(rank, t).pairs) {
      if (pair.kind == PairKind::kSkip) {
        ++r.skipped;
        continue;
      }
      ++(pair.kind == PairKind::kFull ? r.full : r.diagonal);
      r.compute += stage.model(pair_problem(p, s, pair));
      r.compute += merge_cost(p, s.chunk(pair.q_chunk).size());
    }
  }
  for (int c : s.held(rank)) {
    if (s.chunk(c).size() > 0) r.compute += init_finish_cost(p, s.chunk(c).size());
  }
  return r;
}

std::vector<RankCost> ring_cost(const Problem& p, const Schedule& s, const Stage& stage) {
  std::vector<RankCost> out;
  for (int r = 0; r < s.ranks(); ++r) out.push_back(rank_cost(p, s, stage, r));
  return out;
}

}  // namespace flashstep::ring
