// Stage 02: three-kernel attention with the safe softmax.
//
//   kernel 1  S = scale * Q K^T                       -> HBM  (common/naive_matmul.cu)
//   kernel 2  m = rowmax(S), l = rowsum(exp(S - m)),
//             P = exp(S - m) / l  -> HBM,  L = m + log(l)   (this file)
//   kernel 3  O = P V                                 -> HBM  (common/naive_matmul.cu)
//
// What changed since stage 01: kernel 2 subtracts the row max before exp, so
// every exponent is <= 0 and nothing overflows, and it writes the logsumexp L
// that the backward pass needs. The price is one more pass over S.
//
// Element types: Q, K, V, O and P are in the problem's type (fp32, fp16 or
// bf16) and every sum is fp32. S stays fp32 in every type: with S rounded to
// bf16 a logit near 100 would be off by 0.25 and its P by 25%; kept in fp32,
// this stage computes in 16 bits exactly the naive attention the low-precision
// check measures every stage against (common/check.h), and as PyTorch's math
// backend does by default. P is rounded to the type before P V, as standard
// attention in half precision does: in fp32 it overwrites S in place (as in
// stage 01), in fp16 and bf16 it has its own array after S.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/cuda_check.h"
#include "common/element.cuh"
#include "common/naive_matmul.h"
#include "common/reduce.cuh"
#include "safe_softmax.h"

namespace flashstep::safe_softmax {

namespace {

// Grid x is limited to 2^31 - 1 blocks; longer row counts are walked in strides.
constexpr std::int64_t kMaxGridX = 2147483647;

// P [rows, Nk] = softmax(S [rows, Nk]) over each row, rounded to Elem;
// L [rows] = logsumexp. One block per row, three passes: max, sum, normalise.
// In fp32, P is S itself (each element is read before it is overwritten by
// the same thread), so neither pointer is __restrict__.
template <typename Elem>
__global__ void softmax_kernel(const float* S, Elem* P, float* __restrict__ L, std::int64_t rows,
                               int Nk) {
  __shared__ float scratch[kWarpSize];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    // BEGIN ASSIGNMENT: the safe softmax of row r: m = rowmax (block_reduce with MaxOp), l = sum exp(S - m), P = exp(S - m) / l (from_float<Elem> rounds it to P's type), and L[r] = m + log(l); a row that sees no key (m = -inf) gives P = 0, L = -inf
    const float* row = S + r * Nk;  // [Nk], fp32
    Elem* P_r = P + r * Nk;         // [Nk]
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
    for (int j = threadIdx.x; j < Nk; j += blockDim.x) {
      P_r[j] = from_float<Elem>(expf(row[j] - m_safe) * inv_l);
    }
    if (threadIdx.x == 0) L[r] = l > 0.0f ? m + logf(l) : -INFINITY;
    // END ASSIGNMENT
  }
}

}  // namespace

void forward(const Problem& p, const ForwardTensors& t, Stream stream) {
  validate(p);
  if (!t.Q || !t.K || !t.V || !t.O || !t.L || !t.workspace) {
    throw Error("stage 02: null tensor pointer");
  }
  float* S = static_cast<float*>(t.workspace);                          // [B, H, Nq, Nk]
  void* P = static_cast<char*>(t.workspace) + probabilities_offset(p);  // [B, H, Nq, Nk], p.dtype
  launch_scores(p, t.Q, t.K, S, stream);
  const std::int64_t rows = p.heads() * p.Nq;
  with_element_type(p.dtype, [&](auto elem) {
    using Elem = decltype(elem);
    softmax_kernel<Elem>
        <<<static_cast<unsigned>(std::min(rows, kMaxGridX)), kSoftmaxThreads, 0, stream>>>(
            S, static_cast<Elem*>(P), t.L, rows, static_cast<int>(p.Nk));
  });
  check_launch("stage 02 softmax_kernel");
  launch_pv(p, P, t.V, t.O, stream);
}

}  // namespace flashstep::safe_softmax
