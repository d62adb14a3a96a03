/// \file mirror_chip.h
/// \brief The counting machine the tile-based CPU mirrors run on (stage 04's
/// forward, stage 05's backward): shared-memory tiles, and a Chip through
/// which every element moved between HBM and the tiles, every shared-memory
/// access and every FLOP is counted into a Cost (conventions in cost.h).
/// Host only, CUDA-free.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cost.h"
#include "problem.h"

namespace flashstep::mirror {

/// A tile in shared memory: row-major [rows][cols].
struct Tile {
  std::int64_t rows = 0, cols = 0;
  std::vector<float> v;
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

  /// HBM -> shared memory: rows x cols elements of a row-major [., cols] array.
  void load(const float* hbm, std::int64_t rows, std::int64_t cols, Tile& tile) {
    tile.rows = rows;
    tile.cols = cols;
    tile.v.assign(hbm, hbm + rows * cols);
    cost.hbm_read_bytes += rows * cols * kFloatBytes;
    cost.sram_write_bytes += rows * cols * kFloatBytes;
  }
  /// Shared memory -> registers, one element used once.
  float read(const Tile& tile, std::int64_t r, std::int64_t c) {
    cost.sram_read_bytes += kFloatBytes;
    return tile.at(r, c);
  }
  /// Registers -> shared memory, one element.
  void write(Tile& tile, std::int64_t r, std::int64_t c, float value) {
    cost.sram_write_bytes += kFloatBytes;
    tile.v[static_cast<size_t>(r * tile.cols + c)] = value;
  }
  /// Registers -> HBM.
  void store(float* hbm, float value) {
    *hbm = value;
    cost.hbm_write_bytes += kFloatBytes;
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

  // Everything else, one FLOP each.
  float mul(float a, float b) { return count(a * b); }
  float add(float a, float b) { return count(a + b); }
  float sub(float a, float b) { return count(a - b); }
  float div(float a, float b) { return count(a / b); }
  float max(float a, float b) { return count(std::max(a, b)); }
  float exp2(float x) { return count(std::exp2(x)); }
  float log(float x) { return count(std::log(x)); }

 private:
  float count(float x) {
    ++cost.nonmatmul_flops;
    return x;
  }
};

}  // namespace flashstep::mirror
