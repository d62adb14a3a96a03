/// \file fa1_kv_outer.h
/// \brief Stage 03: FlashAttention-1 (Dao et al. 2022, Algorithm 1). K/V blocks
/// in the outer loop, Q blocks in the inner loop, O_i, l_i and m_i read from and
/// written back to HBM on every inner step. Host entry points and the tile
/// geometry that the kernel and the CPU mirror share; CUDA-free.
#pragma once

#include <cstdint>
#include <vector>

#include "common/stage.h"
#include "common/tile_mask.h"

namespace flashstep::fa1_kv_outer {

/// Threads per block: one block per (batch, head), so with B * H often below
/// two blocks per SM each block must keep its SM busy on its own. 8 warps form
/// a 16 x 16 thread grid over every tile (see the diagram in fa1_kv_outer.cu).
inline constexpr int kThreads = 256;

/// Query rows per tile (Br). Each thread of the 16 x 16 grid owns 4 rows and so
/// holds 4 x D/16 accumulators of O_i: 64 registers at D = 256, which still fit
/// beside the score tile without spilling.
inline constexpr int kBr = 64;


/// Key/value rows per tile (Bc) for a padded head dimension D. Kj, Vj and Qi are
/// (Bc + Bc + Br) rows of D floats in shared memory: Bc = 64 fits D = 128 in
/// sm_80's 163 KB per block; at D = 256 only Bc = 32 does.
constexpr int kv_tile_rows(int head_dim) { return head_dim <= 128 ? 64 : 32; }

/// Tc = ceil(Nk / Bc): the number of K/V blocks, i.e. how many times every
/// O_i, l_i, m_i makes the round trip through HBM.
inline std::int64_t kv_tiles(const Problem& p) {
  const std::int64_t Bc = kv_tile_rows(head_dim_bucket(p.d));
  return (p.Nk + Bc - 1) / Bc;
}

/// Grid x is limited to 2^31 - 1 blocks; beyond that, blocks walk the heads in strides.
inline constexpr std::int64_t kMaxGridX = 2147483647;

/// Thread blocks launched: one per (batch, head), up to the grid limit.
inline std::int64_t launched_blocks(const Problem& p) {
  return p.heads() < kMaxGridX ? p.heads() : kMaxGridX;
}

/// Algorithm 1 on the GPU: initialises O = 0, l = 0, m = -inf, then for every
/// K/V block j and every Q block i updates O_i, l_i, m_i in HBM; after the last
/// j it writes L = m + log(l). Runs in fp32, fp16 or bf16 (p.dtype); O_i, l
/// and m travel in fp32 in every type. Needs t.L and workspace_bytes(p) of
/// workspace.
void forward(const Problem& p, const ForwardTensors& t, Stream stream);
/// The same in a causal mode (common/tile_mask.h), for the benchmark's
/// ablation: kMaskEvery tests every score as FlashAttention-1 does; kNoSkip is
/// kFast here (FlashAttention-1 visits every tile). Same O and L bit for bit.
void forward(const Problem& p, const ForwardTensors& t, Stream stream, CausalMode mode);

/// The workspace: in fp16 and bf16 first O_acc [B, H, Nq, d], the running O_i
/// in fp32 (in fp32 O itself holds it); then the running statistics l and m,
/// [B, H, Nq] each, fp32.
std::int64_t workspace_bytes(const Problem& p);

/// Byte offset of l in the workspace (m follows it): after O_acc in fp16 and
/// bf16, 0 in fp32.
std::int64_t stats_offset(const Problem& p);

/// Traffic and FLOPs in closed form (README.md derives every term).
Cost model(const Problem& p);

/// Algorithm 1 on the host with the kernel's loops and tiles, counting every
/// element that crosses HBM <-> SRAM, every shared-memory access and every FLOP.
Cost mirror(const Problem& p, const HostTensors& t);
/// The same in a causal mode, as the kernel runs it.
Cost mirror(const Problem& p, const HostTensors& t, CausalMode mode);

}  // namespace flashstep::fa1_kv_outer

namespace flashstep {
/// Registry entries of this folder.
std::vector<Stage> stages_03_fa1_kv_outer();
}  // namespace flashstep
