// What the ceiling tools (flashstep_fma_peak, flashstep_mma_peak) share:
// how many blocks fill the GPU, the timing of one launch, and main()'s
// handling of its arguments and errors. Host code; include from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "common/cuda_check.h"
#include "common/device.h"
#include "common/error.h"

namespace flashstep::bench {

// Untimed launches first (clocks ramp up, the module loads), then timed ones;
// the median of an odd count is one of the samples.
inline constexpr int kWarmup = 3;
inline constexpr int kRepeats = 21;
inline constexpr double kMsPerSecond = 1e3;
inline constexpr double kFlopsPerTflop = 1e12;
// Every output element is set to this byte pattern (NaN) before the check
// run, so a thread that never wrote fails the check.
inline constexpr int kPoisonByte = 0xFF;

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitUsage = 2;

/// Blocks of `threads` threads that `waves` full waves of `kernel` take on
/// device 0: every block does the same work, so whole waves leave no partly
/// filled wave at the end. Throws when the device is unusable or the kernel
/// cannot run on it.
template <typename... Params>
int full_waves(void (*kernel)(Params...), int threads, int waves, cudaDeviceProp* prop) {
  std::string why;
  if (!cuda_device_available(&why)) throw Error("no usable CUDA device (" + why + ")");
  cuda_check(cudaGetDeviceProperties(prop, 0), "cudaGetDeviceProperties");
  int blocks_per_sm = 0;
  cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, threads, 0),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  if (blocks_per_sm < 1) throw Error("the kernel cannot run on " + std::string(prop->name));
  return prop->multiProcessorCount * blocks_per_sm * waves;
}

/// Median milliseconds of kRepeats calls of `launch`, each timed with CUDA
/// events after kWarmup untimed ones. No L2 flush between repeats: the ceiling
/// kernels read no memory and write a few MB once at the end.
template <typename Launch>
double median_ms(Launch launch) {
  cudaEvent_t start = nullptr, stop = nullptr;
  std::vector<float> ms(kRepeats);
  try {
    cuda_check(cudaEventCreate(&start), "cudaEventCreate");
    cuda_check(cudaEventCreate(&stop), "cudaEventCreate");
    for (int k = 0; k < kWarmup; ++k) launch();
    for (float& m : ms) {
      cuda_check(cudaEventRecord(start), "cudaEventRecord");
      launch();
      cuda_check(cudaEventRecord(stop), "cudaEventRecord");
      cuda_check(cudaEventSynchronize(stop), "timed launch");
      cuda_check(cudaEventElapsedTime(&m, start, stop), "cudaEventElapsedTime");
    }
  } catch (...) {
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    throw;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

/// A device buffer of `count` T, freed when it goes out of scope.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t count) : count_(count) {
    cuda_check(cudaMalloc(&ptr_, count * sizeof(T)), "cudaMalloc");
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return ptr_; }
  /// Sets every byte to kPoisonByte.
  void poison() { cuda_check(cudaMemset(ptr_, kPoisonByte, count_ * sizeof(T)), "poison output"); }
  /// Copies the buffer to the host (after the work before it on the stream).
  std::vector<T> to_host() const {
    std::vector<T> host(count_);
    cuda_check(cudaMemcpy(host.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost),
               "copy output");
    return host;
  }

 private:
  T* ptr_ = nullptr;
  std::size_t count_;
};

/// main() of a tool that takes no arguments but --help: prints `usage` for
/// --help, refuses anything else, and turns an Error from `run` into one
/// line "<name>: <what>" and exit status 1.
template <typename Run>
int tool_main(int argc, char** argv, const char* name, const std::string& usage, Run run) {
  if (argc > 1) {
    const std::string arg = argv[1];
    const bool help = argc == 2 && (arg == "--help" || arg == "-h");
    (help ? std::cout : std::cerr) << usage;
    return help ? kExitOk : kExitUsage;
  }
  try {
    return run();
  } catch (const Error& e) {
    std::cerr << name << ": " << e.what() << "\n";
    return kExitError;
  }
}

}  // namespace flashstep::bench
