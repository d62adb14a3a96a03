// flashstep_mma_peak: the dense bf16 tensor-core ceiling of the instruction
// stage 07 is built on, measured.
//
// Stage 07 multiplies with mma.sync.aligned.m16n8k16 (bf16 in, fp32
// accumulators; common/mma_sm80.cuh), the warp-level instruction of Ampere
// that Hopper keeps. Hopper's own tensor-core instruction, wgmma, is what the
// datasheet's dense bf16 figure and cuBLAS reach (ceilings.py measures the
// latter); mma.sync on the same chip reaches less. This program measures that
// "less": nothing but independent mma.sync chains on registers, on every SM.
//
// The kernel: each warp keeps kChains accumulator tiles (16 x 8 fp32, 4
// registers a lane) and applies D += A B to each, kMmasPerChain times, with
// one A (16 x 16) and one B (16 x 8) fragment held in registers. The chains do
// not depend on each other, so while one waits out the mma's latency the
// others issue: the tensor pipe, not the dependency chain, sets the time. A
// and B arrive as kernel arguments (bit patterns), and the asm is volatile,
// so nothing is folded or dropped; each lane's sum of its accumulators is
// written out. `cuobjdump -sass` shows the inner loop as kChains * kUnroll
// HMMA.16816.F32.BF16 and the loop counter alone.
//
// The check is exact: every element of A is 1 and of B is 2^-4, so each mma
// adds 16 * 2^-4 = 1 to every accumulator; chain k starts at k and ends at
// k + kMmasPerChain, integers far below 2^24, which fp32 holds exactly.
//
// Output, one CSV line on stdout (2 * 16 * 8 * 16 = 4096 FLOPs per mma),
// which tests/bench/ceilings.py records as the `mma_bf16` row of
// docs/results/ceilings.csv:
//
//   mma_bf16,<TFLOP/s>,TFLOP/s,<median ms>
//
// Run it: build/tests/bench/flashstep_mma_peak
// Without a usable CUDA device it says why in one line and exits non-zero.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <string>
#include <vector>

#include "common/mma_sm80.cuh"
#include "peak.cuh"

namespace {

using flashstep::cuda_check;
using namespace flashstep::bench;

constexpr int kWarpSize = 32;
// The instruction's shape: D [16 x 8] += A [16 x 16] B [16 x 8].
constexpr int kMmaM = 16;
constexpr int kMmaN = 8;
constexpr int kMmaK = 16;
constexpr double kFlopsPerMma = 2.0 * kMmaM * kMmaN * kMmaK;  // 4096
// Accumulator registers per lane of one D tile: 16 x 8 / 32 lanes.
constexpr int kAccRegs = kMmaM * kMmaN / kWarpSize;

// Independent accumulator tiles per warp. An HMMA's result is ready some
// 30 cycles after it issues and a sub-partition's tensor core takes a new
// one every few cycles, so about 8 must be in flight per sub-partition; with
// 8 per warp one warp nearly covers it alone, and the 8 or more warps each
// sub-partition holds cover it many times. 32 accumulator registers a lane.
constexpr int kChains = 8;
// Steps of every chain per trip of the loop, unrolled: 128 HMMAs against
// about 3 loop-control instructions.
constexpr int kUnroll = 16;
// mmas per chain over the whole kernel. With kWaves waves of a full H100 or
// H200 (about 34 thousand warps), one launch is about 9e12 FLOPs: some 9 ms
// at the datasheet's dense bf16 peak, more at mma.sync's, long beside a
// launch's few microseconds. Small enough that k + kMmasPerChain, and a
// lane's sum of kChains x kAccRegs of them, stay exact in fp32 (< 2^24).
constexpr int kMmasPerChain = 1 << 13;
static_assert(kMmasPerChain % kUnroll == 0, "the loop runs whole trips of kUnroll steps");
constexpr int kTrips = kMmasPerChain / kUnroll;
// Threads per block: 8 warps, a multiple of the warp size that lets any GPU
// since sm_80 hold enough blocks to reach its full thread count per SM.
constexpr int kThreadsPerBlock = 256;
// Full waves of resident blocks per launch (fma_peak.cu says why).
constexpr int kWaves = 4;

// bf16 bit patterns, two to a 32-bit register: 1.0 = 0x3F80, 2^-4 = 0x3D80.
constexpr std::uint32_t kOnes = 0x3F803F80u;
constexpr std::uint32_t kSixteenths = 0x3D803D80u;
// What each mma adds to every accumulator: the sum over its k of 1 * 2^-4.
constexpr float kStep = kMmaK * 0.0625f;
// A lane's sum: kAccRegs registers of each chain k, each k + kMmasPerChain * kStep.
constexpr float kExpectedSum =
    kAccRegs * (kChains * kMmasPerChain * kStep + kChains * (kChains - 1) / 2.0f);
static_assert(kExpectedSum < (1 << 24), "every partial sum is an integer fp32 holds exactly");

// Digits printed: TFLOP/s to a GFLOP/s, time to a tenth of a microsecond.
constexpr int kTflopsDigits = 3;
constexpr int kMsDigits = 4;

// out [threads]: the sum of each lane's accumulators over its warp's chains.
__global__ void __launch_bounds__(kThreadsPerBlock)
    mma_chains_kernel(float* __restrict__ out, std::uint32_t a_bits, std::uint32_t b_bits,
                      int trips) {
  const int tid = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  const std::uint32_t a[4] = {a_bits, a_bits, a_bits, a_bits};
  const std::uint32_t b[2] = {b_bits, b_bits};
  float acc[kChains][kAccRegs];
#pragma unroll
  for (int k = 0; k < kChains; ++k) {
#pragma unroll
    for (int e = 0; e < kAccRegs; ++e) acc[k][e] = static_cast<float>(k);  // distinct starts
  }
#pragma unroll 1  // the unrolled body below is the unit; unrolling trips only grows the code
  for (int t = 0; t < trips; ++t) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int k = 0; k < kChains; ++k) flashstep::sm80::mma_m16n8k16<__nv_bfloat16>(acc[k], a, b);
    }
  }
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < kChains; ++k) {
#pragma unroll
    for (int e = 0; e < kAccRegs; ++e) sum += acc[k][e];
  }
  out[tid] = sum;
}

