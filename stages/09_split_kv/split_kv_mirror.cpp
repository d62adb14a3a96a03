// Stage 09 on the host: the split kernels' loops over (K/V head, row tile,
// split) and K/V tiles, and the merge, in fp32 as the kernels compute (the
// inputs already hold p.dtype's values; O is rounded to it where the kernels
// store it, the partials stay fp32), counting as split_kv_model.cpp states:
// the global-memory elements they move, the shared-memory elements the split
// kernel stages and reads, the FLOPs of S and P V, and every other operation
// one by one. fp32 walks the CUDA-core kernel (Q fp32, K and V, P~ in shared
// memory; m, l and alpha in the registers of the warp that owns the row);
// fp16 and bf16 the tensor-core kernel (each warp's
// key slice with its own m, l and O~, P~ rounded to p.dtype for P~ V, the
// slices merged with the partial-merge rule at the end of the split).
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

// One K/V head's keys and values in the cache, in either layout
// (cache_row, split_kv_plan.h): key j's d elements.
struct HeadRows {
  const float* K;  // the cache, [B, H_kv, Nk, d] or paged [pages, H_kv, page_keys, d]
  const float* V;  // the same layout
  const CacheLayout& layout;
  std::int64_t kvh, H_kv, Nk, d;
  const float* k(std::int64_t key) const { return K + cache_row(layout, kvh, H_kv, Nk, key) * d; }
  const float* v(std::int64_t key) const { return V + cache_row(layout, kvh, H_kv, Nk, key) * d; }
};

// One (K/V head, row tile, split) unit of work: the head's K and V, the
// split's keys [k_lo, k_hi), the tile's rows (their place in Q and O, their
// queries i), the sequence's keys nk, and whether the split writes a partial.
struct Unit {
  HeadRows kv;
  std::int64_t k_lo, k_hi, rows;
  const std::vector<std::int64_t>& row_of;
  const std::vector<std::int64_t>& query;
  std::int64_t nk;
  bool merge;
};

// One non-matmul FLOP: x, counted (common/cost.h).
float op(Cost& c, float x) {
  ++c.nonmatmul_flops;
  return x;
}

// Keys row r of the unit may see: [k_lo, end).
std::vector<std::int64_t> row_ends(const Problem& p, const Unit& u) {
  std::vector<std::int64_t> end(static_cast<size_t>(u.rows));
  for (std::int64_t r = 0; r < u.rows; ++r) {
    end[r] = std::min(u.k_hi, visible_keys(u.query[r], p.Nq, u.nk, p.causal));
  }
  return end;
}

// Algorithm 1's online softmax for one row and one tile of `keys` scores (log2
// units, -inf where the row may not see the key) whose maximum is tile_max:
// P~ into p_ij, the row's m and l moved on. Returns alpha, the factor its O~
// is rescaled by. Both split kernels run it, on their own tiles.
float online_softmax(Cost& c, float& m, float& l, const float* score, float tile_max,
                     std::int64_t keys, float* p_ij) {
  const float m_new = op(c, std::fmax(m, tile_max));
  const float m_use = m_new == -INFINITY ? 0.0f : m_new;
  const float alpha = op(c, std::exp2(op(c, m - m_use)));
  float row_sum = 0.0f;
  for (std::int64_t j = 0; j < keys; ++j) {
    p_ij[j] = op(c, std::exp2(op(c, score[j] - m_use)));
    row_sum = op(c, row_sum + p_ij[j]);
  }
  l = op(c, op(c, l * alpha) + row_sum);
  m = m_new;
  return alpha;
}

// L = (m + log2 l) ln 2 of a row's (m, l), -inf where l = 0 (the row saw no
// key); the arithmetic counts either way (a select is not arithmetic).
float row_lse(Cost& c, float m, float l) {
  const float lse = op(c, op(c, m + op(c, std::log2(l))) * kLn2);
  return l == 0.0f ? -INFINITY : lse;
}

