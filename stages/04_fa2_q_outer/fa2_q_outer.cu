// Stage 04: FlashAttention-2 forward (Dao 2023, Algorithm 1), fp32 on CUDA cores.
//
// What changed since stage 03 (FlashAttention-1):
// - The loops are swapped: Q blocks outside, K/V blocks inside. A Q block's
//   O~_i, l_i and m_i stay in registers for its whole K/V sweep instead of
//   making a round trip through HBM per K/V block.
// - Deferred rescaling: O~_i is only multiplied by e^(m_old - m_new) per K/V
//   block and divided by l_i once, after the last one (lines 10 and 12).
// - Only the logsumexp L = m + log(l) is written beside O (line 13), not m and l.
// - Causal: K/V blocks wholly above the diagonal are skipped, not computed and
//   masked; only the blocks that cross the diagonal (or the end Nk, or hold
//   rows past Nq) test each score, the blocks below it need no test
//   (FlashAttention-2 §3.1, common/tile_mask.h).
//
// Run it: ./build/stages/cli/flashstep --stage 04 --B 1 --H 16 --N 4096 --d 128 --causal
//
// Work partitioning: one thread block per (batch, head), walking its Q blocks.
// The body of one Q block, attend_q_block, and the tile helpers it calls live
// in common/fa2_q_block.cuh, shared with stage 05, which spreads the Q blocks
// over thread blocks. 256 threads tile the 64 x 64 scores S_ij and the 64 x d
// output O~_i:
//
//             S_ij, P~_ij columns (keys):  c = cg + 16 * cc,  cc = 0..3
//             O~_i columns:                4 * (cg + 16 * q) + 0..3
//                 cg 0 .. 7      cg 8 .. 15
//   rows  0-15    warp 0         warp 1        thread (rg, cg) owns rows
//   rows 16-31    warp 2         warp 3        4 rg .. 4 rg + 3 of S_ij,
//   rows 32-47    warp 4         warp 5        P~_ij and O~_i, so it rescales
//   rows 48-63    warp 6         warp 7        its own O~ rows with no traffic.
//   inside a warp: lane = 8 * (rg % 4) + (cg % 8)
//
// A row's 64 scores are spread over 16 threads in two warps: the row max goes
// through warp shuffles and then a small shared array between the two warps
// (stage 06 gives each warp whole rows instead). Each thread keeps its own
// share of l_i, scaled by the same e^(m_old - m_new) as every other share of the
// row, and the shares are added once at the end.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common/cuda_check.h"
#include "common/launch.cuh"
#include "common/fa2_q_block.cuh"
#include "fa2_q_outer.h"

namespace flashstep::fa2_q_outer {

namespace {

using fa2::attend_q_block;
using fa2::Layout;
using fa2::Params;

// One thread block per (batch, head), looping over the head's Q blocks (line 3).
template <int kHeadDim>
__global__ void __launch_bounds__(kThreads, Layout<kHeadDim>::kMinBlocksPerSM)
    fa2_forward_kernel(const Params p) {
  extern __shared__ float4 smem_vec[];  // float4: 16-byte alignment for float4 tile accesses
  float* smem = reinterpret_cast<float*>(smem_vec);
  const int Tr = (p.Nq - 1) / kBr + 1;  // not (Nq + Br - 1) / Br: Nq may be near 2^31
  // BEGIN ASSIGNMENT: line 3: for each head bh of this block (grid-stride over gridDim.x), every Q block i = 0..Tr-1 through attend_q_block<kHeadDim>(p, bh, i, smem)
  for (std::int64_t bh = blockIdx.x; bh < p.heads; bh += gridDim.x) {
    for (int i = 0; i < Tr; ++i) attend_q_block<kHeadDim>(p, bh, i, smem);
  }
  // END ASSIGNMENT
}

template <int kHeadDim>
void launch(const Params& prm, Stream stream) {
  const auto grid = static_cast<unsigned>(std::min(prm.heads, kMaxBlocks));
  launch_with_smem(fa2_forward_kernel<kHeadDim>, grid, kThreads, Layout<kHeadDim>::kSmemBytes,
                   stream, "stage 04 fa2_forward_kernel", prm);
}

}  // namespace

void forward(const Problem& p, const ForwardTensors& t, Stream stream) {
  forward(p, t, stream, CausalMode::kFast);
}

void forward(const Problem& p, const ForwardTensors& t, Stream stream, CausalMode mode) {
  validate(p);
  if (!t.Q || !t.K || !t.V || !t.O || !t.L) throw Error("stage 04: null tensor pointer");
  const Params prm = fa2::make_params(p, t, mode);
  switch (head_dim_bucket(p.d)) {  // d is zero-padded up to the bucket inside the tiles
    case 64: launch<64>(prm, stream); break;
    case 128: launch<128>(prm, stream); break;
    default: launch<256>(prm, stream); break;
  }
}

}  // namespace flashstep::fa2_q_outer
