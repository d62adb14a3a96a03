// Stage 08's closed-form model and registry entries (host only).
//
// FlashAttention-2's work (common/fa2_model.cpp states the counting
// conventions) on this stage's tiles (hopper_tiles.h: blocks of Br = 64
// rows per consumer warpgroup, one in steps 1-2 and two from step 3, three
// at d <= 64;
// Bc = key_tile(d bucket): 128 keys at d <= 128, 64 at d = 256), in
// 16-bit elements (L stays 4 bytes); valid elements only. For one head,
// summed over Q blocks i of R_i valid rows that visit n_i K/V tiles holding
// C_i = min(n_i Bc, Nk) keys, and over their consumer warpgroups w of R_iw
// valid rows, which compute on n_iw <= n_i of those tiles (C_iw keys): at
// d = 64 from step 3 the tiles their own last row sees (skip_tiles hands the
// rest over unread: consumers_skip_tiles), else all n_i:
// - HBM: Qi read once, even by a block that visits no K/V tile; Kj and Vj
//   once per visited (i, j); O_i and L_i written once, O_i straight from the
//   registers in steps 1-2 and at d = 256, else through shared memory
//   (output_through_smem).
// - SRAM writes: Qi, Kj, Vj (by the threads in step 1, by TMA in step 2:
//   the same bytes), and O_i where it goes through shared memory (read once
//   from there by the TMA store: one more SRAM read of it).
// - SRAM reads, as wgmma makes them: each consumer warpgroup's chain reads
//   its rows of Qi (the A operand of S = Qi Kj^T) once per tile it computes
//   on, and Kj and Vj (the B operands) once, for all four of its warps
//   together (a warpgroup whose rows all lie past Nq computes nothing:
//   pass_tiles).
//   Stage 07 read Kj and Vj once per warp: a warpgroup's B operand serves 64
//   rows, not 16. P~ is the A operand in registers and costs nothing.
// - A negative scale is wgmma's imm-scale-a = -1: no extra traffic.
// - FLOPs as stage 07 counts them, per consumer: 4 R_iw C_iw d matmul; per
//   score 5, per row and computed tile 4 + d (O~'s rescale counted even
//   where skipped), per row at the end 4 + d.
#include <algorithm>
#include <utility>

#include "common/error.h"
#include "hopper.h"

namespace flashstep::hopper {

namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

constexpr std::int64_t kLseBytes = 4;
constexpr std::int64_t kFlopsPerScore = 5;
constexpr std::int64_t kFlopsPerRowTile = 4;
constexpr std::int64_t kFlopsPerRowEnd = 4;

}  // namespace

std::int64_t workspace_bytes(const Problem&) { return 0; }

template <Step kStep>
Cost model(const Problem& p) {
  const std::int64_t e = dtype_bytes(p.dtype);
  const std::int64_t d = p.d;
  const std::int64_t consumers = consumer_warpgroups(kStep, head_dim_bucket(p.d));
  const std::int64_t Br = consumers * kBr;
  const std::int64_t Bc = key_tile(head_dim_bucket(d));
  const std::int64_t Tr = ceil_div(p.Nq, Br);
  const std::int64_t Tc = ceil_div(p.Nk, Bc);
  const bool o_smem = output_through_smem(kStep, head_dim_bucket(d));
  const bool skip_tiles = consumers_skip_tiles(kStep, head_dim_bucket(d));
  Cost head;
  for (std::int64_t i = 0; i < Tr; ++i) {
    const std::int64_t R = std::min<std::int64_t>(Br, p.Nq - i * Br);
    const std::int64_t n = ceil_div(p.visible_keys(i * Br + R - 1), Bc);
    const std::int64_t C = std::min(n * Bc, p.Nk);
    head.skipped_tiles += Tc - n;
    const std::int64_t qi = R * d * e;      // bytes of Qi, and of O_i
    const std::int64_t kv = 2 * C * d * e;  // of Kj and Vj over the visited tiles
    head.hbm_read_bytes += qi + kv;
    head.hbm_write_bytes += qi + R * kLseBytes;
    head.sram_write_bytes += qi + kv + (o_smem ? qi : 0);
    head.sram_read_bytes += o_smem ? qi : 0;
    // Each consumer with rows of its own, on the tiles its last row sees
    // (skip_tiles) or on the block's.
    for (std::int64_t r0 = 0; r0 < R; r0 += kBr) {
      const std::int64_t rows = std::min<std::int64_t>(kBr, R - r0);
      const std::int64_t n_w =
          skip_tiles ? ceil_div(p.visible_keys(i * Br + r0 + rows - 1), Bc) : n;
      const std::int64_t C_w = std::min(n_w * Bc, p.Nk);
      head.sram_read_bytes += (n_w * rows + 2 * C_w) * d * e;
      head.matmul_flops += 4 * rows * C_w * d;
      head.nonmatmul_flops += kFlopsPerScore * rows * C_w + n_w * rows * (kFlopsPerRowTile + d) +
                              rows * (d + kFlopsPerRowEnd);
    }
  }
  Cost c = head.times(p.heads());
  c.thread_blocks = Tr * std::min(p.heads(), kMaxGridY);
  return c;
}

