// Stage 06's closed-form models and registry entries (host only).
//
// Both variants do FlashAttention-2's work (common/fa2_model.cpp states the
// counting conventions) on their own tiles: Br x Bc = 128 x 64 (split-Q,
// d <= 128), 64 x 32 (split-Q, d = 256), 32 x 32 (split-K). For one head,
// summed over Q blocks i of R_i valid rows that visit n_i K/V tiles holding
// C_i = min(n_i Bc, Nk) keys (n_i < Tc only when causal skips tiles):
// - HBM: Qi read once (if n_i > 0), Kj and Vj once per visited (i, j); O and L
//   written once. Valid elements only.
// - SRAM writes: Qi, Kj, Vj (R_i d + 2 C_i d), P~ once per computed score.
//   SRAM reads: two operands per multiply-add of Qi Kj^T and P~ Vj.
// - Barriers: block-wide __syncthreads executed per thread block.
// - Mask tests: the scores of each computed tile that its rows do not all see
//   whole (common/tile_mask.h): split-Q classifies a warp's rows (R_w of
//   warp_rows), split-K the whole Q block.
//
// Split-Q counts per warp slice: warp w owns R_w valid rows whose last row sees
// n_w <= n_i tiles (C_w keys); it computes only those (the other tiles it only
// helps load). So scores, P~, shared reads and FLOPs are sums of R_w C_w terms.
// Barriers: 2 per visited tile (Vj published, next Kj published), less the one
// after the last tile: 1 + n_i + (n_i - 1) = 2 n_i.
//
// Split-K adds the per-tile combine (W = 4 warps, R = R_i rows), per visited tile:
//   SRAM writes: m_w, l_w (2 W R); m_i, l_i (2 R); alpha, beta_w ((1 + W) R);
//                partial P~ V (W R d); O~_i (R d)
//   SRAM reads:  m_w, l_w (2 W R); m_i, l_i (2 R); alpha and beta_w per
//                element ((1 + W) R d); partial P~ V (W R d); O~_i (R d)
//   FLOPs:       per row max over W partial maxima (W), alpha (2), beta_w
//                (2 W), l_i (1 + 2 W): 3 + 5 W; per element of O~_i,
//                alpha O~ + sum_w beta_w part_w (1 + 2 W), in place of
//                FA2's per-row rescale (3 + d)
// and per Q block: O~_i, m_i, l_i initialised (R d + 2 R writes), at the end
// 1/l_i and L_i from m_i, l_i (2 R reads, R writes), O_i = O~_i (1/l_i)
// (2 R d reads). Barriers: 1 after the prologue, per tile 1 after the
// partial m_w, l_w plus 2 per 32-column chunk of O~ (partials written, partials
// added), 1 before the end: 2 + n_i (1 + 2 D / 32), D the head-dimension
// bucket (64, 128 or 256).
#include <algorithm>

#include "common/tile_mask.h"
#include "warp_split.h"
#include "warp_split_tiles.h"

namespace flashstep::warp_split {

namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// K/V tiles of bc keys that query row `row` sees.
std::int64_t tiles_seen(const Problem& p, std::int64_t row, std::int64_t bc) {
  return ceil_div(p.visible_keys(row), bc);
}

// One head's counts scaled by B * H, and the launch's thread blocks: Tr Q
// blocks along x, heads (capped) along y.
Cost all_heads(const Problem& p, const Cost& head, std::int64_t Tr) {
  Cost c = head.times(p.heads());
  c.thread_blocks = Tr * std::min(p.heads(), kMaxGridY);
  return c;
}

}  // namespace

std::int64_t workspace_bytes(const Problem&) { return 0; }

