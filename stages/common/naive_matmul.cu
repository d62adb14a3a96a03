// Kernels 1 (S = scale Q K^T) and 3 (O = P V) of standard attention: the two
// matrix products that stages 01 and 02 run around their softmax kernels.
// Textbook shared-memory tiling, one output element per thread: the point of
// these stages is the N x N traffic, not the GEMM.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda_check.h"
#include "naive_matmul.h"

namespace flashstep {

namespace {

constexpr int kTile = kNaiveTile;
// One padding column makes a column walk of a tile hit 32 different banks.
constexpr int kPad = 1;
// Grid y and z are limited to 65535; larger extents are walked in strides.
constexpr unsigned kMaxGridYZ = 65535;

// S [BH, Nq, Nk] = scale * Q [BH, Nq, d] * K^T [BH, d, Nk], masked to -inf.
__global__ void scores_kernel(const float* __restrict__ Q, const float* __restrict__ K,
                              float* __restrict__ S, int BH, int Nq, int Nk, int d,
                              float scale, bool causal) {
  __shared__ float Qs[kTile][kTile + kPad];  // Qs[r][k] = Q[i0 + r][k0 + k]
  __shared__ float Ks[kTile][kTile + kPad];  // Ks[c][k] = K[j0 + c][k0 + k]
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int j = blockIdx.x * kTile + tx;
  for (int bh = blockIdx.z; bh < BH; bh += gridDim.z) {
    for (int i0 = blockIdx.y * kTile; i0 < Nq; i0 += gridDim.y * kTile) {
      const int i = i0 + ty;
      const float* Qh = Q + static_cast<std::int64_t>(bh) * Nq * d;
      const float* Kh = K + static_cast<std::int64_t>(bh) * Nk * d;
      const int j0 = blockIdx.x * kTile;
      float acc = 0.0f;
      for (int k0 = 0; k0 < d; k0 += kTile) {
        const int k = k0 + tx;
        // Only elements inside the matrices are loaded; the rest are zero.
        Qs[ty][tx] = (i < Nq && k < d) ? Qh[static_cast<std::int64_t>(i) * d + k] : 0.0f;
        Ks[ty][tx] = (j0 + ty < Nk && k < d) ? Kh[static_cast<std::int64_t>(j0 + ty) * d + k] : 0.0f;
        __syncthreads();
        if (i < Nq && j < Nk) {
          const int kmax = min(kTile, d - k0);
          for (int kk = 0; kk < kmax; ++kk) acc += Qs[ty][kk] * Ks[tx][kk];
        }
        __syncthreads();  // the next chunk overwrites the tiles
      }
      if (i < Nq && j < Nk) {
        const bool visible = !causal || static_cast<std::int64_t>(j) <= static_cast<std::int64_t>(i) + Nk - Nq;
        S[(static_cast<std::int64_t>(bh) * Nq + i) * Nk + j] = visible ? acc * scale : -INFINITY;
      }
    }
  }
}

// O [BH, Nq, d] = P [BH, Nq, Nk] * V [BH, Nk, d].
__global__ void pv_kernel(const float* __restrict__ P, const float* __restrict__ V,
                          float* __restrict__ O, int BH, int Nq, int Nk, int d) {
  __shared__ float Ps[kTile][kTile + kPad];  // Ps[r][c] = P[i0 + r][j0 + c]
  __shared__ float Vs[kTile][kTile + kPad];  // Vs[r][c] = V[j0 + r][c0 + c]
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * kTile + tx;
  for (int bh = blockIdx.z; bh < BH; bh += gridDim.z) {
    for (int i0 = blockIdx.y * kTile; i0 < Nq; i0 += gridDim.y * kTile) {
      const int i = i0 + ty;
      const float* Ph = P + static_cast<std::int64_t>(bh) * Nq * Nk;
      const float* Vh = V + static_cast<std::int64_t>(bh) * Nk * d;
      float acc = 0.0f;
      for (int j0 = 0; j0 < Nk; j0 += kTile) {
        Ps[ty][tx] = (i < Nq && j0 + tx < Nk) ? Ph[static_cast<std::int64_t>(i) * Nk + j0 + tx] : 0.0f;
        Vs[ty][tx] = (j0 + ty < Nk && c < d) ? Vh[static_cast<std::int64_t>(j0 + ty) * d + c] : 0.0f;
        __syncthreads();
        if (i < Nq && c < d) {
          const int jmax = min(kTile, Nk - j0);
          for (int jj = 0; jj < jmax; ++jj) acc += Ps[ty][jj] * Vs[jj][tx];
        }
        __syncthreads();
      }
      if (i < Nq && c < d) O[(static_cast<std::int64_t>(bh) * Nq + i) * d + c] = acc;
    }
  }
}

unsigned tiles(std::int64_t n) { return static_cast<unsigned>((n + kTile - 1) / kTile); }

}  // namespace

void launch_scores(const Problem& p, const float* Q, const float* K, float* S, Stream stream) {
  const dim3 block(kTile, kTile);
  const dim3 grid(tiles(p.Nk), std::min(tiles(p.Nq), kMaxGridYZ),
                  static_cast<unsigned>(std::min<std::int64_t>(p.heads(), kMaxGridYZ)));
  scores_kernel<<<grid, block, 0, stream>>>(Q, K, S, static_cast<int>(p.heads()),
                                            static_cast<int>(p.Nq), static_cast<int>(p.Nk),
                                            static_cast<int>(p.d),
                                            static_cast<float>(p.softmax_scale()), p.causal);
  check_launch("scores_kernel");
}

void launch_pv(const Problem& p, const float* P, const float* V, float* O, Stream stream) {
  const dim3 block(kTile, kTile);
  const dim3 grid(tiles(p.d), std::min(tiles(p.Nq), kMaxGridYZ),
                  static_cast<unsigned>(std::min<std::int64_t>(p.heads(), kMaxGridYZ)));
  pv_kernel<<<grid, block, 0, stream>>>(P, V, O, static_cast<int>(p.heads()),
                                        static_cast<int>(p.Nq), static_cast<int>(p.Nk),
                                        static_cast<int>(p.d));
  check_launch("pv_kernel");
}

}  // namespace flashstep
