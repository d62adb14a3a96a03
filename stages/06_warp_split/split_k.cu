// Stage 06, split-K: FlashAttention-1's work partitioning between warps (Dao
// 2023, §3.3, Figure 3a), the contrast to split-Q. fp32 on CUDA cores.
//
// Same grid and algorithm as split-Q (split_q.cu), but inside a thread block
// the 4 warps split each K/V tile's keys. Every warp then holds partial
// results for all rows of Qi, and after every K/V tile they meet in shared
// memory (split_k.cuh draws it): partial row maxima and sums, a barrier, the
// combine's scales, then per 32-column chunk of O~ the partial P~ V products,
// a barrier, the add-up, a barrier. The model (warp_split_model.cpp) counts
// what that costs in shared-memory bytes and barriers.
//
// Run it: ./build/stages/cli/flashstep --stage 06 --B 4 --H 16 --N 4096 --d 128
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common/cuda_check.h"
#include "common/launch.cuh"
#include "split_k.cuh"
#include "warp_split.h"

namespace flashstep::warp_split {

namespace {

// One thread block per (Q block, head), heaviest Q blocks first.
template <int kHeadDim>
__global__ void __launch_bounds__(SplitK<kHeadDim>::kThreads)
    split_k_kernel(const Params p) {
  extern __shared__ float4 smem_vec[];  // float4: 16-byte alignment for float4 tile accesses
  float* smem = reinterpret_cast<float*>(smem_vec);
  constexpr int kBr = SplitK<kHeadDim>::kBr;
  const int Tr = (p.Nq - 1) / kBr + 1;  // not (Nq + Br - 1) / Br: Nq may be near 2^31
  const int i = Tr - 1 - static_cast<int>(blockIdx.x);
  for (std::int64_t bh = blockIdx.y; bh < p.heads; bh += gridDim.y) {
    // The previous head's last reads of O~ and 1/l end before this head
    // overwrites them (only when B * H passes grid y's limit).
    if (bh != blockIdx.y) __syncthreads();
    split_k_block<kHeadDim>(p, bh, i, smem);
  }
}

template <int kHeadDim>
void launch(const Params& prm, Stream stream) {
  using T = SplitK<kHeadDim>;
  const std::int64_t Tr = (prm.Nq - 1) / T::kBr + 1;
  const dim3 grid(static_cast<unsigned>(Tr),
                  static_cast<unsigned>(std::min(prm.heads, kMaxGridY)));
  launch_with_smem(split_k_kernel<kHeadDim>, grid, T::kThreads, T::kSmemBytes, stream,
                   "stage 06 split_k_kernel", prm);
}

}  // namespace

void forward_split_k(const Problem& p, const ForwardTensors& t, Stream stream) {
  forward_split_k(p, t, stream, CausalMode::kFast);
}

void forward_split_k(const Problem& p, const ForwardTensors& t, Stream stream, CausalMode mode) {
  validate(p);
  if (!t.Q || !t.K || !t.V || !t.O || !t.L) throw Error("stage 06 split-K: null tensor pointer");
  const Params prm = fa2::make_params(p, t, mode);
  switch (head_dim_bucket(p.d)) {
    case 64: launch<64>(prm, stream); break;
    case 128: launch<128>(prm, stream); break;
    default: launch<256>(prm, stream); break;
  }
}

}  // namespace flashstep::warp_split
