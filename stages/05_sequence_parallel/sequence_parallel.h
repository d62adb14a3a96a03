/// \file sequence_parallel.h
/// \brief Stage 05: FlashAttention-2 forward with sequence parallelism (Dao
/// 2023, §3.2 "Parallelism"). Stage 04's algorithm, unchanged, but each thread
/// block handles one Q block of one head: the outer loop over Q blocks
/// (Algorithm 1, line 3) becomes the grid. Host entry points; CUDA-free.
#pragma once

#include <cstdint>
#include <vector>

#include "common/fa2_model.h"
#include "common/fa2_tiles.h"
#include "common/stage.h"

namespace flashstep::sequence_parallel {

/// Grid y holds at most 65535 blocks; beyond that one block takes the same Q
/// block of several heads. Grid x (Q blocks, at most ceil((2^31 - 1) / Br))
/// always fits its 2^31 - 1 limit.
inline constexpr std::int64_t kMaxGridY = 65535;

/// One thread block per (Q block, batch, head).
void forward(const Problem& p, const ForwardTensors& t, Stream stream);

/// Stage 05 needs no scratch memory: 0.
std::int64_t workspace_bytes(const Problem& p);

/// Stage 04's closed form (fa2::model in common/fa2_model.h): the same traffic
/// and FLOPs, over Tr * min(B * H, kMaxGridY) thread blocks (Tr * B * H
/// whenever B * H <= 65535).
Cost model(const Problem& p);

}  // namespace flashstep::sequence_parallel

namespace flashstep {
/// Registry entries of this folder.
std::vector<Stage> stages_05_sequence_parallel();
}  // namespace flashstep
