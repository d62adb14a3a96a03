/// \file mirror_chip.h
/// \brief The counting machine the tile-based CPU mirrors run on (stage 04's
/// forward, stage 05's backward, stages 07 and 08's tensor-core forwards):
/// shared-memory tiles, and a Chip through which every element moved between
/// HBM and the tiles, every shared-memory access and every FLOP is counted
/// into a Cost (conventions in cost.h). Elements are fp32 unless a tile or a
/// store names a 16-bit type: then they cost 2 bytes and are rounded to it.
/// Also the online-softmax row step the tensor-core mirrors share. Host only,
/// CUDA-free.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "cost.h"
#include "problem.h"
#include "rounding.h"

namespace flashstep::mirror {

/// A tile in shared memory: row-major [rows][cols] elements of `dtype`
/// (fp16 and bf16 held as their exact fp32 values).
struct Tile {
  std::int64_t rows = 0, cols = 0;
  std::vector<float> v;
  DType dtype = DType::kFp32;  ///< what one element costs, and what a write rounds to

  Tile() = default;
  /// An empty tile of `t` elements, for Chip::load to fill.
  explicit Tile(DType t) : dtype(t) {}
  /// A rows x cols tile holding `values` [rows * cols].
  Tile(std::int64_t r, std::int64_t c, std::vector<float> values, DType t = DType::kFp32)
      : rows(r), cols(c), v(std::move(values)), dtype(t) {}

  std::int64_t elem_bytes() const { return dtype_bytes(dtype); }  ///< bytes of one element
  /// Element (r, c), uncounted: for the Chip's own helpers.
  float at(std::int64_t r, std::int64_t c) const { return v[static_cast<size_t>(r * cols + c)]; }
};

/// One thread block's view of the machine: HBM on one side, shared memory and
/// registers on the other, and the counters of cost.h between them. Registers
/// (plain floats and vectors in a mirror) are free; shared-memory tiles and
/// HBM are reached only through these helpers.
class Chip {
 public:
  Cost cost;  ///< everything counted so far

  /// HBM -> shared memory: rows x cols elements of a row-major [., cols]
  /// array, in the tile's type. A 16-bit stage's array holds values of that
  /// type already (its caller rounds them as the runner does on the way to
  /// the device); rounding them again here changes nothing.
  void load(const float* hbm, std::int64_t rows, std::int64_t cols, Tile& tile) {
    tile.rows = rows;
    tile.cols = cols;
    tile.v.assign(hbm, hbm + rows * cols);
    round_to_dtype(tile.dtype, tile.v.data(), rows * cols);
    cost.hbm_read_bytes += rows * cols * tile.elem_bytes();
    cost.sram_write_bytes += rows * cols * tile.elem_bytes();
  }
  /// Shared memory -> registers, one element used once.
  float read(const Tile& tile, std::int64_t r, std::int64_t c) {
    cost.sram_read_bytes += tile.elem_bytes();
    return tile.at(r, c);
  }
  /// Registers -> shared memory, one element, rounded to the tile's type.
  void write(Tile& tile, std::int64_t r, std::int64_t c, float value) {
    cost.sram_write_bytes += tile.elem_bytes();
    tile.v[static_cast<size_t>(r * tile.cols + c)] = round_to_dtype(tile.dtype, value);
  }
  /// Registers -> HBM, one element of type t (rounded to it): O in the
  /// stage's type, L and the fp32 arrays in the default.
  void store(float* hbm, float value, DType t = DType::kFp32) {
    *hbm = round_to_dtype(t, value);
    cost.hbm_write_bytes += dtype_bytes(t);
  }
  /// Registers -> HBM through an atomic add: a read and a write of the element.
  void atomic_add(float* hbm, float value) {
    *hbm += value;
    cost.hbm_read_bytes += kFloatBytes;
    cost.hbm_write_bytes += kFloatBytes;
  }

  // The tile products count 2 FLOPs per multiply-add, and each multiply-add
  // reads its two operands from shared memory (the models' granularity).

  /// acc + sum_k A[a][k] B[b][k] over k < n, k in order: one element of a
  /// product with B transposed (S = Qi Kj^T, dP = dOi Vj^T).
  float dot(const Tile& A, std::int64_t a, const Tile& B, std::int64_t b, std::int64_t n,
            float acc = 0.0f) {
    cost.sram_read_bytes += 2 * n * kFloatBytes;
    cost.matmul_flops += 2 * n;
    for (std::int64_t k = 0; k < n; ++k) acc += A.at(a, k) * B.at(b, k);
    return acc;
  }
  /// out[k] += A[r][c] B[b][k] for k < n: one term of a row of a product such
  /// as P~_ij Vj (b = c), P_ij^T dOi (b = r) or dS_ij Kj.
  void axpy(const Tile& A, std::int64_t r, std::int64_t c, const Tile& B, std::int64_t b,
            std::int64_t n, float* out) {
    cost.sram_read_bytes += 2 * n * kFloatBytes;
    cost.matmul_flops += 2 * n;
    const float x = A.at(r, c);
    for (std::int64_t k = 0; k < n; ++k) out[k] += x * B.at(b, k);
  }

  // The tensor-core stage's products: a warp loads each operand's fragments
  // from shared memory once (ldmatrix) and reuses them, from registers, in
  // every mma that needs them; so the reads are counted per fragment load,
  // and the products count only their FLOPs.