Cost model_split_q(const Problem& p) {
  const SplitQShape tiles = split_q_shape(head_dim_bucket(p.d));
  const MaskShape mask{p.Nq, p.Nk, p.causal};
  const std::int64_t d = p.d;
  const std::int64_t Br = tiles.br();
  const std::int64_t Bc = tiles.bc;
  const std::int64_t Tr = ceil_div(p.Nq, Br);
  const std::int64_t Tc = ceil_div(p.Nk, Bc);
  Cost head;
  for (std::int64_t i = 0; i < Tr; ++i) {
    const std::int64_t row0 = i * Br;
    const std::int64_t R = std::min(Br, p.Nq - row0);
    const std::int64_t n = tiles_seen(p, row0 + R - 1, Bc);
    head.skipped_tiles += Tc - n;
    // O_i and L_i (0 and -inf if n = 0)
    head.hbm_write_bytes += R * (d * p.elem_bytes() + kFloatBytes);
    if (n == 0) continue;
    const std::int64_t C = std::min(n * Bc, p.Nk);
    head.hbm_read_bytes += (R + 2 * C) * d * p.elem_bytes();
    head.sram_write_bytes += (R + 2 * C) * d * kFloatBytes;
    head.barriers += 2 * n;
    for (std::int64_t w0 = row0; w0 < row0 + R; w0 += tiles.warp_rows) {
      const std::int64_t Rw = std::min<std::int64_t>(tiles.warp_rows, row0 + R - w0);
      const std::int64_t nw = tiles_seen(p, w0 + Rw - 1, Bc);
      if (nw == 0) continue;  // O = 0, L = -inf, nothing computed
      const std::int64_t Cw = std::min(nw * Bc, p.Nk);
      head.sram_write_bytes += Rw * Cw * kFloatBytes;      // P~
      head.sram_read_bytes += 4 * Rw * Cw * d * kFloatBytes;  // 2 operands x 2 products
      head.matmul_flops += 4 * Rw * Cw * d;
      head.nonmatmul_flops += 5 * Rw * Cw + nw * Rw * (3 + d) + Rw * (d + 4);
      head.mask_tests += Rw * (Cw - unmasked_kv_tiles(mask, w0, tiles.warp_rows, Bc) * Bc);
    }
  }
  return all_heads(p, head, Tr);
}

Cost model_split_k(const Problem& p) {
  const MaskShape mask{p.Nq, p.Nk, p.causal};
  const std::int64_t d = p.d;
  const std::int64_t W = kSplitKWarps;
  const std::int64_t Br = kSplitKBr;
  const std::int64_t Bc = kSplitKBc;
  const std::int64_t chunks = split_k_chunks(head_dim_bucket(p.d));
  const std::int64_t Tr = ceil_div(p.Nq, Br);
  const std::int64_t Tc = ceil_div(p.Nk, Bc);
  Cost head;
  for (std::int64_t i = 0; i < Tr; ++i) {
    const std::int64_t R = std::min(Br, p.Nq - i * Br);
    const std::int64_t n = tiles_seen(p, i * Br + R - 1, Bc);
    head.skipped_tiles += Tc - n;
    head.hbm_write_bytes += R * (d * p.elem_bytes() + kFloatBytes);
    if (n == 0) continue;
    const std::int64_t C = std::min(n * Bc, p.Nk);
    head.hbm_read_bytes += (R + 2 * C) * d * p.elem_bytes();
    // FlashAttention-2's share, as split-Q without warp skipping.
    std::int64_t writes = (R + 2 * C) * d + R * C;
    std::int64_t reads = 4 * R * C * d;
    head.matmul_flops += 4 * R * C * d;
    head.nonmatmul_flops += 5 * R * C + R * (d + 4);
    head.mask_tests += R * (C - unmasked_kv_tiles(mask, i * Br, Br, Bc) * Bc);
    // The combine, per visited tile (above), and once per Q block.
    writes += n * (2 * W * R + 2 * R + (1 + W) * R + W * R * d + R * d);
    reads += n * (2 * W * R + 2 * R + (1 + W) * R * d + W * R * d + R * d);
    head.nonmatmul_flops += n * (R * (3 + 5 * W) + R * d * (1 + 2 * W));
    writes += R * d + 2 * R + R;
    reads += 2 * R + 2 * R * d;
    head.sram_write_bytes += writes * kFloatBytes;
    head.sram_read_bytes += reads * kFloatBytes;
    head.barriers += 2 + n * (1 + 2 * chunks);
  }
  Cost c = all_heads(p, head, Tr);
  // Beyond 65535 heads a thread block walks several: one more barrier per extra head.
  c.barriers += Tr * (p.heads() - std::min(p.heads(), kMaxGridY));
  return c;
}

}  // namespace flashstep::warp_split

namespace flashstep {

std::vector<Stage> stages_06_warp_split() {
  // No mirrors: both run Algorithm 1 as stage 04 does, whose mirror checks its
  // loops and counts; only the split of the work between warps differs.
  Stage q;
  q.name = "06_warp_split_q";
  q.title = "FlashAttention-2, split-Q: warps own rows";
  q.writes_lse = true;
  q.forward = warp_split::forward_split_q;
  q.workspace_bytes = warp_split::workspace_bytes;
  q.model = warp_split::model_split_q;
  q.mirror = nullptr;
  q.grouped_heads = true;  // K/V of head bh at kv_head_of(bh, H, H_kv): an index
  Stage k = q;
  k.name = "06_warp_split_k";
  k.title = "FlashAttention-1's split-K: warps own keys";
  k.forward = warp_split::forward_split_k;
  k.model = warp_split::model_split_k;
  return {q, k};
}

}  // namespace flashstep
