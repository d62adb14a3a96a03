// Stage 01: naive attention, three kernels, everything N x N goes through HBM.
//
//   kernel 1  S = scale * Q K^T            -> HBM  [B, H, Nq, Nk]   (common/naive_matmul.cu)
//   kernel 2  P = exp(S) / rowsum(exp(S))  -> HBM, in place over S   (this file)
//   kernel 3  O = P V                      -> HBM  [B, H, Nq, d]    (common/naive_matmul.cu)
//
// The softmax does NOT subtract the row max. exp overflows fp32 once a logit
// passes ~88.7, and the row turns into inf / inf = NaN: stage 01 knowingly
// fails there (tests/test_stages.cpp shows it), and stage 02 is the fix.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/cuda_check.h"
#include "common/naive_matmul.h"
#include "common/reduce.cuh"
#include "naive.h"

namespace flashstep::naive {

namespace {

// Grid x is limited to 2^31 - 1 blocks; longer row counts are walked in strides.
constexpr std::int64_t kMaxGridX = 2147483647;

// P [rows, Nk] = exp(S) / rowsum(exp(S)), overwriting S. One block per row.
__global__ void softmax_kernel(float* __restrict__ S, std::int64_t rows, int Nk) {
  __shared__ float scratch[kWarpSize];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float* row = S + r * Nk;
    float l = 0.0f;
    for (int j = threadIdx.x; j < Nk; j += blockDim.x) l += expf(row[j]);
    l = block_reduce(l, SumOp{}, 0.0f, scratch);
    // A row that sees no key has l = 0; it gets P = 0 (so O = 0), not 0/0.
    const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
    for (int j = threadIdx.x; j < Nk; j += blockDim.x) row[j] = expf(row[j]) * inv_l;
  }
}

}  // namespace

void forward(const Problem& p, const ForwardTensors& t, Stream stream) {
  validate(p);
  float* S = static_cast<float*>(t.workspace);  // [B, H, Nq, Nk], then P in place
  if (!t.Q || !t.K || !t.V || !t.O || !S) throw Error("stage 01: null tensor pointer");
  launch_scores(p, t.Q, t.K, S, stream);
  const std::int64_t rows = p.heads() * p.Nq;
  softmax_kernel<<<static_cast<unsigned>(std::min(rows, kMaxGridX)), kSoftmaxThreads, 0, stream>>>(
      S, rows, static_cast<int>(p.Nk));
  check_launch("stage 01 softmax_kernel");
  launch_pv(p, S, t.V, t.O, stream);
}

}  // namespace flashstep::naive