  /// Shared memory -> a warp's registers: rows [row0, row0 + rows) of the
  /// tile, every column, each element read once. Row-major [rows][tile.cols].
  std::vector<float> fragments(const Tile& tile, std::int64_t row0, std::int64_t rows) {
    cost.sram_read_bytes += rows * tile.cols * tile.elem_bytes();
    const auto first = tile.v.begin() + static_cast<std::ptrdiff_t>(row0 * tile.cols);
    return {first, first + static_cast<std::ptrdiff_t>(rows * tile.cols)};
  }
  /// The whole tile into a warp's registers transposed, [tile.cols][tile.rows]:
  /// Kj as the B operand of Qi Kj^T, keys along the columns. Each element read once.
  std::vector<float> fragments_transposed(const Tile& tile) {
    cost.sram_read_bytes += tile.rows * tile.cols * tile.elem_bytes();
    std::vector<float> t(tile.v.size());
    for (std::int64_t r = 0; r < tile.rows; ++r) {
      for (std::int64_t c = 0; c < tile.cols; ++c) {
        t[static_cast<size_t>(c * tile.rows + r)] = tile.at(r, c);
      }
    }
    return t;
  }
  /// out [m] += a [n] B [n, m] from register fragments: one row of an mma
  /// chain's output (a: that row of the A operand; B: the B operand, k along
  /// its rows). Each out[j] adds its n products in k order, in fp32.
  void mma_row(const float* a, const float* B, std::int64_t n, std::int64_t m, float* out) {
    cost.matmul_flops += 2 * n * m;
    for (std::int64_t k = 0; k < n; ++k) {
      const float a_k = a[k];
      const float* B_k = B + k * m;
      for (std::int64_t j = 0; j < m; ++j) out[j] += a_k * B_k[j];
    }
  }

  // Everything else, one FLOP each (a fused multiply-add two).
  float mul(float a, float b) { return count(a * b); }
  float add(float a, float b) { return count(a + b); }
  float sub(float a, float b) { return count(a - b); }
  float div(float a, float b) { return count(a / b); }
  float max(float a, float b) { return count(std::max(a, b)); }
  float exp2(float x) { return count(std::exp2(x)); }
  float log(float x) { return count(std::log(x)); }
  float log2(float x) { return count(std::log2(x)); }
  /// a b + c rounded once (an FFMA): a multiply and an add.
  float fma(float a, float b, float c) {
    ++cost.nonmatmul_flops;
    return count(std::fma(a, b, c));
  }

  /// One score's visibility, tested on its own (the per-element mask): counted
  /// in mask_tests, not as a FLOP. Returns `visible`.
  bool mask_test(bool visible) {
    ++cost.mask_tests;
    return visible;
  }

 private:
  float count(float x) {
    ++cost.nonmatmul_flops;
    return x;
  }
};

/// 2^x as the kernels' fast exp2 (ex2.approx.ftz.f32) gives it: a subnormal x
/// is read as 0, and a result below the smallest normal float is 0.
inline float fast_exp2(Chip& chip, float x) {
  constexpr float kMinNormal = std::numeric_limits<float>::min();  // FLT_MIN = 2^-126
  const float y = chip.exp2(std::fpclassify(x) == FP_SUBNORMAL ? 0.0f : x);
  return y < kMinNormal ? 0.0f : y;
}

/// FlashAttention-2's Algorithm 1, lines 9-10 up to the product, for one row
/// (the tensor-core stages' online softmax, in log2 units): the raw scores
/// S_r [C] become P~ (fp32) in place; m, l and the row O_r [d] of O~ follow.
inline void online_softmax_row(float* S_r, std::int64_t C, float* O_r, std::int64_t d,
                               float scale_log2, float& m, float& l, Chip& chip) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  // Line 9: m_new = max(m, rowmax(S) scale log2(e)), the max taken over the
  // raw scores and scaled once.
  float raw_max = S_r[0];
  for (std::int64_t c = 1; c < C; ++c) raw_max = chip.max(raw_max, S_r[c]);
  const float m_new = chip.max(m, chip.mul(raw_max, scale_log2));
  // A row that has seen only masked keys keeps m = -inf; subtracting 0
  // instead gives 2^-inf = 0 rather than 2^(-inf + inf) = NaN.
  const float m_sub = m_new == -kInf ? 0.0f : m_new;
  // The paper's e^(m_old - m_new), here 2^(m_old - m_new); 0 on the first tile.
  const float alpha = fast_exp2(chip, chip.sub(m, m_sub));
  m = m_new;
  // Line 9: P~_ij = e^(scale S_ij - m) in the paper's units is
  // 2^(S_ij scale log2(e) - m_new) in these: one FFMA and one ex2 per score.
  // Then l = alpha l + rowsum(P~_ij), one more FFMA.
  for (std::int64_t c = 0; c < C; ++c) {
    S_r[c] = fast_exp2(chip, chip.fma(S_r[c], scale_log2, -m_sub));
  }
  float rowsum = S_r[0];
  for (std::int64_t c = 1; c < C; ++c) rowsum = chip.add(rowsum, S_r[c]);
  l = chip.fma(alpha, l, rowsum);
  // Line 10, first half: O~_i = diag(alpha) O~_i.
  for (std::int64_t k = 0; k < d; ++k) O_r[k] = chip.mul(O_r[k], alpha);
}

}  // namespace flashstep::mirror
