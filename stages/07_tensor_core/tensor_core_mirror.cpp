// Stage 07's CPU mirror (host only): Algorithm 1 of the FlashAttention-2 paper
// as the tensor-core kernel runs it, one template over the ablation step like
// the kernel and the model. Read it beside attend_q_block in tensor_core.cuh:
// the same grid; Q blocks of the step's Br rows (tensor_core_tiles.h); K/V
// blocks of Bc keys from the last visited one down; warps that own Wr rows of
// Qi each and load all of Kj and Vj; and the kernel's numerics:
// - Q, K, V and O are p.dtype (bf16, or fp16 in step 5); S_ij, O~_i, m_i, l_i
//   and L are fp32, S_ij from the 16-bit inputs.
// - The online softmax in log2 units with the scale inside the exponential:
//   m_i is the max of the raw scores times scale log2(e), and
//   P~_ij = 2^fma(S_ij, scale log2(e), -m_i) through ex2.approx.ftz.
// - A negative scale runs as its absolute value on -Qi, a zero one as the
//   smallest normal float (tensor_core_launch.cuh says why).
// - l_i sums P~_ij in fp32; P~_ij is rounded to p.dtype to be the A operand
//   of P~_ij Vj (through shared memory in steps 1-3, in registers from step
//   4); O_i = O~_i / l_i is rounded to p.dtype.
// Data moves between the HBM arrays and the tiles only through Chip
// (common/mirror_chip.h), which counts by tensor_core_model.cpp's conventions:
// valid elements only, each warp's fragment loads once.
//
// Where the mirror departs from the kernel, and why it may:
// - The tensor cores add an mma's exact products to the accumulator in an
//   order and at a precision NVIDIA does not specify; the mirror adds them in
//   order in fp32. ex2.approx is approximate; std::exp2 is exact to rounding.
//   So S_ij, P~_ij, l_i and O~_i may differ from the kernel's in fp32's last
//   bits, and O in its last 16-bit ones where such a difference crosses a
//   rounding boundary.
// - The kernel splits each row's l over the 4 lanes of a quad and adds the
//   parts at the end (FlashAttention-2 saves two shuffles per tile so); the
//   mirror keeps the paper's one l_i per row. The FLOPs are the model's
//   either way: it counts once per row what the quad's lanes repeat or split.
// - The kernel skips O~'s rescale when no row of a warp moved its max (the
//   factor is then exactly 1); the mirror multiplies, as the model counts.
// - Tiles hold valid rows and columns only: the kernel zero-pads d to its
//   bucket and the tiles to Br x Bc and computes on the zeros, which change
//   no sum and which the model does not count. The warps take turns.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/mirror_chip.h"
#include "tensor_core.h"

namespace flashstep::tensor_core {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kMinNormal = std::numeric_limits<float>::min();  // FLT_MIN = 2^-126

using mirror::Chip;
using mirror::online_softmax_row;
using mirror::Tile;

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

/// The softmax scale as the launcher hands it to the kernel: |scale| log2(e)
/// in fp32, > 0 (only then is the max of the raw scores the max of the
/// scaled ones), and whether Qi's sign flips to make up for a negative scale.
struct KernelScale {
  float scale_log2;
  bool negate_q;
};

KernelScale kernel_scale(const Problem& p) {
  const float scale_log2 = static_cast<float>(std::fabs(p.softmax_scale()) * kLog2e);
  // Scale 0: each visible logit still gives 2^0 = 1 (uniform weights), and a
  // masked -inf stays -inf instead of -inf * 0 = NaN.
  return {scale_log2 == 0.0f ? kMinNormal : scale_log2, p.softmax_scale() < 0.0};
}


/// What a thread block holds for its Q block: the shared-memory tiles, and
/// the registers its warps hold between them (warp w the rows it owns).
struct QBlock {
  explicit QBlock(DType t) : Qi(t), Kj(t), Vj(t) {}
  std::int64_t row0 = 0;        // first query row of the block
  std::int64_t R = 0;           // valid rows, <= Br
  Tile Qi, Kj, Vj;              // [R, d], [C, d], [C, d]: shared memory
  std::vector<float> O_tilde;   // [R, d] fp32 registers
  std::vector<float> m_i, l_i;  // [R] fp32 registers; m_i scaled, in log2 units
};


/// Lines 8-10 for warp w's rows of the Q block against the K/V block of keys
/// key0 .. key0 + C - 1 (qk_product, mask_scores, online_softmax, pv_product).
/// P_tilde: the block's P~ tile [R, C] in shared memory (steps 1-3), or null
/// where P~ stays in registers (step 4 on).
void warp_kv_block(const Problem& p, const TileShape& shape, int w, std::int64_t key0,
                   float scale_log2, QBlock& b, Tile* P_tilde, Chip& chip) {
  const std::int64_t d = p.d;
  const std::int64_t C = b.Kj.rows;
  // The warp's valid rows r0 .. r0 + rows - 1 of Qi. A warp whose rows all
  // lie past Nq has none, yet runs the same code: it loads every fragment of
  // Kj and Vj.
  const std::int64_t r0 = std::min<std::int64_t>(w * shape.warp_rows(), b.R);
  const std::int64_t rows = std::min<std::int64_t>(shape.warp_rows(), b.R - r0);

  // Line 8: S_ij = Qi Kj^T from fragments of the warp's own rows of Qi and of
  // all of Kj (the B operand: d along its rows, keys along its columns).
  const std::vector<float> Q_frag = chip.fragments(b.Qi, r0, rows);  // [rows, d]
  const std::vector<float> K_frag = chip.fragments_transposed(b.Kj);  // [d, C]
  std::vector<float> S(static_cast<size_t>(rows * C), 0.0f);         // [rows, C]
  for (std::int64_t r = 0; r < rows; ++r) {
    float* S_r = &S[static_cast<size_t>(r * C)];  // [C]
    chip.mma_row(&Q_frag[static_cast<size_t>(r * d)], K_frag.data(), d, C, S_r);
    // mask_scores: keys past the row's last visible one -> -inf (bottom-right
    // causal; the keys past Nk are not in the tile).
    const std::int64_t visible = p.visible_keys(b.row0 + r0 + r) - key0;
    for (std::int64_t c = std::max<std::int64_t>(visible, 0); c < C; ++c) S_r[c] = -kInf;
  }

  // Lines 9-10 up to the product, row by row.
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto row = static_cast<size_t>(r0 + r);
    online_softmax_row(&S[static_cast<size_t>(r * C)], C, &b.O_tilde[row * static_cast<size_t>(d)],
                       d, scale_log2, b.m_i[row], b.l_i[row], chip);
  }

