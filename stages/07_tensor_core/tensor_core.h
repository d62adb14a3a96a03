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

/// The backward (tensor_core_backward.cu): FlashAttention-2's Algorithm 2
/// in bf16 or fp16. kAtomicDQ: dQ summed by fp32 atomic adds and converted
/// in a last pass, as FlashAttention-2 does; otherwise by a separate kernel
/// over the K/V blocks, in one order: bit-identical from run to run.
template <bool kAtomicDQ>
void backward(const Problem& p, const BackwardTensors& t, Stream stream);

/// The backward's scratch: D and L in log2 units (fp32 [B, H, Nq] each), and
/// for the atomic variant dQ's fp32 accumulator [B, H, Nq, d].
std::int64_t backward_workspace_bytes(const Problem& p);
/// The deterministic variant's: D and L in log2 units.
std::int64_t deterministic_backward_workspace_bytes(const Problem& p);

/// The backward's traffic and FLOPs (tensor_core_backward_model.cpp states
/// the conventions).
template <bool kAtomicDQ>
Cost backward_model(const Problem& p);

/// The backward on the host with the kernels' tiles and numerics in p.dtype
/// (bf16 or fp16; fp32 computes without rounding): S recomputed from the
/// 16-bit Q and K in fp32, P = 2^(S scale log2e - L log2e), D from the
/// 16-bit dO and O, P and dS rounded to p.dtype before the products that
/// take them, every sum in fp32, dQ, dK, dV rounded once at the end
/// (tensor_core_backward_mirror.cpp).
void backward_mirror(const Problem& p, const HostBackwardTensors& t);

}  // namespace flashstep::tensor_core

namespace flashstep {
/// Registry entries of this folder: the four ablation steps, then
/// 07_tensor_core (step 5, the stage itself, with the atomic backward) and
/// 07_tensor_core_deterministic (the same forward, the deterministic backward).
std::vector<Stage> stages_07_tensor_core();
}  // namespace flashstep