// The CUDA-core split kernel (fp32): 32-key tiles, a warp's rows each with
// one score a lane for the softmax, P~ V from P~ in shared memory. Shared
// memory reads count one per multiply-add operand (the kernel's register
// tiles load each value once for several of them: split_kv_model.cpp).
template <typename OutO, typename OutL>
void cuda_core_unit(const Problem& p, const HostTensors& t, const Unit& u, OutO out_O, OutL out_L,
                    Cost& c) {
  constexpr std::int64_t F = kFloatBytes;
  const std::int64_t d = p.d, E = p.elem_bytes(), rows = u.rows;
  const auto scale_log2 = static_cast<float>(p.softmax_scale() * kLog2e);
  const std::vector<std::int64_t> end = row_ends(p, u);
  c.hbm_read_bytes += rows * d * E;  // the Q rows
  c.sram_write_bytes += rows * d * F;  // ... staged in fp32
  std::vector<float> m(static_cast<size_t>(rows), -INFINITY), l(static_cast<size_t>(rows), 0.0f);
  std::vector<float> acc(static_cast<size_t>(rows * d), 0.0f);
  for (std::int64_t kt = u.k_lo; kt < u.k_hi; kt += kBc) {
    const std::int64_t keys = std::min<std::int64_t>(kBc, u.k_hi - kt);
    c.hbm_read_bytes += 2 * keys * d * E;  // the K and V tiles
    c.sram_write_bytes += 2 * keys * d * E;  // ... staged in p.dtype
    // The tile's keys only: the kernel's lanes past them hold score
    // -inf and P~ 0, which change no max, sum or product.
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* q = t.Q + u.row_of[r] * d;
      float score[kBc];
      float tile_max = -INFINITY;
      for (std::int64_t j = 0; j < keys; ++j) {
        score[j] = -INFINITY;
        if (kt + j < end[r]) {
          float dot = 0.0f;
          const float* k_row = u.kv.k(kt + j);
          for (std::int64_t e = 0; e < d; ++e) dot += q[e] * k_row[e];
          score[j] = op(c, dot * scale_log2);
          c.matmul_flops += 2 * d;
          c.sram_read_bytes += d * (F + E);  // a Q and a K element per multiply-add
        }
        tile_max = op(c, std::fmax(tile_max, score[j]));
      }
      float p_ij[kBc];
      const float alpha = online_softmax(c, m[r], l[r], score, tile_max, keys, p_ij);
      c.sram_write_bytes += keys * F;  // P~ (alpha stays in registers)
      const float* v_row[kBc];
      for (std::int64_t j = 0; j < keys; ++j) v_row[j] = u.kv.v(kt + j);
      for (std::int64_t e = 0; e < d; ++e) {
        float o = op(c, acc[r * d + e] * alpha);
        for (std::int64_t j = 0; j < keys; ++j) o += p_ij[j] * v_row[j][e];
        acc[r * d + e] = o;
      }
      c.matmul_flops += 2 * keys * d;
      c.sram_read_bytes += d * keys * (F + E);  // a P~ and a V element per multiply-add
    }
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    float* O = out_O(r);
    // m and l from the owning warp's registers. The divisions count even
    // where l = 0 selects 0 (as L's, row_lse).
    for (std::int64_t e = 0; e < d; ++e) {
      const float o_div = op(c, acc[r * d + e] / l[r]);
      const float o = l[r] == 0.0f ? 0.0f : o_div;
      O[e] = u.merge ? o : round_to_dtype(p.dtype, o);  // partials stay fp32
    }
    out_L(r) = row_lse(c, m[r], l[r]);
  }
}