  // P~_ij rounded to p.dtype, the A operand of P~_ij Vj: steps 1-3 write it
  // to the warp's rows of a shared tile (store_p) and load it back as
  // fragments; from step 4 the score registers are the A fragments
  // (p_fragment), rounded in place.
  std::vector<float> P_frag;  // [rows, C]
  if (P_tilde) {
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < C; ++c) {
        chip.write(*P_tilde, r0 + r, c, S[static_cast<size_t>(r * C + c)]);
      }
    }
    P_frag = chip.fragments(*P_tilde, r0, rows);
  } else {
    P_frag = S;
    round_to_dtype(p.dtype, P_frag.data(), rows * C);
  }

  // Line 10, second half: O~_i += P~_ij Vj from fragments of all of Vj.
  const std::vector<float> V_frag = chip.fragments(b.Vj, 0, C);  // [C, d]
  for (std::int64_t r = 0; r < rows; ++r) {
    chip.mma_row(&P_frag[static_cast<size_t>(r * C)], V_frag.data(), C, d,
                 &b.O_tilde[static_cast<size_t>((r0 + r) * d)]);
  }
}

/// Lines 12-15 (write_output): O_i = diag(l_i)^-1 O~_i rounded to p.dtype,
/// staged through the Qi tile (free by now) and copied out, and
/// L_i = (m_i + log2 l_i) ln 2, back from log2 units. A row that saw no key
/// has l_i = 0: O = 0 and L = -inf.
void write_output(const Problem& p, const HostTensors& t, std::int64_t bh, QBlock& b,
                  Chip& chip) {
  const std::int64_t d = p.d;
  float* Oi = t.O + (bh * p.Nq + b.row0) * d;  // [R, d] of O
  float* Li = t.L + bh * p.Nq + b.row0;        // [R] of L
  Tile& Oi_staged = b.Qi;                      // [R, d]
  const float ln2 = static_cast<float>(kLn2);
  for (std::int64_t r = 0; r < b.R; ++r) {
    const float l = b.l_i[static_cast<size_t>(r)];
    const float recip = chip.div(1.0f, l);
    const float inv_l = l == 0.0f ? 0.0f : recip;
    for (std::int64_t k = 0; k < d; ++k) {
      chip.write(Oi_staged, r, k, chip.mul(b.O_tilde[static_cast<size_t>(r * d + k)], inv_l));
    }
    const float lse = chip.mul(chip.add(b.m_i[static_cast<size_t>(r)], chip.log2(l)), ln2);
    chip.store(Li + r, l == 0.0f ? -kInf : lse);
  }
  for (std::int64_t r = 0; r < b.R; ++r) {  // store_tile
    for (std::int64_t k = 0; k < d; ++k) {
      chip.store(Oi + r * d + k, chip.read(Oi_staged, r, k), p.dtype);
    }
  }
}

/// negate_own_chunks: every element of Qi in shared memory flips its sign,
/// so that c Qi Kj^T = |c| (-Qi) Kj^T. Exact in any type.
void negate(Tile& Qi, Chip& chip) {
  for (std::int64_t r = 0; r < Qi.rows; ++r) {
    for (std::int64_t k = 0; k < Qi.cols; ++k) chip.write(Qi, r, k, -chip.read(Qi, r, k));
  }
}

