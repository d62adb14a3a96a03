/// \file fa2_model.h
/// \brief The closed-form traffic and FLOP model of the FlashAttention-2
/// forward (Algorithm 1), shared by stages 04 and 05: the same tiles, loads
/// and arithmetic, launched as different numbers of thread blocks. CUDA-free.
#pragma once

#include <cstdint>

#include "cost.h"
#include "problem.h"
#include "tile_mask.h"

namespace flashstep::fa2 {

/// Q blocks of one head: ceil(Nq / Br).
std::int64_t q_blocks(const Problem& p);

/// K/V blocks that Q block i visits. Non-causal: all ceil(Nk / Bc). Causal:
/// those holding a key that the block's last row sees; the rest lie wholly
/// above the diagonal and are skipped (all of them visited with
/// CausalMode::kNoSkip).
std::int64_t kv_blocks_visited(const Problem& p, std::int64_t i,
                               CausalMode mode = CausalMode::kFast);

/// Traffic and FLOPs in closed form, summed over the Q blocks of every head:
/// Qi read once, Kj and Vj once per visited (i, j), O and L written once;
/// the scores of visited tiles that tile_mask does not call kNone are
/// tested one by one (every visited score with CausalMode::kMaskEvery).
/// The work does not depend on how Q blocks map onto thread blocks; the
/// caller says how many thread blocks its launch has.
Cost model(const Problem& p, std::int64_t thread_blocks, CausalMode mode = CausalMode::kFast);

}  // namespace flashstep::fa2
