// Kernels 1 (S = scale Q K^T) and 3 (O = P V) of standard attention: the two
// matrix products that stages 01 and 02 run around their softmax kernels; and
// gemm_kernel, the same tiling with either operand transposed, for the four
// products of stage 02's backward. Textbook shared-memory tiling, one output
// element per thread: the point of these stages is the N x N traffic, not the
// GEMM. Kernels 1 and 3 read and write Q, K, V, P and O in the problem's
// element type and compute in fp32 (S is always fp32); the GEMMs are fp32.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda_check.h"
#include "element.cuh"
#include "naive_matmul.h"

namespace flashstep {

namespace {

constexpr int kTile = kNaiveTile;
// One padding column makes a column walk of a tile hit 32 different banks.
constexpr int kPad = 1;
// Grid y and z are limited to 65535; larger extents are walked in strides.
constexpr unsigned kMaxGridYZ = 65535;
// Grid x is limited to 2^31 - 1; gemm_kernel puts the column tiles there.
constexpr std::int64_t kMaxGridX = 2147483647;

// S [BH, Nq, Nk] = scale * Q [BH, Nq, d] * K^T [BH, d, Nk], masked to -inf.
// Q and K in Elem, widened as they are staged; S in fp32.
template <typename Elem>
__global__ void scores_kernel(const Elem* __restrict__ Q, const Elem* __restrict__ K,
                              float* __restrict__ S, int BH, int Nq, int Nk, int d,
                              float scale, bool causal) {
  __shared__ float Qs[kTile][kTile + kPad];  // Qs[r][k] = Q[i0 + r][k0 + k]
  __shared__ float Ks[kTile][kTile + kPad];  // Ks[c][k] = K[j0 + c][k0 + k]
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int j = blockIdx.x * kTile + tx;
  for (int bh = blockIdx.z; bh < BH; bh += gridDim.z) {
    for (int i0 = blockIdx.y * kTile; i0 < Nq; i0 += gridDim.y * kTile) {
      const int i = i0 + ty;
      const Elem* Qh = Q + static_cast<std::int64_t>(bh) * Nq * d;
      const Elem* Kh = K + static_cast<std::int64_t>(bh) * Nk * d;
      const int j0 = blockIdx.x * kTile;
      float acc = 0.0f;
      for (int k0 = 0; k0 < d; k0 += kTile) {
        const int k = k0 + tx;
        // Only elements inside the matrices are loaded; the rest are zero.
        const std::int64_t q_row = static_cast<std::int64_t>(i) * d;
        const std::int64_t k_row = static_cast<std::int64_t>(j0 + ty) * d;
        Qs[ty][tx] = (i < Nq && k < d) ? to_float(Qh[q_row + k]) : 0.0f;
        Ks[ty][tx] = (j0 + ty < Nk && k < d) ? to_float(Kh[k_row + k]) : 0.0f;
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

// O [BH, Nq, d] = P [BH, Nq, Nk] * V [BH, Nk, d], all three in Elem,
// accumulated in fp32 and rounded once as O is stored.
template <typename Elem>
__global__ void pv_kernel(const Elem* __restrict__ P, const Elem* __restrict__ V,
                          Elem* __restrict__ O, int BH, int Nq, int Nk, int d) {
  __shared__ float Ps[kTile][kTile + kPad];  // Ps[r][c] = P[i0 + r][j0 + c]
  __shared__ float Vs[kTile][kTile + kPad];  // Vs[r][c] = V[j0 + r][c0 + c]
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * kTile + tx;
  for (int bh = blockIdx.z; bh < BH; bh += gridDim.z) {
    for (int i0 = blockIdx.y * kTile; i0 < Nq; i0 += gridDim.y * kTile) {
      const int i = i0 + ty;
      const Elem* Ph = P + static_cast<std::int64_t>(bh) * Nq * Nk;
      const Elem* Vh = V + static_cast<std::int64_t>(bh) * Nk * d;
      float acc = 0.0f;
      for (int j0 = 0; j0 < Nk; j0 += kTile) {
        const std::int64_t p_row = static_cast<std::int64_t>(i) * Nk;
        const std::int64_t v_row = static_cast<std::int64_t>(j0 + ty) * d;
        Ps[ty][tx] = (i < Nq && j0 + tx < Nk) ? to_float(Ph[p_row + j0 + tx]) : 0.0f;
        Vs[ty][tx] = (j0 + ty < Nk && c < d) ? to_float(Vh[v_row + c]) : 0.0f;
        __syncthreads();
        if (i < Nq && c < d) {
          const int jmax = min(kTile, Nk - j0);
          for (int jj = 0; jj < jmax; ++jj) acc += Ps[ty][jj] * Vs[jj][tx];
        }
        __syncthreads();
      }
      if (i < Nq && c < d) {
        O[(static_cast<std::int64_t>(bh) * Nq + i) * d + c] = from_float<Elem>(acc);
      }
    }
  }
}

// C [batch, M, N] = alpha * op(A) [M, K] op(B) [K, N], one element of C per
// thread; thread (ty, tx) of block (x, y) owns C[m0 + ty][n0 + tx]. A is
// stored [batch, K, M] when TransposeA, else [batch, M, K]; B is stored
// [batch, N, K] when TransposeB, else [batch, K, N]. Sizes and offsets are
// 64-bit: M * K alone can pass 2^31 (an N x N matrix of P or dS).
template <bool TransposeA, bool TransposeB>
__global__ void gemm_kernel(const float* __restrict__ A, const float* __restrict__ B,
                            float* __restrict__ C, std::int64_t batch, std::int64_t M,
                            std::int64_t N, std::int64_t K, float alpha) {
  __shared__ float As[kTile][kTile + kPad];  // As[r][k] = op(A)[m0 + r][k0 + k]
  __shared__ float Bs[kTile][kTile + kPad];  // Bs[k][c] = op(B)[k0 + k][n0 + c]
  const int tx = threadIdx.x, ty = threadIdx.y;
  const std::int64_t n0 = std::int64_t{blockIdx.x} * kTile;
  const std::int64_t n = n0 + tx;
  for (std::int64_t h = blockIdx.z; h < batch; h += gridDim.z) {
    const float* Ah = A + h * M * K;  // [M, K], or [K, M] when TransposeA
    const float* Bh = B + h * K * N;  // [K, N], or [N, K] when TransposeB
    float* Ch = C + h * M * N;        // [M, N]
    for (std::int64_t m0 = std::int64_t{blockIdx.y} * kTile; m0 < M;
         m0 += std::int64_t{gridDim.y} * kTile) {
      const std::int64_t m = m0 + ty;
      float acc = 0.0f;
      for (std::int64_t k0 = 0; k0 < K; k0 += kTile) {
        // Every load walks memory with tx, so a warp reads one 128-byte row
        // segment however the operand is stored. A transposed operand lands
        // in its tile transposed: a column walk, which kPad keeps free of bank
        // conflicts. Elements outside the matrices are zero.
        if constexpr (TransposeA) {
          const std::int64_t k = k0 + ty, m_load = m0 + tx;  // A[k][m_load] = op(A)[m_load][k]
          As[tx][ty] = (k < K && m_load < M) ? Ah[k * M + m_load] : 0.0f;
        } else {
          const std::int64_t k = k0 + tx;
          As[ty][tx] = (m < M && k < K) ? Ah[m * K + k] : 0.0f;
        }
        if constexpr (TransposeB) {
          const std::int64_t n_load = n0 + ty, k = k0 + tx;  // B[n_load][k] = op(B)[k][n_load]
          Bs[tx][ty] = (n_load < N && k < K) ? Bh[n_load * K + k] : 0.0f;
        } else {
          const std::int64_t k = k0 + ty;
          Bs[ty][tx] = (k < K && n < N) ? Bh[k * N + n] : 0.0f;
        }
        __syncthreads();
        if (m < M && n < N) {
          const int kmax = K - k0 < kTile ? static_cast<int>(K - k0) : kTile;
          for (int kk = 0; kk < kmax; ++kk) acc += As[ty][kk] * Bs[kk][tx];
        }
        __syncthreads();  // the next chunk overwrites the tiles
      }
      if (m < M && n < N) Ch[m * N + n] = alpha == 1.0f ? acc : alpha * acc;
    }
  }
}

unsigned tiles(std::int64_t n) { return static_cast<unsigned>((n + kTile - 1) / kTile); }

template <bool TransposeA, bool TransposeB>
void launch_gemm_as(const Gemm& g, const float* A, const float* B, float* C, Stream stream) {
  const dim3 block(kTile, kTile);
  const std::int64_t row_tiles = (g.M + kTile - 1) / kTile;  // may pass 2^32 before the cap
  const dim3 grid(tiles(g.N), static_cast<unsigned>(std::min<std::int64_t>(row_tiles, kMaxGridYZ)),
                  static_cast<unsigned>(std::min<std::int64_t>(g.batch, kMaxGridYZ)));
  gemm_kernel<TransposeA, TransposeB>
      <<<grid, block, 0, stream>>>(A, B, C, g.batch, g.M, g.N, g.K, g.alpha);
  check_launch("gemm_kernel");
}

}  // namespace

void launch_scores(const Problem& p, const void* Q, const void* K, float* S, Stream stream) {
  const dim3 block(kTile, kTile);
  const dim3 grid(tiles(p.Nk), std::min(tiles(p.Nq), kMaxGridYZ),
                  static_cast<unsigned>(std::min<std::int64_t>(p.heads(), kMaxGridYZ)));
  with_element_type(p.dtype, [&](auto elem) {
    using Elem = decltype(elem);
    scores_kernel<Elem><<<grid, block, 0, stream>>>(
        static_cast<const Elem*>(Q), static_cast<const Elem*>(K), S, static_cast<int>(p.heads()),
        static_cast<int>(p.Nq), static_cast<int>(p.Nk), static_cast<int>(p.d),
        static_cast<float>(p.softmax_scale()), p.causal);
  });
  check_launch("scores_kernel");
}

void launch_pv(const Problem& p, const void* P, const void* V, void* O, Stream stream) {
  const dim3 block(kTile, kTile);
  const dim3 grid(tiles(p.d), std::min(tiles(p.Nq), kMaxGridYZ),
                  static_cast<unsigned>(std::min<std::int64_t>(p.heads(), kMaxGridYZ)));
  with_element_type(p.dtype, [&](auto elem) {
    using Elem = decltype(elem);
    pv_kernel<Elem><<<grid, block, 0, stream>>>(
        static_cast<const Elem*>(P), static_cast<const Elem*>(V), static_cast<Elem*>(O),
        static_cast<int>(p.heads()), static_cast<int>(p.Nq), static_cast<int>(p.Nk),
        static_cast<int>(p.d));
  });
  check_launch("pv_kernel");
}

void launch_gemm(const Gemm& g, const float* A, const float* B, float* C, Stream stream) {
  if (g.batch < 1 || g.M < 1 || g.N < 1 || g.K < 1) {
    throw Error("launch_gemm: batch, M, N and K must be >= 1");
  }
  if ((g.N + kTile - 1) / kTile > kMaxGridX) {
    throw Error("launch_gemm: N = " + std::to_string(g.N) +
                " needs more column tiles than grid x holds");
  }
  if (g.transpose_A) {
    if (g.transpose_B) launch_gemm_as<true, true>(g, A, B, C, stream);
    else launch_gemm_as<true, false>(g, A, B, C, stream);
  } else {
    if (g.transpose_B) launch_gemm_as<false, true>(g, A, B, C, stream);
    else launch_gemm_as<false, false>(g, A, B, C, stream);
  }
}

}  // namespace flashstep
