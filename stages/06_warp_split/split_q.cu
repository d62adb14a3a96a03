// Stage 06, split-Q: FlashAttention-2's work partitioning between warps (Dao
// 2023, §3.3 "Work partitioning between warps", Figure 3b), fp32 on CUDA cores.
//
// What changed since stage 05: only what happens inside a thread block. The
// grid (one thread block per Q block and head, heaviest causal Q blocks first)
// and the algorithm (Algorithm 1, O~ on chip, one division by l at the end)
// are stage 05's. Stage 05 spreads each row of S over 16 threads in two
// warps, so every row max takes shuffles, a shared-memory exchange and a
// barrier. Here each warp owns whole rows (split_q.cuh draws it): the row max
// and row sum are 3 shuffles, P~ stays in the warp's own slice of shared
// memory, and barriers guard only the shared Kj and Vj (2 per K/V tile).
// Owning rows also lets a warp skip a causal K/V tile that none of its rows
// sees while the other warps of the block work on it.
//
// Run it: ./build/stages/cli/flashstep --stage 05,06 --B 4 --H 16 --N 4096 --d 128
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common/cuda_check.h"
#include "common/launch.cuh"
#include "split_q.cuh"
#include "warp_split.h"

namespace flashstep::warp_split {

namespace {

// One thread block per (Q block, head), as stage 05: heaviest Q blocks first.
template <int kHeadDim>
__global__ void __launch_bounds__(SplitQ<kHeadDim>::kThreads,
                                  SplitQ<kHeadDim>::kShape.min_blocks_per_sm)
    split_q_kernel(const Params p) {
  extern __shared__ float4 smem_vec[];  // float4: 16-byte alignment for float4 tile accesses
  float* smem = reinterpret_cast<float*>(smem_vec);
  constexpr int kBr = SplitQ<kHeadDim>::kBr;
  const int Tr = (p.Nq - 1) / kBr + 1;  // not (Nq + Br - 1) / Br: Nq may be near 2^31
  const int i = Tr - 1 - static_cast<int>(blockIdx.x);
  for (std::int64_t bh = blockIdx.y; bh < p.heads; bh += gridDim.y) {
    split_q_block<kHeadDim>(p, bh, i, smem);
  }
}

template <int kHeadDim>
void launch(const Params& prm, Stream stream) {
  using T = SplitQ<kHeadDim>;
  const std::int64_t Tr = (prm.Nq - 1) / T::kBr + 1;
  const dim3 grid(static_cast<unsigned>(Tr),
                  static_cast<unsigned>(std::min(prm.heads, kMaxGridY)));
  launch_with_smem(split_q_kernel<kHeadDim>, grid, T::kThreads, T::kSmemBytes, stream,
                   "stage 06 split_q_kernel", prm);
}

}  // namespace

void forward_split_q(const Problem& p, const ForwardTensors& t, Stream stream) {
  forward_split_q(p, t, stream, CausalMode::kFast);
}

void forward_split_q(const Problem& p, const ForwardTensors& t, Stream stream, CausalMode mode) {
  validate(p);
  if (!t.Q || !t.K || !t.V || !t.O || !t.L) throw Error("stage 06 split-Q: null tensor pointer");
  const Params prm = fa2::make_params(p, t, mode);
  switch (head_dim_bucket(p.d)) {
    case 64: launch<64>(prm, stream); break;
    case 128: launch<128>(prm, stream); break;
    default: launch<256>(prm, stream); break;
  }
}

}  // namespace flashstep::warp_split
