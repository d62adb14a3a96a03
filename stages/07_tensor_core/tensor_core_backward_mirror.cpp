// Stage 07's backward on the host (tensor_core.h, backward_mirror): the
// kernels' tiles and loops (one K/V block of Bc keys at a time, the passes
// of q_block rows (one Q block of kBr, or two at d = 64) of every query head
// of its group streaming past from the first Q block that sees it, dK_j and
// dV_j summed over the group before their one rounding, dQ summed in fp32
// across K/V blocks as the atomics sum it), their mask (the same functions,
// tensor_core_backward_tiles.h) and their numerics in p.dtype, so
// that the low-precision rule (common/check.h) can be checked on the CPU
// against what the GPU will compute. Sums run in a fixed order here; the
// tensor cores' order differs only by fp32 rounding (and the atomic
// kernel, at d = 256, adds a Q block's dQ one pass of its loop later,
// from a second dS tile: the same terms, in whatever order the atomics
// land). The (dK, dV) kernels' 2-D warp tiles at d = 128 round P^T and dS^T
// to p.dtype in shared memory where the 1-D ones round them in registers:
// the same roundings of the same values, as here. (At d = 64 the atomic
// kernel has 2-D tiles too.)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/rounding.h"
#include "tensor_core.h"
#include "tensor_core_backward_tiles.h"

namespace flashstep::tensor_core {

void backward_mirror(const Problem& p, const HostBackwardTensors& t) {
  const DType type = p.dtype;
  const auto d = static_cast<std::size_t>(p.d);
  const auto scale = static_cast<float>(p.softmax_scale());
  const auto scale_log2 = static_cast<float>(p.softmax_scale() * kLog2e);
  // The atomic (dK, dV) kernel's Bc. The deterministic one's may be smaller
  // (64 at d = 64): the blocks only group the keys, and every sum below runs
  // in the same order either way.
  const int Bc = bwd::block_keys(head_dim_bucket(p.d), true);
  // And its passes' rows (q_block), from a Q block's first row: the tiles
  // whose corners the mask is tested from.
  const int Br = bwd::q_block(head_dim_bucket(p.d), true);
  const std::int64_t G = p.group();
  const auto row_elems = static_cast<std::size_t>(p.Nq) * d;
  for (std::int64_t kv = 0; kv < p.B * p.kv_heads(); ++kv) {
    const float* K = t.K + kv * p.Nk * p.d;  // [Nk, d]
    const float* V = t.V + kv * p.Nk * p.d;  // [Nk, d]
    const std::int64_t bh0 = kv * G;  // the group's query heads: bh0 .. bh0 + G - 1
    // The pre-pass, per query head of the group: D, L in log2 units (+inf
    // for a row that sees no key).
    std::vector<float> D(static_cast<std::size_t>(G * p.Nq)), L_log2(D.size());
    for (std::int64_t r = 0; r < G * p.Nq; ++r) {
      const float* dO = t.dO + (bh0 * p.Nq + r) * p.d;  // [d]
      const float* O = t.O + (bh0 * p.Nq + r) * p.d;    // [d]
      float sum = 0.0f;
      for (std::size_t k = 0; k < d; ++k) sum += dO[k] * O[k];
      D[r] = sum;
      const float L = t.L[bh0 * p.Nq + r];
      L_log2[r] = L == -INFINITY ? INFINITY : L * static_cast<float>(kLog2e);
    }
    std::vector<float> dQ_accum(static_cast<std::size_t>(G) * row_elems, 0.0f);
    for (std::int64_t key0 = 0; key0 < p.Nk; key0 += Bc) {
      const auto keys = static_cast<int>(std::min<std::int64_t>(Bc, p.Nk - key0));
      std::vector<float> dK(static_cast<std::size_t>(keys) * d, 0.0f), dV(dK.size(), 0.0f);
      const std::int64_t row_first = bwd::first_row(key0, p.Nq, p.Nk, p.causal);
      // The kernel's (query head, Q block) pairs: every head of the group
      // adds to the one dK_j, dV_j.
      for (std::int64_t m = 0; m < G; ++m) {
        const float* Q = t.Q + (bh0 + m) * p.Nq * p.d;    // [Nq, d]
        const float* dO = t.dO + (bh0 + m) * p.Nq * p.d;  // [Nq, d]
        const float* Dm = D.data() + m * p.Nq;            // [Nq]
        const float* Lm = L_log2.data() + m * p.Nq;       // [Nq]
        float* dQm = dQ_accum.data() + m * p.Nq * p.d;    // [Nq, d]
        for (std::int64_t q0 = row_first / bwd::kBr * bwd::kBr; q0 < p.Nq; q0 += Br) {
          // The kernel's mask, pair by pair (a masked pair has P = 0 there).
          const int diag = bwd::tile_diag(static_cast<int>(q0), static_cast<int>(key0),
                                          static_cast<int>(p.Nq), static_cast<int>(p.Nk));
          const bool whole = bwd::whole_tile(keys, Bc, p.causal, diag);
          for (int q = 0; q < Br && q0 + q < p.Nq; ++q) {
            const std::int64_t i = q0 + q;
            for (int key = 0; key < keys; ++key) {
              if (!whole && !bwd::visible(key, q, keys, p.causal, diag)) continue;
              const std::int64_t j = key0 + key;
              float S = 0.0f, dP = 0.0f;
              for (std::size_t k = 0; k < d; ++k) {
                S += Q[i * p.d + k] * K[j * p.d + k];
                dP += dO[i * p.d + k] * V[j * p.d + k];
              }
              const float P = std::exp2(std::fma(S, scale_log2, -Lm[i]));
              const float P16 = round_to_dtype(type, P);
              const float dS16 = round_to_dtype(type, P * (dP - Dm[i]));
              for (std::size_t k = 0; k < d; ++k) {
                dV[key * d + k] += P16 * dO[i * p.d + k];
                dK[key * d + k] += dS16 * Q[i * p.d + k];
                dQm[i * p.d + k] += dS16 * K[j * p.d + k];
              }
            }
          }
        }
      }
      for (std::size_t e = 0; e < dK.size(); ++e) {
        t.dK[(kv * p.Nk + key0) * p.d + e] = round_to_dtype(type, scale * dK[e]);
        t.dV[(kv * p.Nk + key0) * p.d + e] = round_to_dtype(type, dV[e]);
      }
    }
    for (std::size_t e = 0; e < dQ_accum.size(); ++e) {
      t.dQ[bh0 * p.Nq * p.d + e] = round_to_dtype(type, scale * dQ_accum[e]);
    }
  }
}

}  // namespace flashstep::tensor_core
