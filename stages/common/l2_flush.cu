// The read-only L2 flush of the timed runs (l2_flush.h).
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_check.h"
#include "l2_flush.h"

namespace flashstep {

namespace {

// The buffer is zero-filled once (zero_l2_flush_buffer), so every thread's XOR is 0
// and the sink is never written; the compiler cannot know that, and keeps the
// loads.
constexpr unsigned kImpossibleXor = 1u;

// Each thread XORs its 16-byte words, strided over the grid (coalesced).
__global__ void flush_l2_kernel(const uint4* __restrict__ words, std::int64_t n,
                                unsigned* __restrict__ sink) {
  unsigned x = 0;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const uint4 w = words[i];
    x ^= w.x ^ w.y ^ w.z ^ w.w;
  }
  if (x == kImpossibleXor) *sink = x;
}

}  // namespace

void zero_l2_flush_buffer(void* buffer, std::int64_t bytes) {
  cuda_check(cudaMemset(buffer, 0, static_cast<size_t>(l2_flush_allocation(bytes))),
             "zero the L2 flush buffer");
}

void flush_l2(void* buffer, std::int64_t bytes, Stream stream) {
  const std::int64_t words = bytes / static_cast<std::int64_t>(sizeof(uint4));
  unsigned* sink = reinterpret_cast<unsigned*>(static_cast<char*>(buffer) + bytes);
  flush_l2_kernel<<<kL2FlushBlocks, kL2FlushThreads, 0, stream>>>(
      static_cast<const uint4*>(buffer), words, sink);
  check_launch("flush_l2_kernel");
}

}  // namespace flashstep
