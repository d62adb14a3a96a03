/// \file ring_model.h
/// \brief Ring attention's problem rules and model: the partial each pair
/// runs, the merge's traffic, and per rank the bytes sent around the ring
/// beside the HBM bytes and FLOPs of its partials. CUDA-free.
#pragma once

#include <cstdint>
#include <vector>

#include "common/cost.h"
#include "common/problem.h"
#include "common/stage.h"
#include "ring_schedule.h"

namespace flashstep::ring {

/// Throws flashstep::Error unless `p` is a problem the ring splits: a valid
/// problem (validate()) with Nq = Nk, one sequence whose queries and keys
/// are the same tokens (self-attention, what context parallelism is for).
/// With Nq != Nk the bottom-right mask would cut chunk pairs diagonally at
/// offsets no stage takes; decoding against a long cache is split-KV's case.
void validate_ring(const Problem& p);

/// Throws flashstep::Error unless `stage` can compute the partials: it
/// must write L, which the merge weighs the partials by, and run in p.dtype.
void require_partial_stage(const Stage& stage, const Problem& p);

/// The problem the stage solves for one pair: B, H, d, dtype and the softmax
/// scale of `p` (the scale set explicitly, so a scale given for the whole
/// sequence stays the partials' one), Nq and Nk the two chunks' rows, and
/// causal for a diagonal pair only.
Problem pair_problem(const Problem& p, const Schedule& s, const Pair& pair);

/// Rows per thread block of the merge, init and finish kernels (ring_merge.cu):
/// one warp per row, as many warps as keep a block at 256 threads, the size
/// that lets an SM hold several blocks and hide the loads' latency.
inline constexpr std::int64_t kMergeRowsPerBlock = 8;

/// HBM traffic and FLOPs of merging one partial of `rows` rows into its
/// accumulator (common/partial_merge.h's rule; the kernel in ring_merge.cu):
/// reads O_acc and L_acc (fp32), O_part (p.dtype) and L_part (fp32), writes
/// O_acc and L_acc. Per row lse_merge and the two weights, per element two
/// multiplies and an add.
Cost merge_cost(const Problem& p, std::int64_t rows);

/// Traffic of starting and finishing the accumulators of `rows` rows: every
/// O_acc element set to 0 and L_acc to -inf, then O_acc rounded into O
/// (p.dtype). L_acc is the output L.
Cost init_finish_cost(const Problem& p, std::int64_t rows);

/// What one rank moves and computes in one ring forward.
struct RankCost {
  std::int64_t bytes_sent = 0;      ///< K and V chunks it sends on (P-1 steps)
  std::int64_t bytes_received = 0;  ///< K and V chunks it receives
  std::int64_t scores = 0;          ///< visible (query, key) pairs it computes
  std::int64_t full = 0;            ///< partials computed non-causal
  std::int64_t diagonal = 0;        ///< partials computed causal
  std::int64_t skipped = 0;         ///< pairs skipped (fully masked or empty)
  Cost compute;  ///< the stage's model over its partials, plus merges, init and finish
};

/// The model of rank `rank` computing its partials with `stage`. Bytes and
/// scores in closed form: a rank sends every block but that of the rank it
/// sends to (it passes its own on at step 0, and the last block it holds,
/// from rank+1, goes nowhere), so
///
///   bytes_sent     = 2 B H d E (N - rows_held(rank + 1))
///   bytes_received = 2 B H d E (N - rows_held(rank))
///
/// (E bytes per element: 2 (P-1)/P B H N d E each when P divides N); a
/// rank's scores are, over each chunk a it holds (n_a rows from row b_a),
/// n_a N without the mask and n_a b_a + n_a (n_a + 1) / 2 with it. The
/// compute Cost sums stage.model over the partials the schedule computes.
RankCost rank_cost(const Problem& p, const Schedule& s, const Stage& stage, int rank);

/// rank_cost of every rank, in rank order.
std::vector<RankCost> ring_cost(const Problem& p, const Schedule& s, const Stage& stage);

}  // namespace flashstep::ring