// The tensor-core split kernel (fp16, bf16): steps of mma_step_slices slices
// of kWarpKeys keys (one K/V tile of mma_tile_keys keys, or with the narrow
// layout a pair of them), one slice per warp (group); each slice
// keeps its own m, l and O~ for the rows, and its P~ is rounded to p.dtype as
// the A operand of P~ V (l sums the unrounded P~, as the kernel's registers
// do). At the end the slices' (O_w, L_w) are merged with the partial-merge
// rule through shared memory.
//
// With `wide` (the Hopper kernel, split_kv_sm90.cu) one warpgroup holds the
// unit's rows for whole K/V tiles of kWideKeys keys: one slice as wide as
// the tile, Q read from shared memory for every tile (the wgmma's A
// operand), and at the end O = O~ / l and L straight from the registers, no
// slices to merge.
template <typename OutO, typename OutL>
void tensor_core_unit(const Problem& p, const HostTensors& t, const Unit& u, OutO out_O,
                      OutL out_L, Cost& c, bool wide) {
  constexpr std::int64_t F = kFloatBytes;
  const int kD = head_dim_bucket(p.d);
  // Slices per barrier step and the warps that share each (mma_step_slices:
  // with the narrow layout, a pair of tiles' four slices, one warp each).
  const std::int64_t group_rows = p.group() * p.Nq;
  const std::int64_t slices = wide ? 1 : mma_step_slices(kD, group_rows);
  const std::int64_t row_groups = wide ? 1 : mma_step_row_groups(kD, group_rows);
  const std::int64_t slice_keys = wide ? kWideKeys : kWarpKeys;
  const std::int64_t tile_keys = slices * slice_keys;
  const bool q_in_registers = !wide && mma_q_in_registers(kD);
  const std::int64_t d = p.d, E = p.elem_bytes(), rows = u.rows;
  const auto scale_log2 = static_cast<float>(p.softmax_scale() * kLog2e);
  const std::vector<std::int64_t> end = row_ends(p, u);
  c.hbm_read_bytes += rows * d * E;    // the Q rows
  c.sram_write_bytes += rows * d * E;  // ... staged in p.dtype
  const auto n = static_cast<size_t>(slices * rows);
  std::vector<float> m(n, -INFINITY), l(n, 0.0f), acc(n * static_cast<size_t>(d), 0.0f);
  // Q's fragments: each slice's warps read all the rows of Q, once per K/V
  // tile, or once per split where the warps hold them in registers
  // (mma_q_in_registers) and the split has a tile.
  const std::int64_t q_frag_bytes = slices * rows * d * E;
  if (q_in_registers && u.k_hi > u.k_lo) c.sram_read_bytes += q_frag_bytes;
  for (std::int64_t kt = u.k_lo; kt < u.k_hi; kt += tile_keys) {
    const std::int64_t keys = std::min(tile_keys, u.k_hi - kt);
    c.hbm_read_bytes += 2 * keys * d * E;    // the K and V tiles
    c.sram_write_bytes += 2 * keys * d * E;  // ... staged in p.dtype
    // Fragments: Q's (above), and each key of K and V read by the row
    // groups' warps that share its slice.
    if (!q_in_registers) c.sram_read_bytes += q_frag_bytes;
    c.sram_read_bytes += 2 * row_groups * keys * d * E;
    for (std::int64_t w = 0; w < slices; ++w) {
      const std::int64_t k0 = kt + w * slice_keys;
      const std::int64_t wkeys = std::clamp<std::int64_t>(u.k_hi - k0, 0, slice_keys);
      if (wkeys == 0) continue;  // a slice past the split's end: padding only
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t at = w * rows + r;
        const float* q = t.Q + u.row_of[r] * d;
        float score[kWideKeys];  // slice_keys of them
        float tile_max = -INFINITY;
        for (std::int64_t j = 0; j < wkeys; ++j) {
          float dot = 0.0f;
          if (k0 + j < end[r]) {
            const float* k_row = u.kv.k(k0 + j);
            for (std::int64_t e = 0; e < d; ++e) dot += q[e] * k_row[e];
            c.matmul_flops += 2 * d;
          }
          // Every score is scaled, then a key the row may not see is -inf.
          score[j] = op(c, dot * scale_log2);
          if (k0 + j >= end[r]) score[j] = -INFINITY;
          tile_max = op(c, std::fmax(tile_max, score[j]));
        }
        float p_ij[kWideKeys];
        const float alpha = online_softmax(c, m[at], l[at], score, tile_max, wkeys, p_ij);
        const float* v_row[kWideKeys];
        for (std::int64_t j = 0; j < wkeys; ++j) v_row[j] = u.kv.v(k0 + j);
        for (std::int64_t e = 0; e < d; ++e) {
          float o = op(c, acc[at * d + e] * alpha);
          for (std::int64_t j = 0; j < wkeys; ++j) {
            o += round_to_dtype(p.dtype, p_ij[j]) * v_row[j][e];
          }
          acc[at * d + e] = o;
        }
        c.matmul_flops += 2 * wkeys * d;
      }
    }
  }
  if (wide) {  // O = O~ / l and L from the registers (counted even where l = 0)
    for (std::int64_t r = 0; r < rows; ++r) {
      const float inv_div = op(c, 1.0f / l[r]);
      const float inv = l[r] == 0.0f ? 0.0f : inv_div;
      float* O = out_O(r);
      for (std::int64_t e = 0; e < d; ++e) {
        const float o = op(c, acc[r * d + e] * inv);
        O[e] = u.merge ? o : round_to_dtype(p.dtype, o);  // partials stay fp32
      }
      out_L(r) = row_lse(c, m[r], l[r]);
    }
    return;
  }
  // Each slice's partial per row: 1/l, O_w = O~ / l, L_w = (m + log2 l) ln 2,
  // into shared memory (counted even where l = 0 selects 0 and -inf).
  std::vector<float> L_w(n);
  for (std::int64_t at = 0; at < slices * rows; ++at) {
    const float inv_div = op(c, 1.0f / l[at]);
    const float inv = l[at] == 0.0f ? 0.0f : inv_div;
    for (std::int64_t e = 0; e < d; ++e) acc[at * d + e] = op(c, acc[at * d + e] * inv);
    L_w[at] = row_lse(c, m[at], l[at]);
    c.sram_write_bytes += (d + 1) * F;
  }
  // The merge kernel's rule over the slices, per row.
  for (std::int64_t r = 0; r < rows; ++r) {
    float L = -INFINITY;
    std::vector<float> weight(static_cast<size_t>(slices));
    for (std::int64_t w = 0; w < slices; ++w) {
      L = lse_merge(L, L_w[w * rows + r]);
      c.nonmatmul_flops += kLseMergeFlops;
    }
    for (std::int64_t w = 0; w < slices; ++w) {
      weight[w] = partial_weight(L_w[w * rows + r], L);
      c.nonmatmul_flops += kPartialWeightFlops;
    }
    c.sram_read_bytes += 2 * slices * F;         // L_w, for L and for the weights
    c.sram_write_bytes += (slices + 1) * F;      // the weights and L
    float* O = out_O(r);
    for (std::int64_t e = 0; e < d; ++e) {
      float o = 0.0f;
      for (std::int64_t w = 0; w < slices; ++w) o = op(c, o + op(c, weight[w] * acc[(w * rows + r) * d + e]));
      O[e] = u.merge ? o : round_to_dtype(p.dtype, o);  // partials stay fp32
    }
    c.sram_read_bytes += (2 * slices * d + 1) * F;  // a weight and an O_w element per term; L
    out_L(r) = L;
  }
}

