/// \file tensor_core.h
/// \brief Stage 07: FlashAttention-2's forward on tensor cores, the way its
/// CUDA code runs it (Dao 2023, Algorithm 1 and §3.3): bf16 or fp16 Q, K, V
/// and O, fp32 accumulators, mma.sync.m16n8k16, and the ablation ladder that
/// builds it one idea at a time (tensor_core_tiles.h). Host entry points;
/// CUDA-free.
#pragma once

#include <cstdint>
#include <vector>

#include "common/stage.h"
#include "tensor_core_tiles.h"

namespace flashstep::tensor_core {

/// Grid y holds at most 65535 blocks; beyond that one thread block takes the
/// same Q block of several heads (as in stage 05).
inline constexpr std::int64_t kMaxGridY = 65535;

/// The forward of one ablation step: one thread block per (Q block, head),
/// warps split Q. Step kTunedTiles runs bf16 and fp16; steps 1-4 bf16.
/// Defined in the step's own .cu file.
template <Step kStep>
void forward(const Problem& p, const ForwardTensors& t, Stream stream);

/// No step needs scratch memory: 0.
std::int64_t workspace_bytes(const Problem& p);

/// FlashAttention-2's traffic and FLOPs on the step's tiles, in 16-bit
/// elements; shared-memory reads per warp as the fragments are loaded
/// (tensor_core_model.cpp states the conventions).
template <Step kStep>
Cost model(const Problem& p);

/// The step's algorithm on the host with the kernel's loops, tiles and
/// numerics, in bf16 (fp16 too for step 5, as the kernel): O rounded to
/// p.dtype, L fp32; counting what model() counts (tensor_core_mirror.cpp).
template <Step kStep>
Cost mirror(const Problem& p, const HostTensors& t);

}  // namespace flashstep::tensor_core

namespace flashstep {
/// Registry entries of this folder: the four ablation steps, then
/// 07_tensor_core (step 5, the stage itself).
std::vector<Stage> stages_07_tensor_core();
}  // namespace flashstep
