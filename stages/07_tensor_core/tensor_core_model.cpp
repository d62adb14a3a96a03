// Stage 07's closed-form model and registry entries (host only).
//
// FlashAttention-2's work (common/fa2_model.cpp states the counting
// conventions) on the step's tiles (tensor_core_tiles.h), in the problem's
// element type: Q, K, V and O elements are 2 bytes, L stays 4. Valid elements
// only, as there: the kernel's zero padding is not counted. For one head,
// summed over Q blocks i of R_i valid rows that visit n_i K/V tiles holding
// C_i = min(n_i Bc, Nk) keys (0 when n_i = 0):
// - HBM: Qi read once, even by a block that visits no K/V tile (the kernel
//   loads it first); Kj and Vj once per visited (i, j); O_i and L_i written
//   once.
// - SRAM writes: Qi, Kj, Vj (R_i d + 2 C_i d elements); O_i staged through
//   shared memory on its way out (R_i d); steps 1-3 also P~ (R_i C_i).
// - SRAM reads, as the warps load fragments: each of the W warps reads its
//   own rows of Qi and ALL of Kj and Vj once per visited tile, so Qi costs
//   R_i d per tile and Kj, Vj cost W C d each. More rows per warp (fewer
//   warps for the same Br) is what makes a tile's K and V fragments serve
//   more rows. Plus P~ read back (steps 1-3) and O_i copied out.
// - A negative scale runs as |scale| on -Qi, its sign flipped in shared
//   memory: one more read and write of Qi's R_i d elements, in every Q block
//   in steps 1-2 (they flip Qi as soon as it is in) and in the blocks that
//   visit a K/V tile from step 3 (they flip it once it arrives with the
//   first Kj).
// - FLOPs: 4 R_i C_i d matmul. Non-matmul ones once per row, as the algorithm
//   states them (the 4 lanes of a quad that share a row each repeat its max
//   and rescale factor, and split its l in four: parallel bookkeeping, not
//   counted). Per score: max, the FFMA S scale - m (2), exp2, add to the row
//   sum. Per row and visited tile: the row max of the raw scores times the
//   scale, e^(m_old - m_new) (subtract, exp2), l's rescale, and O~'s d
//   rescales (counted even where the kernel skips them because no row of a
//   warp moved its max). Per row at the end, in every Q block: 1/l, d
//   multiplies, and L = (m + log2 l) ln 2 (3).
#include <algorithm>
#include <utility>

#include "tensor_core.h"

namespace flashstep::tensor_core {

namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Bytes of L's elements: fp32 whatever the inputs' type.
constexpr std::int64_t kLseBytes = 4;
// Non-matmul FLOPs per score (max, the FFMA's multiply and add, exp2, add to
// the row sum), per row and visited tile besides the d rescales (scale the
// raw max, subtract, exp2, l * alpha), and per row at the end besides the d
// divisions (1/l, log2, add, times ln 2).
constexpr std::int64_t kFlopsPerScore = 5;
constexpr std::int64_t kFlopsPerRowTile = 4;
constexpr std::int64_t kFlopsPerRowEnd = 4;

}  // namespace

std::int64_t workspace_bytes(const Problem&) { return 0; }