// The new tokens' keys and values (K_new, V_new: [B, H_kv, Nq, d]) written
// into the cache at keys seqlens[b] .. seqlens[b] + Nq - 1 of each sequence,
// those past the capacity left out, as the append kernel does; counted.
void append(const Problem& p, const HostKvCache& cache, Cost& c) {
  const std::int64_t d = p.d;
  for (std::int64_t kvh = 0; kvh < p.B * p.kv_heads(); ++kvh) {
    const std::int64_t first = cache.seqlens[kvh / p.kv_heads()];
    for (std::int64_t i = 0; i < p.Nq; ++i) {
      const std::int64_t key = first + i;
      if (key < 0 || key >= p.Nk) continue;
      const std::int64_t to = cache_row(cache.layout, kvh, p.kv_heads(), p.Nk, key) * d;
      const std::int64_t from = (kvh * p.Nq + i) * d;
      std::copy(cache.K_new + from, cache.K_new + from + d, cache.K + to);
      std::copy(cache.V_new + from, cache.V_new + from + d, cache.V + to);
      c.hbm_read_bytes += 2 * d * p.elem_bytes();
      c.hbm_write_bytes += 2 * d * p.elem_bytes();
    }
  }
}

// What the split kernels read: the cache in its layout, each sequence's keys
// before the call (seqlens null: Nk each), and the keys appended since
// (new_keys, 0 or Nq), which the attention sees too.
struct CacheView {
  const float* K;
  const float* V;
  const std::int64_t* seqlens;
  CacheLayout layout;
  std::int64_t new_keys;
};

