// Stage 09 on the host: the split kernel's loops over (K/V head, row tile,
// split) and K/V tiles, and the merge, in fp32 as the kernels compute (the
// inputs already hold p.dtype's values; O is rounded to it where the kernels
// store it, the partials stay fp32), counting as split_kv_model.cpp states:
// the global-memory elements they move, the shared-memory elements the split
// kernel stages and reads (Q fp32, K and V in p.dtype, P~, alpha, m and l
// fp32), the FLOPs of S and P V, and every other operation one by one.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/error.h"
#include "common/partial_merge.h"
#include "common/rounding.h"
#include "split_kv.h"

namespace flashstep::split_kv {

namespace {

constexpr double kLog2e = 1.4426950408889634;
constexpr float kLn2 = 0.6931471805599453f;

Cost run(const Problem& p, const HostTensors& t, const std::int64_t* seqlens, const Plan& plan) {
  validate(p);
  const std::int64_t d = p.d;
  const std::int64_t heads = p.heads();
  const std::int64_t rows_total = heads * p.Nq;
  const auto scale_log2 = static_cast<float>(p.softmax_scale() * kLog2e);
  const bool merge = plan.splits > 1;
  // The partials, as the workspace holds them: [splits, B*H, Nq, d] and [splits, B*H, Nq].
  std::vector<float> O_part(merge ? static_cast<size_t>(plan.splits * p.q_elems()) : 0);
  std::vector<float> L_part(merge ? static_cast<size_t>(plan.splits * rows_total) : 0);
  Cost c;
  constexpr std::int64_t F = kFloatBytes;  // L, the partials, and Q, P~, alpha, m, l on chip
  const std::int64_t E = p.elem_bytes();   // Q, K, V and O; K and V on chip
  // One non-matmul FLOP: x, counted (common/cost.h).
  auto op = [&c](float x) {
    ++c.nonmatmul_flops;
    return x;
  };

  for (std::int64_t kvh = 0; kvh < p.B * p.kv_heads(); ++kvh) {
    const std::int64_t b = kvh / p.kv_heads();
    const std::int64_t nk = seqlens ? std::clamp<std::int64_t>(seqlens[b], 0, p.Nk) : p.Nk;
    const float* K = t.K + kvh * p.Nk * d;  // [Nk, d] of this K/V head
    const float* V = t.V + kvh * p.Nk * d;
    for (std::int64_t tile = 0; tile < plan.row_tiles; ++tile) {
      const std::int64_t r0 = tile * kRows;
      const std::int64_t rows = std::min<std::int64_t>(kRows, plan.group_rows - r0);
      // The tile's query rows: their place in Q, O and L, and their queries i.
      std::vector<std::int64_t> row_of(static_cast<size_t>(rows)), query(static_cast<size_t>(rows));
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t rr = r0 + r;
        query[r] = rr % p.Nq;
        row_of[r] = query_head(kvh, rr / p.Nq, p.H, p.kv_heads()) * p.Nq + query[r];
      }
      for (std::int64_t s = 0; s < plan.splits; ++s) {
        const std::int64_t k_lo = s * plan.keys_per_split;
        const std::int64_t k_hi = std::min(k_lo + plan.keys_per_split, nk);
        c.hbm_read_bytes += rows * d * E;  // the Q rows
        c.sram_write_bytes += rows * d * F;  // ... staged in fp32
        std::vector<float> m(static_cast<size_t>(rows), -INFINITY), l(static_cast<size_t>(rows), 0.0f);
        std::vector<float> acc(static_cast<size_t>(rows * d), 0.0f);
        std::vector<std::int64_t> end(static_cast<size_t>(rows));
        for (std::int64_t r = 0; r < rows; ++r) {
          end[r] = std::min(k_hi, visible_keys(query[r], p.Nq, nk, p.causal));
        }
        for (std::int64_t kt = k_lo; kt < k_hi; kt += kBc) {
          const std::int64_t keys = std::min<std::int64_t>(kBc, k_hi - kt);
          c.hbm_read_bytes += 2 * keys * d * E;  // the K and V tiles
          c.sram_write_bytes += 2 * keys * d * E;  // ... staged in p.dtype
          // The tile's keys only: the kernel's lanes past them hold score
          // -inf and P~ 0, which change no max, sum or product.
          for (std::int64_t r = 0; r < rows; ++r) {
            const float* q = t.Q + row_of[r] * d;
            float score[kBc];
            float tile_max = -INFINITY;
            for (std::int64_t j = 0; j < keys; ++j) {
              score[j] = -INFINITY;
              if (kt + j < end[r]) {
                float dot = 0.0f;
                for (std::int64_t e = 0; e < d; ++e) dot += q[e] * K[(kt + j) * d + e];
                score[j] = op(dot * scale_log2);
                c.matmul_flops += 2 * d;
                c.sram_read_bytes += d * (F + E);  // a Q and a K element per multiply-add
              }
              tile_max = op(std::fmax(tile_max, score[j]));
            }
            const float m_new = op(std::fmax(m[r], tile_max));
            const float m_use = m_new == -INFINITY ? 0.0f : m_new;
            const float alpha = op(std::exp2(op(m[r] - m_use)));
            float p_ij[kBc];
            float row_sum = 0.0f;
            for (std::int64_t j = 0; j < keys; ++j) {
              p_ij[j] = op(std::exp2(op(score[j] - m_use)));
              row_sum = op(row_sum + p_ij[j]);
            }
            c.sram_write_bytes += (keys + 1) * F;  // P~ and alpha (one lane)
            l[r] = op(op(l[r] * alpha) + row_sum);
            m[r] = m_new;
            for (std::int64_t e = 0; e < d; ++e) {
              float o = op(acc[r * d + e] * alpha);
              for (std::int64_t j = 0; j < keys; ++j) o += p_ij[j] * V[(kt + j) * d + e];
              acc[r * d + e] = o;
            }
            c.matmul_flops += 2 * keys * d;
            // alpha per element, then a P~ and a V element per multiply-add
            c.sram_read_bytes += d * (F + keys * (F + E));
          }
        }
        for (std::int64_t r = 0; r < rows; ++r) {
          float* O = merge ? O_part.data() + (s * rows_total + row_of[r]) * d : t.O + row_of[r] * d;
          float& L = merge ? L_part[s * rows_total + row_of[r]] : t.L[row_of[r]];
          // m and l through shared memory; l read once per element of O.
          // The divisions and L's log2, add and multiply count even where
          // l = 0 selects 0 and -inf (a select is not arithmetic).
          c.sram_write_bytes += 2 * F;
          c.sram_read_bytes += (d + 2) * F;
          for (std::int64_t e = 0; e < d; ++e) {
            const float o_div = op(acc[r * d + e] / l[r]);
            const float o = l[r] == 0.0f ? 0.0f : o_div;
            O[e] = merge ? o : round_to_dtype(p.dtype, o);  // partials stay fp32
          }
          const float lse = op(op(m[r] + op(std::log2(l[r]))) * kLn2);
          L = l[r] == 0.0f ? -INFINITY : lse;
        }
        c.hbm_write_bytes += merge ? rows * (d + 1) * F : rows * (d * E + F);  // O_s, L_s or O, L
      }
    }
  }
  if (merge) {
    for (std::int64_t row = 0; row < rows_total; ++row) {
      float L = -INFINITY;
      for (std::int64_t s = 0; s < plan.splits; ++s) {
        L = lse_merge(L, L_part[s * rows_total + row]);
        c.nonmatmul_flops += kLseMergeFlops;
      }
      for (std::int64_t e = 0; e < d; ++e) {
        float o = 0.0f;
        for (std::int64_t s = 0; s < plan.splits; ++s) {
          // The weight again for every element, as the merge kernel's lanes do.
          const float w = partial_weight(L_part[s * rows_total + row], L);
          c.nonmatmul_flops += kPartialWeightFlops;
          o = op(o + op(w * O_part[(s * rows_total + row) * d + e]));
        }
        t.O[row * d + e] = round_to_dtype(p.dtype, o);
      }
      t.L[row] = L;
    }
    c.hbm_read_bytes += plan.splits * rows_total * (d + 1) * F;
    c.hbm_write_bytes += rows_total * (d * E + F);
  }
  c.thread_blocks = thread_blocks(p, plan);
  return c;
}

}  // namespace

Cost mirror(const Problem& p, const HostTensors& t) {
  return run(p, t, nullptr, make_plan(p, kModelSmCount));
}

Cost mirror_one_block(const Problem& p, const HostTensors& t) {
  return run(p, t, nullptr, make_plan(p, kModelSmCount, false));
}

Cost mirror_kvcache(const Problem& p, const HostTensors& t, const std::int64_t* cache_seqlens,
                    int sm_count, bool split) {
  if (!cache_seqlens) throw Error("stage 09: null cache_seqlens");
  return run(p, t, cache_seqlens, make_plan(p, sm_count, split));
}

}  // namespace flashstep::split_kv
