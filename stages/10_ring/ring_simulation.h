/// \file ring_simulation.h
/// \brief Ring attention on the CPU: P ranks in one process following the
/// GPU runner's schedule (ring_schedule.h) step by step, with the merge of
/// common/partial_merge.h. It runs in CI, where it is checked against the
/// fp64 reference, so what it proves about the schedule holds for the GPUs.
///
/// Each rank keeps what a GPU keeps, in the same layout (Layout): its Q
/// chunks rounded to the problem's type, three K/V buffers (its own block and
/// two it receives into in turn), an fp32 accumulator (O, L) per Q chunk,
/// and one partial. A transfer copies a block's K and V chunks from the
/// buffer a rank computes from into the buffer the next rank receives into,
/// and counts the bytes. Transfers run as early as the schedule lets them
/// (each after the one before it, and after the compute it must wait for),
/// which is the order a fast link gives on the GPUs: a receive that
/// overwrote a block still to be computed on would show here as a wrong
/// result.
#pragma once

#include <functional>
#include <vector>

#include "common/check.h"
#include "common/cost.h"
#include "common/problem.h"
#include "common/stage.h"
#include "ring_model.h"
#include "ring_schedule.h"

namespace flashstep::ring {

/// Computes one partial: attention of Q [B, H, Nq, d] over K and V
/// [B, H, Nk, d] of `sub`, writing O [B, H, Nq, d] (rounded to sub.dtype,
/// as a stage stores it) and L [B, H, Nq]; returns what it counted.
using PartialFn = std::function<Cost(const Problem& sub, const HostTensors& t)>;

/// Partials from the fp64 reference, O rounded to the type and L to fp32
/// (what an exact stage would store). Counts nothing.
PartialFn reference_partial();

/// Partials from `stage`'s CPU mirror: its algorithm in its numerics, with
/// its counts. Throws flashstep::Error if the stage has no mirror.
PartialFn mirror_partial(const Stage& stage);

/// Whether transfers wait for the compute the schedule says they must.
/// kIgnore exists to show that the waits matter: with P >= 4 a receive then
/// overwrites a block before it is computed on.
enum class Waits { kHonour, kIgnore };

/// What a simulated ring forward gives.
struct Simulation {
  std::vector<float> O;  ///< [B, H, N, d], rounded to p.dtype
  std::vector<float> L;  ///< [B, H, N]
  /// Per rank, what it counted: bytes copied to and from it, visible scores
  /// of the pairs it computed (from the global mask, query by query), pairs
  /// by kind, and the partials' counts (from the PartialFn) plus its merges,
  /// init and finish priced by merge_cost and init_finish_cost.
  std::vector<RankCost> counted;
};

/// Ring attention of `p` (validate_ring; Nq = Nk = s.tokens()) on the host
/// inputs `in` (fp32; rounded to p.dtype here, as the runner rounds them),
/// following `s`, with `partial` computing each pair.
Simulation simulate(const Problem& p, const Inputs& in, const Schedule& s,
                    const PartialFn& partial, Waits waits = Waits::kHonour);

}  // namespace flashstep::ring