// The split kernels' loops and the merge over the cache `kv`.
Cost run(const Problem& p, const HostTensors& t, const CacheView& cache, const Plan& plan) {
  validate(p);
  const std::int64_t* seqlens = cache.seqlens;
  const std::int64_t d = p.d;
  const std::int64_t heads = p.heads();
  const std::int64_t rows_total = heads * p.Nq;
  const bool merge = plan.splits > 1;
  // The partials, as the workspace holds them: [splits, B*H, Nq, d] and [splits, B*H, Nq].
  std::vector<float> O_part(merge ? static_cast<size_t>(plan.splits * p.q_elems()) : 0);
  std::vector<float> L_part(merge ? static_cast<size_t>(plan.splits * rows_total) : 0);
  Cost c;
  constexpr std::int64_t F = kFloatBytes;  // L and the partials
  const std::int64_t E = p.elem_bytes();   // O

  for (std::int64_t kvh = 0; kvh < p.B * p.kv_heads(); ++kvh) {
    const std::int64_t b = kvh / p.kv_heads();
    const std::int64_t nk =
        seqlens ? std::clamp<std::int64_t>(seqlens[b] + cache.new_keys, 0, p.Nk) : p.Nk;
    const HeadRows kv{cache.K, cache.V, cache.layout, kvh, p.kv_heads(), p.Nk, d};
    for (std::int64_t tile = 0; tile < plan.row_tiles; ++tile) {
      const std::int64_t r0 = tile * plan.tile_rows;
      const std::int64_t rows = std::min<std::int64_t>(plan.tile_rows, plan.group_rows - r0);
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
        // Where the unit's rows go: the partial of split s, or O and L.
        auto out_O = [&](std::int64_t r) {
          return merge ? O_part.data() + (s * rows_total + row_of[r]) * d : t.O + row_of[r] * d;
        };
        auto out_L = [&](std::int64_t r) -> float& {
          return merge ? L_part[s * rows_total + row_of[r]] : t.L[row_of[r]];
        };
        const Unit u{kv, k_lo, k_hi, rows, row_of, query, nk, merge};
        if (p.dtype == DType::kFp32) {
          cuda_core_unit(p, t, u, out_O, out_L, c);
        } else {
          tensor_core_unit(p, t, u, out_O, out_L, c, plan.tile_rows == kWideRows);
        }
        c.hbm_write_bytes += merge ? rows * (d + 1) * F : rows * (d * E + F);  // O_s, L_s or O, L
      }
    }
  }
  if (merge) {
    const int row_warps = merge_warps(plan.splits, head_dim_bucket(p.d));
    const std::int64_t run = merge_run(plan.splits, row_warps);
    for (std::int64_t row = 0; row < rows_total; ++row) {
      // L as the merge kernel's warp finds it: lane l merges splits l, l + 32,
      // ..., then the lanes merge theirs in a butterfly (lse_merge is
      // symmetric, so every lane ends with the same L).
      float lane_L[kMergeLanes];
      for (int l = 0; l < kMergeLanes; ++l) {
        lane_L[l] = -INFINITY;
        for (std::int64_t s = l; s < plan.splits; s += kMergeLanes) {
          lane_L[l] = lse_merge(lane_L[l], L_part[s * rows_total + row]);
          c.nonmatmul_flops += kLseMergeFlops;
        }
      }
      for (int offset = kMergeLanes / 2; offset > 0; offset /= 2) {
        float next[kMergeLanes];
        for (int l = 0; l < kMergeLanes; ++l) next[l] = lse_merge(lane_L[l], lane_L[l ^ offset]);
        std::copy(next, next + kMergeLanes, lane_L);
        c.nonmatmul_flops += offset * kLseMergeFlops;  // distinct merges: pairs agree
      }
      const float L = lane_L[0];
      std::vector<float> w(static_cast<size_t>(plan.splits));  // each split's weight, once
      for (std::int64_t s = 0; s < plan.splits; ++s) {
        w[s] = partial_weight(L_part[s * rows_total + row], L);
        c.nonmatmul_flops += kPartialWeightFlops;
      }
      // Each of the row's merge warps sums its run of the splits in order;
      // the first warp then adds the others' sums in warp order.
      for (std::int64_t e = 0; e < d; ++e) {
        float o = 0.0f;
        for (int v = 0; v < row_warps; ++v) {
          float run_sum = 0.0f;
          for (std::int64_t s = v * run; s < std::min((v + 1) * run, plan.splits); ++s) {
            run_sum = op(c, run_sum + op(c, w[s] * O_part[(s * rows_total + row) * d + e]));
          }
          o = v == 0 ? run_sum : op(c, o + run_sum);
        }
        t.O[row * d + e] = round_to_dtype(p.dtype, o);
      }
      c.sram_write_bytes += (row_warps - 1) * d * F;  // the other warps' sums, through shared memory
      c.sram_read_bytes += (row_warps - 1) * d * F;
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
  return run(p, t, {t.K, t.V, nullptr, {}, 0}, make_plan(p, kModelSmCount, true, false, model_wide(p)));
}

Cost mirror_one_block(const Problem& p, const HostTensors& t) {
  return run(p, t, {t.K, t.V, nullptr, {}, 0},
             make_plan(p, kModelSmCount, false, false, model_wide(p)));
}

Cost mirror_kvcache(const Problem& p, const HostTensors& t, const std::int64_t* cache_seqlens,
                    int sm_count, bool split) {
  if (!cache_seqlens) throw Error("stage 09: null cache_seqlens");
  return run(p, t, {t.K, t.V, cache_seqlens, {}, 0},
             make_plan(p, sm_count, split, false, model_wide(p)));
}

Cost mirror_kvcache(const Problem& p, const HostTensors& t, const HostKvCache& cache,
                    int sm_count, bool split) {
  validate_kvcache(p, t.K, t.V, cache.K, cache.V, cache.seqlens, cache.layout, cache.K_new,
                   cache.V_new);
  Cost appended;
  if (cache.K_new) append(p, cache, appended);
  Cost c = run(p, t, {cache.K, cache.V, cache.seqlens, cache.layout, cache.K_new ? p.Nq : 0},
               make_plan(p, sm_count, split, cache.layout.block_table != nullptr, model_wide(p)));
  c.hbm_read_bytes += appended.hbm_read_bytes;
  c.hbm_write_bytes += appended.hbm_write_bytes;
  return c;
}

}  // namespace flashstep::split_kv