void launch(int blocks, float* out) {
  mma_chains_kernel<<<blocks, kThreadsPerBlock>>>(out, kOnes, kSixteenths, kTrips);
  flashstep::check_launch("mma_chains_kernel");
}

int run() {
  cudaDeviceProp prop{};
  const int blocks = full_waves(mma_chains_kernel, kThreadsPerBlock, kWaves, &prop);
  const std::int64_t threads = static_cast<std::int64_t>(blocks) * kThreadsPerBlock;
  DeviceBuffer<float> out(static_cast<std::size_t>(threads));

  // One run on a poisoned output, every lane checked.
  out.poison();
  launch(blocks, out.get());
  cuda_check(cudaDeviceSynchronize(), "mma_chains_kernel");
  const std::vector<float> host = out.to_host();
  const auto bad = std::count_if(host.begin(), host.end(), [](float v) { return v != kExpectedSum; });
  if (bad > 0) {
    const auto first = std::find_if(host.begin(), host.end(), [](float v) { return v != kExpectedSum; });
    throw flashstep::Error(std::to_string(bad) + " of " + std::to_string(threads) +
                           " lanes did not produce " + std::to_string(kExpectedSum) + " (lane " +
                           std::to_string(first - host.begin()) + ": " + std::to_string(*first) + ")");
  }
  const double ms = median_ms([&] { launch(blocks, out.get()); });

  const double mmas = static_cast<double>(threads / kWarpSize) * kChains * kMmasPerChain;
  const double tflops = kFlopsPerMma * mmas / (ms / kMsPerSecond) / kFlopsPerTflop;
  std::cerr << "flashstep_mma_peak: " << prop.name << ", " << prop.multiProcessorCount << " SMs, "
            << blocks << " blocks of " << kThreadsPerBlock << " threads (" << kWaves
            << " full waves), " << kChains << " chains x " << kMmasPerChain
            << " mma.sync.m16n8k16 bf16 per warp; median of " << kRepeats << " launches\n";
  std::cout << std::fixed << "mma_bf16," << std::setprecision(kTflopsDigits) << tflops
            << ",TFLOP/s," << std::setprecision(kMsDigits) << ms << "\n";
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  return tool_main(argc, argv, "flashstep_mma_peak",
                   "usage: flashstep_mma_peak\n"
                   "Times independent mma.sync.m16n8k16 bf16 chains on every SM (4096 FLOPs "
                   "each); prints mma_bf16,<TFLOP/s>,TFLOP/s,<median ms>\n",
                   run);
}
