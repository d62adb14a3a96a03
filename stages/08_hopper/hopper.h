/// \file hopper.h
/// \brief Stage 08: FlashAttention-3's ideas on Hopper (sm_90a): wgmma, TMA on
/// mbarriers, and the ablation ladder that adds them one at a time
/// (hopper_tiles.h). Host entry points; CUDA-free.
#pragma once

#include <cstdint>
#include <vector>

#include "common/stage.h"
#include "hopper_tiles.h"

namespace flashstep::hopper {

/// Grid y holds at most 65535 blocks; beyond that one block takes several
/// heads (steps 1-2).
inline constexpr std::int64_t kMaxGridY = 65535;
/// Grid x holds at most 2^31 - 1 blocks; beyond that one block takes several
/// items (steps 3-5).
inline constexpr std::int64_t kMaxGridX = 2147483647;

/// The forward of one step, bf16 or fp16: one thread block per (Q block,
/// head), of one warpgroup and 64 rows (steps 1-2), or blocks of a producer
/// and two consumer warpgroups taking (Q block of 128 rows, head) items, one
/// block per SM without a causal mask (steps 3-5; three consumers and 192
/// rows at d = 64). Defined in the step's own .cu file.
template <Step kStep>
void forward(const Problem& p, const ForwardTensors& t, Stream stream);

/// No scratch memory: 0.
std::int64_t workspace_bytes(const Problem& p);

/// FlashAttention-2's traffic and FLOPs on this stage's tiles, in 16-bit
/// elements; shared-memory reads as wgmma makes them (hopper_model.cpp).
template <Step kStep>
Cost model(const Problem& p);

/// The kernel's algorithm on the host, its tiles and numerics
/// (hopper_mirror.cpp), counting what model() counts.
template <Step kStep>
Cost mirror(const Problem& p, const HostTensors& t);

}  // namespace flashstep::hopper

namespace flashstep {
/// Registry entries of this folder, one per step.
std::vector<Stage> stages_08_hopper();
}  // namespace flashstep