template Cost model<Step::kWgmmaSync>(const Problem&);
template Cost model<Step::kTmaPipeline>(const Problem&);
template Cost model<Step::kWarpSpecialized>(const Problem&);
template Cost model<Step::kPingPong>(const Problem&);
template Cost model<Step::kIntraOverlap>(const Problem&);

}  // namespace flashstep::hopper

namespace flashstep {

namespace {

using hopper::Step;

#if !FLASHSTEP_SM90A_BUILT
// Built without sm_90a (a CUDA compiler older than 12.5): the registry keeps
// the entries (model, mirror) and marks them unavailable; this never runs.
void unbuilt_forward(const Problem&, const ForwardTensors&, Stream) {
  throw Error("stage 08 was built without sm_90a");
}
#endif

template <Step kStep>
Stage entry(std::string_view name, std::string_view title, std::vector<DType> dtypes) {
  Stage s;
  s.name = name;
  s.title = title;
  s.writes_lse = true;
#if FLASHSTEP_SM90A_BUILT
  s.forward = hopper::forward<kStep>;
#else
  s.forward = unbuilt_forward;
#endif
  s.workspace_bytes = hopper::workspace_bytes;
  s.model = hopper::model<kStep>;
  s.mirror = hopper::mirror<kStep>;
  s.dtypes = std::move(dtypes);
  s.grouped_heads = true;  // K/V of head bh at bh / (H / H_kv): an index (hopper.cuh, Params::group)
  s.backward_dtypes = {};  // forward only
  s.arch = 90;
  s.arch_built = FLASHSTEP_SM90A_BUILT != 0;
  return s;
}

}  // namespace

std::vector<Stage> stages_08_hopper() {
  // As in stage 07: the ablation steps run bf16 (they are about how the
  // tensor cores are fed, which the type does not change), the stage both.
  return {
      entry<Step::kWgmmaSync>("08_step1_wgmma_sync", "Hopper: wgmma, synchronous",
                              {DType::kBf16}),
      entry<Step::kTmaPipeline>("08_step2_tma_pipeline", "+ TMA pipeline on mbarriers",
                                {DType::kBf16}),
      entry<Step::kWarpSpecialized>("08_step3_warp_specialized",
                                    "+ warp specialization: producer, 2 or 3 consumers, setmaxnreg",
                                    {DType::kBf16}),
      entry<Step::kPingPong>("08_step4_ping_pong", "+ ping-pong of the consumer warpgroups",
                             {DType::kBf16}),
      entry<Step::kIntraOverlap>("08_hopper", "+ softmax under the next product (intra-warpgroup)",
                                 {DType::kBf16, DType::kFp16}),
  };
}

}  // namespace flashstep
