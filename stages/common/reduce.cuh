/// \file reduce.cuh
/// \brief Warp and thread-block reductions (max, sum) used by the softmax kernels.
#pragma once

namespace flashstep {

/// Threads in a warp.
inline constexpr int kWarpSize = 32;
/// Mask of all lanes of a warp, for the *_sync shuffles.
inline constexpr unsigned kFullWarpMask = 0xffffffffu;

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

/// Reduces `v` over the 32 lanes of a warp by butterfly shuffles; every lane
/// gets the result.
template <typename Op>
__device__ float warp_reduce(float v, Op op) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v = op(v, __shfl_xor_sync(kFullWarpMask, v, offset));
  }
  return v;
}

/// Reduces `v` over the whole thread block; every thread gets the result.
/// `scratch` is shared memory of kWarpSize floats. blockDim.x must be a
/// multiple of 32. Contains barriers: every thread of the block must call it.
template <typename Op>
__device__ float block_reduce(float v, Op op, float identity, float* scratch) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  v = warp_reduce(v, op);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : identity;
  v = warp_reduce(v, op);
  __syncthreads();  // scratch may be reused by the next call
  return v;
}

}  // namespace flashstep
