// Stage 02: three-kernel attention with the safe softmax.
//
//   kernel 1  S = scale * Q K^T                       -> HBM  (common/naive_matmul.cu)
//   kernel 2  m = rowmax(S), l = rowsum(exp(S - m)),
//             P = exp(S - m) / l  -> HBM in place,  L = m + log(l)  (this file)
//   kernel 3  O = P V                                 -> HBM  (common/naive_matmul.cu)
//
// What changed since stage 01: kernel 2 subtracts the row max before exp, so
// every exponent is <= 0 and nothing overflows, and it writes the logsumexp L
// that the backward pass needs. The price is one more pass over S.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/cuda_check.h"
#include "common/naive_matmul.h"
#include "common/reduce.cuh"
#include "safe_softmax.h"

namespace flashstep::safe_softmax {

namespace {

// Grid x is limited to 2^31 - 1 blocks; longer row counts are walked in strides.
constexpr std::int64_t kMaxGridX = 2147483647;

// P [rows, Nk] = softmax(S) over each row, overwriting S; L [rows] = logsumexp.
// One block per row, three passes: max, sum, normalise.
__global__ void softmax_kernel(float* __restrict__ S, float* __restrict__ L, std::int64_t rows,
                               int Nk) {
  __shared__ float scratch[kWarpSize];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    // BEGIN ASSIGNMENT: the safe softmax of row r in place: m = rowmax (block_reduce with MaxOp), l = sum exp(S - m), P = exp(S - m) / l, and L[r] = m + log(l); a row that sees no key (m = -inf) gives P = 0, L = -inf
    float* row = S + r * Nk;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < Nk; j += blockDim.x) m = fmaxf(m, row[j]);
    m = block_reduce(m, MaxOp{}, -INFINITY, scratch);
    // A row that sees no key has m = -inf; subtracting 0 instead keeps
    // exp(-inf - m) = 0 rather than exp(NaN), and l = 0 marks the row.
    const float m_safe = m == -INFINITY ? 0.0f : m;
    float l = 0.0f;
    for (int j = threadIdx.x; j < Nk; j += blockDim.x) l += expf(row[j] - m_safe);
    l = block_reduce(l, SumOp{}, 0.0f, scratch);
    const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
    for (int j = threadIdx.x; j < Nk; j += blockDim.x) row[j] = expf(row[j] - m_safe) * inv_l;
    if (threadIdx.x == 0) L[r] = l > 0.0f ? m + logf(l) : -INFINITY;
    // END ASSIGNMENT
  }
}

}  // namespace

void forward(const Problem& p, const ForwardTensors& t, Stream stream) {
  validate(p);
  float* S = static_cast<float*>(t.workspace);  // [B, H, Nq, Nk], then P in place
  if (!t.Q || !t.K || !t.V || !t.O || !t.L || !S) throw Error("stage 02: null tensor pointer");
  launch_scores(p, t.Q, t.K, S, stream);
  const std::int64_t rows = p.heads() * p.Nq;
  softmax_kernel<<<static_cast<unsigned>(std::min(rows, kMaxGridX)), kSoftmaxThreads, 0, stream>>>(
      S, t.L, rows, static_cast<int>(p.Nk));
  check_launch("stage 02 softmax_kernel");
  launch_pv(p, S, t.V, t.O, stream);
}

}  // namespace flashstep::safe_softmax
