// Stage 02's backward: standard attention's, as autograd runs it. The forward
// left P [B, H, Nq, Nk] in its workspace, as autograd saves it; the backward
// reads it from HBM and writes an N x N matrix of its own, dP, then dS over it.
// Only D departs from autograd (which sums dP o P over Nk): rowsum(dO o O) is
// the same number from d terms, and spares the dS kernel a second pass.
//
//   D  = rowsum(dO o O)                                (common/row_dot.cu)
//   dV = P^T dO                                        (common/naive_matmul.cu)
//   dP = dO V^T                  -> HBM                (common/naive_matmul.cu)
//   dS = P o (dP - D)            -> HBM, over dP       (this file)
//   dQ = scale dS K,  dK = scale dS^T Q                (common/naive_matmul.cu)
//
// Causal masking needs no code here: P is 0 where the mask hides a key (and on
// a row that sees none), so dS is 0 there and adds nothing to dQ or dK.
// FlashAttention's backward (stage 05) recomputes P tile by tile from Q, K
// and L instead, and never writes P, dP or dS.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/cuda_check.h"
#include "common/naive_matmul.h"
#include "common/row_dot.h"
#include "safe_softmax.h"

namespace flashstep::safe_softmax {

namespace {

// dS [rows, Nk] = P [rows, Nk] o (dP [rows, Nk] - D [rows]), over dP in place.
// One block per row, as the softmax kernel: D_r is loaded once per row.
__global__ void ds_kernel(const float* __restrict__ P, float* __restrict__ dS,
                          const float* __restrict__ D, std::int64_t rows, int Nk) {
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* P_r = P + r * Nk;  // [Nk]
    float* dS_r = dS + r * Nk;      // [Nk]: dP_r in, dS_r out
    const float D_r = D[r];         // the same address for every thread: one cached load
    for (int j = threadIdx.x; j < Nk; j += blockDim.x) dS_r[j] = P_r[j] * (dS_r[j] - D_r);
  }
}

}  // namespace

void backward(const Problem& p, const BackwardTensors& t, Stream stream) {
  validate(p);
  const float* P = static_cast<const float*>(t.saved);  // [B, H, Nq, Nk], the forward's softmax
  float* dS = static_cast<float*>(t.workspace);          // [B, H, Nq, Nk]: dP, then dS in place
  if (!t.Q || !t.K || !t.V || !t.O || !t.dO || !t.dQ || !t.dK || !t.dV || !P || !dS) {
    throw Error("stage 02 backward: null tensor pointer");
  }
  float* D = reinterpret_cast<float*>(static_cast<char*>(t.workspace) +
                                      backward_D_offset(p));  // [B, H, Nq]
  // fp32 only (backward_dtypes): every tensor is float.
  const auto* Q = static_cast<const float*>(t.Q);    // [B, H, Nq, d]
  const auto* K = static_cast<const float*>(t.K);    // [B, H, Nk, d]
  const auto* V = static_cast<const float*>(t.V);    // [B, H, Nk, d]
  const auto* O = static_cast<const float*>(t.O);    // [B, H, Nq, d]
  const auto* dO = static_cast<const float*>(t.dO);  // [B, H, Nq, d]
  const BackwardGemms g = backward_gemms(p);
  launch_row_dot(p, dO, O, D, stream);
  launch_gemm(g.dV, P, dO, static_cast<float*>(t.dV), stream);
  launch_gemm(g.dP, dO, V, dS, stream);
  const std::int64_t rows = p.heads() * p.Nq;
  ds_kernel<<<static_cast<unsigned>(std::min(rows, kDsMaxBlocks)), kDsThreads, 0, stream>>>(
      P, dS, D, rows, static_cast<int>(p.Nk));
  check_launch("stage 02 backward ds_kernel");
  launch_gemm(g.dQ, dS, K, static_cast<float*>(t.dQ), stream);
  launch_gemm(g.dK, dS, Q, static_cast<float*>(t.dK), stream);
}

}  // namespace flashstep::safe_softmax
