/// \file ring_merge.h
/// \brief The ring's small kernels on the accumulators (ring_merge.cu):
/// start them empty, merge a partial into them, round them into O. One warp
/// per row, kMergeRowsPerBlock rows per thread block. CUDA-free header.
#pragma once

#include <cstdint>

#include "common/problem.h"
#include "common/stage.h"

namespace flashstep::ring {

/// O_acc [rows, d] = 0 and L_acc [rows] = -inf: the merge of no partial
/// (rows = B H n of one Q chunk).
void launch_init(float* O_acc, float* L_acc, std::int64_t rows, std::int64_t d, Stream stream);

/// Merges the partial (O_part [rows, d] in type t, L_part [rows]) into the
/// accumulator (O_acc [rows, d], L_acc [rows], fp32) in place, row by row by
/// common/partial_merge.h's rule: L = lse_merge(L_acc, L_part), each side
/// weighted by partial_weight.
void launch_merge(DType t, float* O_acc, float* L_acc, const void* O_part, const float* L_part,
                  std::int64_t rows, std::int64_t d, Stream stream);

/// O [rows, d] in type t = O_acc rounded (to nearest even).
void launch_finish(DType t, void* O, const float* O_acc, std::int64_t rows, std::int64_t d,
                   Stream stream);

}  // namespace flashstep::ring
