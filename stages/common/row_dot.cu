// D = rowsum(dO o O): the backward's preprocessing (FA2 Algorithm 2, line 4).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda_check.h"
#include "reduce.cuh"
#include "row_dot.h"

namespace flashstep {

namespace {

// One warp per row: lanes stride over d (coalesced), then a warp reduction.
__global__ void row_dot_kernel(const float* __restrict__ dO, const float* __restrict__ O,
                               float* __restrict__ D, std::int64_t rows, int d) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const std::int64_t warp = threadIdx.x / kWarpSize;
  for (std::int64_t r = blockIdx.x * std::int64_t{kRowDotRowsPerBlock} + warp; r < rows;
       r += std::int64_t{gridDim.x} * kRowDotRowsPerBlock) {
    const float* dO_r = dO + r * d;  // [d]
    const float* O_r = O + r * d;    // [d]
    float acc = 0.0f;
    for (int k = lane; k < d; k += kWarpSize) acc = fmaf(dO_r[k], O_r[k], acc);
    acc = warp_reduce(acc, SumOp{});
    if (lane == 0) D[r] = acc;
  }
}

}  // namespace

void launch_row_dot(const Problem& p, const float* dO, const float* O, float* D, Stream stream) {
  const std::int64_t rows = p.heads() * p.Nq;
  const std::int64_t blocks = (rows + kRowDotRowsPerBlock - 1) / kRowDotRowsPerBlock;
  row_dot_kernel<<<static_cast<unsigned>(std::min(blocks, kRowDotMaxBlocks)),
                   kRowDotRowsPerBlock * kWarpSize, 0, stream>>>(dO, O, D, rows,
                                                                 static_cast<int>(p.d));
  check_launch("row_dot_kernel");
}

}  // namespace flashstep
