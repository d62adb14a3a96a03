// flashstep_fma_peak: the fp32 FMA ceiling of this GPU, measured rather than
// quoted from the datasheet.
//
// The roofline (docs/memory_hierarchy.md, notebook 02) bounds every stage by
// the rate at which the CUDA cores retire fp32 fused multiply-adds. The
// datasheet's figure is SMs x FP32 lanes per SM x 2 FLOPs x boost clock; what
// the FMA pipe sustains depends on the clock the card actually holds under a
// full load. This program runs nothing but independent FFMAs on registers on
// every SM and times them.
//
// The kernel: each thread keeps kChains accumulators and applies
// acc = fma(acc, b, c) to each, kFmasPerChain times. The chains do not depend
// on each other, so while one waits out the FFMA latency the others issue: the
// FMA pipe, not the dependency chain, sets the time. b and c are kernel
// arguments and every chain starts from a different value, so the compiler can
// neither evaluate the chains nor merge them; the sum of all chains is written
// out, so none is dead code. `cuobjdump -sass` on the built binary shows the
// inner loop as kChains * kUnroll FFMAs and the loop counter alone.
//
// Output, one CSV line on stdout (2 FLOPs per FMA), which
// tests/bench/ceilings.py records as the `fma` row of docs/results/ceilings.csv:
//
//   fma,<TFLOP/s>,TFLOP/s,<median ms>
//
// Run it: build/tests/bench/flashstep_fma_peak
// Without a usable CUDA device it says why in one line and exits non-zero.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <string>
#include <vector>

#include "peak.cuh"

namespace {

using flashstep::cuda_check;
using namespace flashstep::bench;

// Independent FMA chains per thread. An FFMA's result is ready about 4 cycles
// after it issues, and each SM sub-partition issues one warp instruction a
// cycle, so a warp needs at least 4 independent FFMAs in flight to issue every
// cycle on its own; 8 doubles that, so the pipe stays full even when few warps
// are eligible, at 8 registers a thread.
constexpr int kChains = 8;
// Steps of every chain per trip of the loop, unrolled: each trip issues
// kChains * kUnroll = 256 FFMAs against about 3 loop-control instructions
// (counter add, compare, branch), which cost about 1% of the issue slots.
// 256 FFMAs are 4 KiB of code, far inside the instruction cache.
constexpr int kUnroll = 32;
// FMAs per chain over the whole kernel. With kWaves waves of a full H100 or
// H200 (about 1.1 M threads), one launch is about 5.7e11 FMAs: some 17 ms at
// the datasheet peak, long beside the few microseconds a launch costs and the
// event timer's resolution of about half a microsecond.
constexpr int kFmasPerChain = 1 << 16;
static_assert(kFmasPerChain % kUnroll == 0, "the loop runs whole trips of kUnroll steps");
constexpr int kTrips = kFmasPerChain / kUnroll;
// Threads per block: 8 warps, a multiple of the warp size that lets any GPU
// since sm_80 hold enough blocks to reach its full thread count per SM.
constexpr int kThreadsPerBlock = 256;
// Full waves of resident blocks per launch: every block does the same work,
// so whole waves leave no partly filled wave at the end, and several of them
// make the ramp-up of the first and the drain of the last a small part of the
// time.
constexpr int kWaves = 4;

// The chains run acc <- acc * kB + kC, which converges to the fixed point
// kC / (1 - kB) = 2 from any start: the values stay finite and normal (no
// overflow, no denormals), and after kFmasPerChain steps every chain is
// exactly 2 in fp32, so the output shows that every thread ran.
constexpr float kB = 0.5f;
constexpr float kC = 1.0f;
constexpr float kFixedPoint = kC / (1.0f - kB);
constexpr float kExpectedSum = kChains * kFixedPoint;

constexpr double kFlopsPerFma = 2.0;
// Digits printed: TFLOP/s to a GFLOP/s, time to a tenth of a microsecond.
constexpr int kTflopsDigits = 3;
constexpr int kMsDigits = 4;

// out [threads]: the sum of each thread's kChains chains.
__global__ void __launch_bounds__(kThreadsPerBlock)
    fma_chains_kernel(float* __restrict__ out, float b, float c, int trips) {
  const int tid = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  float acc[kChains];
#pragma unroll
  for (int k = 0; k < kChains; ++k) acc[k] = static_cast<float>(tid + k);  // distinct starts
#pragma unroll 1  // the unrolled body below is the unit; unrolling trips only grows the code
  for (int t = 0; t < trips; ++t) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int k = 0; k < kChains; ++k) acc[k] = fmaf(acc[k], b, c);
    }
  }
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < kChains; ++k) sum += acc[k];
  out[tid] = sum;
}

void launch(int blocks, float* out) {
  fma_chains_kernel<<<blocks, kThreadsPerBlock>>>(out, kB, kC, kTrips);
  flashstep::check_launch("fma_chains_kernel");
}

int run() {
  cudaDeviceProp prop{};
  const int blocks = full_waves(fma_chains_kernel, kThreadsPerBlock, kWaves, &prop);
  const std::int64_t threads = static_cast<std::int64_t>(blocks) * kThreadsPerBlock;
  DeviceBuffer<float> out(static_cast<std::size_t>(threads));

  // One run on a poisoned output, every element checked.
  out.poison();
  launch(blocks, out.get());
  cuda_check(cudaDeviceSynchronize(), "fma_chains_kernel");
  const std::vector<float> host = out.to_host();
  const auto bad = std::count_if(host.begin(), host.end(), [](float v) { return v != kExpectedSum; });
  if (bad > 0) {
    throw flashstep::Error(std::to_string(bad) + " of " + std::to_string(threads) +
                           " threads did not produce " + std::to_string(kExpectedSum));
  }
  const double ms = median_ms([&] { launch(blocks, out.get()); });

  const double fmas = static_cast<double>(threads) * kChains * kFmasPerChain;
  const double tflops = kFlopsPerFma * fmas / (ms / kMsPerSecond) / kFlopsPerTflop;
  std::cerr << "flashstep_fma_peak: " << prop.name << ", " << prop.multiProcessorCount << " SMs, "
            << blocks << " blocks of " << kThreadsPerBlock << " threads (" << kWaves
            << " full waves), " << kChains << " chains x " << kFmasPerChain
            << " FMAs per thread; median of " << kRepeats << " launches\n";
  std::cout << std::fixed << "fma," << std::setprecision(kTflopsDigits) << tflops << ",TFLOP/s,"
            << std::setprecision(kMsDigits) << ms << "\n";
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  return tool_main(argc, argv, "flashstep_fma_peak",
                   "usage: flashstep_fma_peak\n"
                   "Times independent fp32 FMA chains on every SM; prints "
                   "fma,<TFLOP/s>,TFLOP/s,<median ms>\n",
                   run);
}
