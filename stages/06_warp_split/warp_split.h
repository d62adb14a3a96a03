/// \file warp_split.h
/// \brief Stage 06: work partitioning between warps (Dao 2023, §3.3, Figure 3).
/// Two variants of one thread block per (Q block, batch * head), stage 05's
/// grid: split-Q (FlashAttention-2: each warp owns whole rows of Qi) and
/// split-K (FlashAttention-1: warps split the keys of each Kj/Vj tile and add
/// up their partial results through shared memory). Host entry points; CUDA-free.
#pragma once

#include <cstdint>
#include <vector>

#include "common/stage.h"
#include "common/tile_mask.h"

namespace flashstep::warp_split {

/// Grid y holds at most 65535 blocks; beyond that one thread block takes the
/// same Q block of several heads (as in stage 05).
inline constexpr std::int64_t kMaxGridY = 65535;

/// Split-Q forward: one thread block per (Q block, head), warps own rows.
void forward_split_q(const Problem& p, const ForwardTensors& t, Stream stream);
/// Split-K forward: one thread block per (Q block, head), warps own keys.
void forward_split_k(const Problem& p, const ForwardTensors& t, Stream stream);
/// Both in a causal mode (common/tile_mask.h): kFast is the forward above;
/// the other two are for the benchmark's ablation.
void forward_split_q(const Problem& p, const ForwardTensors& t, Stream stream, CausalMode mode);
void forward_split_k(const Problem& p, const ForwardTensors& t, Stream stream, CausalMode mode);

/// Neither variant needs scratch memory: 0.
std::int64_t workspace_bytes(const Problem& p);

/// FlashAttention-2's traffic and FLOPs for split-Q's tiles (warp_split_tiles.h),
/// counting only the (warp rows, K/V tile) pairs a warp computes, and its
/// barriers (2 per visited K/V tile).
Cost model_split_q(const Problem& p);
/// The same for split-K's tiles, plus the per-tile combine's shared-memory
/// traffic, FLOPs and barriers.
Cost model_split_k(const Problem& p);

}  // namespace flashstep::warp_split

namespace flashstep {
/// Registry entries of this folder: 06_warp_split_q and 06_warp_split_k.
std::vector<Stage> stages_06_warp_split();
}  // namespace flashstep
