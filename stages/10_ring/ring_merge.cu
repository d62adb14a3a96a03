// The ring's kernels on the accumulators (ring_merge.h): each (O, L) partial
// a stage writes is merged into its Q chunk's fp32 accumulator as soon as it
// is written, so one partial buffer serves every pair and the accumulator
// is the output. One warp per row: its lanes stride over the row's d
// elements, so a warp's loads and stores are contiguous.
#include <cuda_runtime.h>

#include <cmath>

#include "common/cuda_check.h"
#include "common/element.cuh"
#include "common/partial_merge.h"
#include "ring_merge.h"
#include "ring_model.h"

namespace flashstep::ring {

namespace {

constexpr int kWarpSize = 32;
constexpr int kThreads = static_cast<int>(kMergeRowsPerBlock) * kWarpSize;

// The row this warp owns, or -1 past the end.
__device__ inline std::int64_t warp_row(std::int64_t rows) {
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * kMergeRowsPerBlock + threadIdx.x / kWarpSize;
  return row < rows ? row : -1;
}

__global__ void init_kernel(float* O_acc,  // [rows, d]
                            float* L_acc,  // [rows]
                            std::int64_t rows, int d) {
  const std::int64_t row = warp_row(rows);
  if (row < 0) return;
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  for (int c = lane; c < d; c += kWarpSize) O_acc[row * d + c] = 0.0f;
  if (lane == 0) L_acc[row] = -INFINITY;
}

template <typename Elem>
__global__ void merge_kernel(float* O_acc,         // [rows, d]
                             float* L_acc,         // [rows]
                             const Elem* O_part,   // [rows, d]
                             const float* L_part,  // [rows]
                             std::int64_t rows, int d) {
  const std::int64_t row = warp_row(rows);
  if (row < 0) return;
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const float L_a = L_acc[row];
  const float L_b = L_part[row];
  const float L = lse_merge(L_a, L_b);
  const float w_a = partial_weight(L_a, L);
  const float w_b = partial_weight(L_b, L);
  for (int c = lane; c < d; c += kWarpSize) {
    O_acc[row * d + c] = w_a * O_acc[row * d + c] + w_b * to_float(O_part[row * d + c]);
  }
  __syncwarp();  // every lane has read L_acc[row] before lane 0 replaces it
  if (lane == 0) L_acc[row] = L;
}

template <typename Elem>
__global__ void finish_kernel(Elem* O,             // [rows, d]
                              const float* O_acc,  // [rows, d]
                              std::int64_t rows, int d) {
  const std::int64_t row = warp_row(rows);
  if (row < 0) return;
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  for (int c = lane; c < d; c += kWarpSize) O[row * d + c] = from_float<Elem>(O_acc[row * d + c]);
}

unsigned blocks(std::int64_t rows) {
  return static_cast<unsigned>((rows + kMergeRowsPerBlock - 1) / kMergeRowsPerBlock);
}

}  // namespace

void launch_init(float* O_acc, float* L_acc, std::int64_t rows, std::int64_t d, Stream stream) {
  if (rows == 0) return;
  init_kernel<<<blocks(rows), kThreads, 0, stream>>>(O_acc, L_acc, rows, static_cast<int>(d));
  check_launch("ring init_kernel");
}

void launch_merge(DType t, float* O_acc, float* L_acc, const void* O_part, const float* L_part,
                  std::int64_t rows, std::int64_t d, Stream stream) {
  if (rows == 0) return;
  with_element_type(t, [&](auto elem) {
    using Elem = decltype(elem);
    merge_kernel<Elem><<<blocks(rows), kThreads, 0, stream>>>(
        O_acc, L_acc, static_cast<const Elem*>(O_part), L_part, rows, static_cast<int>(d));
  });
  check_launch("ring merge_kernel");
}

void launch_finish(DType t, void* O, const float* O_acc, std::int64_t rows, std::int64_t d,
                   Stream stream) {
  if (rows == 0) return;
  with_element_type(t, [&](auto elem) {
    using Elem = decltype(elem);
    finish_kernel<Elem><<<blocks(rows), kThreads, 0, stream>>>(static_cast<Elem*>(O), O_acc, rows,
                                                                static_cast<int>(d));
  });
  check_launch("ring finish_kernel");
}

}  // namespace flashstep::ring