/// Lines 4-15 for Q block i of head bh (attend_q_block).
template <Step kStep>
void attend_q_block(const Problem& p, const HostTensors& t, std::int64_t bh, std::int64_t i,
                    const KernelScale& scale, Chip& chip) {
  const TileShape shape = tile_shape(head_dim_bucket(p.d), kStep);
  const std::int64_t d = p.d;
  const float* Qh = t.Q + bh * p.Nq * d;  // [Nq, d] of this head
  const float* Kh = t.K + p.kv_head(bh) * p.Nk * d;  // [Nk, d] of this head's group
  const float* Vh = t.V + p.kv_head(bh) * p.Nk * d;  // [Nk, d] of this head's group
  QBlock b(p.dtype);
  b.row0 = i * shape.br;
  b.R = std::min<std::int64_t>(shape.br, p.Nq - b.row0);
  // The K/V blocks the block's last row sees; the rest lie above the
  // diagonal and are skipped.
  const std::int64_t n = ceil_div(p.visible_keys(b.row0 + b.R - 1), shape.bc);
  chip.cost.skipped_tiles += ceil_div(p.Nk, shape.bc) - n;

  chip.load(Qh + b.row0 * d, b.R, d, b.Qi);  // line 4, even when n = 0
  // A negative scale: steps 1-2 flip Qi as soon as it is in; from step 3,
  // once it has arrived with the first Kj, so only when there is one.
  if (scale.negate_q && (kStep < Step::kCpAsync || n > 0)) negate(b.Qi, chip);
  // Line 5, in the warps' registers.
  b.O_tilde.assign(static_cast<size_t>(b.R * d), 0.0f);
  b.m_i.assign(static_cast<size_t>(b.R), -kInf);
  b.l_i.assign(static_cast<size_t>(b.R), 0.0f);

  constexpr bool kPThroughSmem = kStep < Step::kPInRegisters;
  for (std::int64_t j = n - 1; j >= 0; --j) {  // line 6, last visited block first
    const std::int64_t key0 = j * shape.bc;
    const std::int64_t C = std::min<std::int64_t>(shape.bc, p.Nk - key0);
    chip.load(Kh + key0 * d, C, d, b.Kj);  // line 7
    chip.load(Vh + key0 * d, C, d, b.Vj);
    Tile P_tilde(b.R, C, std::vector<float>(static_cast<size_t>(b.R * C)), p.dtype);  // steps 1-3
    for (int w = 0; w < shape.warps; ++w) {
      warp_kv_block(p, shape, w, key0, scale.scale_log2, b, kPThroughSmem ? &P_tilde : nullptr,
                    chip);
    }
  }
  write_output(p, t, bh, b, chip);
}

}  // namespace

template <Step kStep>
Cost mirror(const Problem& p, const HostTensors& t) {
  validate(p);
  const std::string what = "stage 07 " + std::string(step_slug(kStep)) + " mirror";
  if (!t.Q || !t.K || !t.V || !t.O || !t.L) throw Error(what + ": null tensor pointer");
  // The types the launcher has a kernel for (tensor_core_launch.cuh).
  if (p.dtype != DType::kBf16 && !(p.dtype == DType::kFp16 && kStep == Step::kTunedTiles)) {
    throw Error(what + ": no kernel for " + std::string(dtype_name(p.dtype)));
  }
  const KernelScale scale = kernel_scale(p);
  const TileShape shape = tile_shape(head_dim_bucket(p.d), kStep);
  Chip chip;
  // The kernel's grid: x over Q blocks, heaviest first (stage 05); y over
  // heads, a block taking several heads only past grid y's limit.
  const std::int64_t Tr = ceil_div(p.Nq, shape.br);
  const std::int64_t grid_y = std::min(p.heads(), kMaxGridY);
  chip.cost.thread_blocks = Tr * grid_y;
  for (std::int64_t x = 0; x < Tr; ++x) {  // line 3
    for (std::int64_t y = 0; y < grid_y; ++y) {
      for (std::int64_t bh = y; bh < p.heads(); bh += grid_y) {
        attend_q_block<kStep>(p, t, bh, Tr - 1 - x, scale, chip);
      }
    }
  }
  return chip.cost;
}

template Cost mirror<Step::kPlainMma>(const Problem&, const HostTensors&);
template Cost mirror<Step::kLdmatrix>(const Problem&, const HostTensors&);
template Cost mirror<Step::kCpAsync>(const Problem&, const HostTensors&);
template Cost mirror<Step::kPInRegisters>(const Problem&, const HostTensors&);
template Cost mirror<Step::kTunedTiles>(const Problem&, const HostTensors&);

}  // namespace flashstep::tensor_core
