// Stage 05: FlashAttention-2 forward with sequence parallelism (Dao 2023, §3.2
// "Parallelism"), fp32 on CUDA cores.
//
// What changed since stage 04: only the mapping of work onto thread blocks.
// Stage 04 runs one thread block per (batch, head), which walks the head's Tr
// Q blocks one after another. Here each thread block handles ONE Q block of
// one head: Algorithm 1's outer loop over i (line 3) becomes the grid. The
// body of a Q block is stage 04's, shared through common/fa2_q_block.cuh
// (attend_q_block), so the traffic, the FLOPs and the numerics are the same.
// Q blocks never need each other's results (each owns its rows of O and L),
// so the thread blocks never talk to each other.
//
// Why: stage 04 launches B * H thread blocks. At the paper's long-sequence
// settings (N = 16384, d = 128, B * H = 16) that is 16 blocks for 132 SMs on
// an H100/H200, and 116 SMs sit idle. Here the same problem is Tr * B * H =
// 256 * 16 = 4096 blocks.
//
// Run it: ./build/stages/cli/flashstep --stage 04,05 --B 1 --H 4 --N 16384 --d 64
//
// The grid (Tr = ceil(Nq / Br) Q blocks, heads = B * H):
//
//                 blockIdx.x = 0      1          ...   Tr - 1
//   blockIdx.y 0  (bh 0, i Tr-1)  (bh 0, i Tr-2) ...  (bh 0, i 0)
//   blockIdx.y 1  (bh 1, i Tr-1)  (bh 1, i Tr-2) ...  (bh 1, i 0)
//      ...
//   blockIdx.y Y-1, Y = min(heads, 65535): bh = y, y + Y, y + 2Y, ... < heads
//
// x runs over Q blocks because Tr can pass grid y's limit of 65535 (Nq beyond
// 4 Mi rows); heads go on y, and when B * H passes 65535 each block walks
// heads with a grid-stride loop (the loop runs once otherwise).
//
// Launch order, for the causal load balance: with the bottom-right mask Q
// block i visits about i + 1 of Tc K/V blocks (Nq = Nk), so the last Q block
// of a head does Tr times the work of the first. The GPU hands out blocks
// roughly in order of blockIdx.x + gridDim.x * blockIdx.y (x fastest; not a
// documented guarantee, but what the block scheduler does). Mapping
// blockIdx.x to i = Tr - 1 - blockIdx.x starts each head's heaviest Q blocks
// first, so the blocks that start last are light ones and the SMs finish
// close together; in the natural order the heaviest blocks of the last head
// would start last and run on a few SMs while the rest idle. Non-causal, every
// Q block does the same work and the order costs nothing.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common/cuda_check.h"
#include "common/launch.cuh"
#include "common/fa2_q_block.cuh"
#include "sequence_parallel.h"

namespace flashstep::sequence_parallel {

namespace {

using fa2::attend_q_block;
using fa2::kBr;
using fa2::kThreads;
using fa2::Layout;
using fa2::Params;

// One thread block per (Q block, head): line 3's loop over i is the grid's x.
template <int kHeadDim>
__global__ void __launch_bounds__(kThreads, Layout<kHeadDim>::kMinBlocksPerSM)
    sequence_parallel_kernel(const Params p) {
  extern __shared__ float4 smem_vec[];  // float4: 16-byte alignment for float4 tile accesses
  float* smem = reinterpret_cast<float*>(smem_vec);
  // BEGIN ASSIGNMENT: map this thread block to its Q block i (grid x, heaviest first: i = Tr - 1 - blockIdx.x) and its heads (grid y, grid-stride) and run attend_q_block<kHeadDim>(p, bh, i, smem)
  const int Tr = (p.Nq - 1) / kBr + 1;  // not (Nq + Br - 1) / Br: Nq may be near 2^31
  const int i = Tr - 1 - static_cast<int>(blockIdx.x);  // heaviest Q blocks first (above)
  for (std::int64_t bh = blockIdx.y; bh < p.heads; bh += gridDim.y) {
    attend_q_block<kHeadDim>(p, bh, i, smem);
  }
  // END ASSIGNMENT
}

template <int kHeadDim>
void launch(const Params& prm, std::int64_t Tr, Stream stream) {
  const dim3 grid(static_cast<unsigned>(Tr),
                  static_cast<unsigned>(std::min(prm.heads, kMaxGridY)));
  launch_with_smem(sequence_parallel_kernel<kHeadDim>, grid, kThreads,
                   Layout<kHeadDim>::kSmemBytes, stream, "stage 05 sequence_parallel_kernel", prm);
}

}  // namespace

void forward(const Problem& p, const ForwardTensors& t, Stream stream) {
  forward(p, t, stream, CausalMode::kFast);
}

void forward(const Problem& p, const ForwardTensors& t, Stream stream, CausalMode mode) {
  validate(p);
  if (!t.Q || !t.K || !t.V || !t.O || !t.L) throw Error("stage 05: null tensor pointer");
  const Params prm = fa2::make_params(p, t, mode);
  // Grid x: Tr <= ceil((2^31 - 1) / 64) Q blocks, far inside x's 2^31 - 1.
  const std::int64_t Tr = fa2::q_blocks(p);
  switch (head_dim_bucket(p.d)) {  // d is zero-padded up to the bucket inside the tiles
    case 64: launch<64>(prm, Tr, stream); break;
    case 128: launch<128>(prm, Tr, stream); break;
    default: launch<256>(prm, Tr, stream); break;
  }
}

}  // namespace flashstep::sequence_parallel