template <Step kStep>
Cost model(const Problem& p) {
  const TileShape shape = tile_shape(head_dim_bucket(p.d), kStep);
  const std::int64_t e = dtype_bytes(p.dtype);
  const std::int64_t d = p.d;
  const std::int64_t Tr = ceil_div(p.Nq, shape.br);
  const std::int64_t Tc = ceil_div(p.Nk, shape.bc);
  const bool p_in_smem = kStep < Step::kPInRegisters;
  const bool negate_q = p.softmax_scale() < 0.0;
  Cost head;
  for (std::int64_t i = 0; i < Tr; ++i) {
    const std::int64_t R = std::min<std::int64_t>(shape.br, p.Nq - i * shape.br);
    const std::int64_t n = ceil_div(p.visible_keys(i * shape.br + R - 1), shape.bc);
    const std::int64_t C = std::min(n * shape.bc, p.Nk);
    head.skipped_tiles += Tc - n;
    const std::int64_t qi = R * d * e;      // bytes of Qi, and of O_i
    const std::int64_t kv = 2 * C * d * e;  // of Kj and Vj over the visited tiles
    const std::int64_t p_tilde = p_in_smem ? R * C * e : 0;
    const std::int64_t q_flip = negate_q && (kStep < Step::kCpAsync || n > 0) ? qi : 0;
    head.hbm_read_bytes += qi + kv;
    head.hbm_write_bytes += qi + R * kLseBytes;  // O_i and L_i (0 and -inf if n = 0)
    // Qi, Kj, Vj and P~ in; O_i staged; the sign flip.
    head.sram_write_bytes += qi + kv + p_tilde + qi + q_flip;
    // Qi's fragments per tile, Kj's and Vj's per warp, P~; O_i copied out; the flip.
    head.sram_read_bytes += n * qi + shape.warps * kv + p_tilde + qi + q_flip;
    head.matmul_flops += 4 * R * C * d;
    head.nonmatmul_flops += kFlopsPerScore * R * C + n * R * (kFlopsPerRowTile + d) +
                            R * (d + kFlopsPerRowEnd);
  }
  Cost c = head.times(p.heads());
  c.thread_blocks = Tr * std::min(p.heads(), kMaxGridY);
  return c;
}

}  // namespace flashstep::tensor_core

namespace flashstep {

namespace {

using tensor_core::Step;

template <Step kStep>
Stage entry(std::string_view name, std::string_view title, std::vector<DType> dtypes) {
  Stage s;
  s.name = name;
  s.title = title;
  s.writes_lse = true;
  s.forward = tensor_core::forward<kStep>;
  s.workspace_bytes = tensor_core::workspace_bytes;
  s.model = tensor_core::model<kStep>;
  s.mirror = tensor_core::mirror<kStep>;
  s.grouped_heads = true;  // K/V of head bh at kv_head_of(bh, H, H_kv): an index
  s.dtypes = std::move(dtypes);
  s.backward_dtypes = {};  // the ablation steps: forward only
  return s;
}

// The stage with one of its two backwards.
template <bool kAtomicDQ>
Stage with_backward(std::string_view name, std::string_view title) {
  Stage s = entry<Step::kTunedTiles>(name, title, {DType::kBf16, DType::kFp16});
  s.backward = tensor_core::backward<kAtomicDQ>;
  s.backward_workspace_bytes = kAtomicDQ ? tensor_core::backward_workspace_bytes
                                         : tensor_core::deterministic_backward_workspace_bytes;
  s.backward_model = tensor_core::backward_model<kAtomicDQ>;
  s.backward_dtypes = {DType::kBf16, DType::kFp16};
  s.grouped_backward = true;  // a group's query heads stream past one dK_j, dV_j block
  return s;
}

}  // namespace

std::vector<Stage> stages_07_tensor_core() {
  // The ablation steps run bf16 only: they are about how the tensor cores
  // are fed, which the type does not change. The stage itself runs both.
  const std::vector<DType> bf16 = {DType::kBf16};
  return {
      entry<Step::kPlainMma>("07_step1_plain_mma", "tensor cores: plain mma.sync", bf16),
      entry<Step::kLdmatrix>("07_step2_ldmatrix", "+ ldmatrix, swizzled shared memory", bf16),
      entry<Step::kCpAsync>("07_step3_cp_async", "+ cp.async pipeline", bf16),
      entry<Step::kPInRegisters>("07_step4_p_in_registers", "+ P~ in registers", bf16),
      with_backward<true>("07_tensor_core", "FlashAttention-2 on tensor cores, tuned tiles"),
      with_backward<false>("07_tensor_core_deterministic",
                           "the same, dQ without atomics (deterministic backward)"),
  };
}

}  // namespace flashstep
