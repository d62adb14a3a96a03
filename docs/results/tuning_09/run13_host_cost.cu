// Run 13 (README.md): host time of the CUDA runtime calls the C ABI
// (stages/capi/flashstep.cpp) makes for each forward call, each timed over
// 2000 calls after 50 untimed ones. On a GPU machine:
//   nvcc -O2 -std=c++17 -arch=sm_90 run13_host_cost.cu -o /tmp/host_cost && /tmp/host_cost
// (run13_host_cost.txt's figures came from a scratch form of it with the
// same calls, sizes and counts; this file, tidied, compiled but not rerun)
#include <chrono>
#include <cstdio>
#include <cuda_runtime.h>

namespace {

constexpr int kWarmCalls = 50;
constexpr int kTimedCalls = 2000;
constexpr size_t kBufferBytes = 1 << 20;      // a device buffer to ask about
constexpr size_t kWorkspaceBytes = 300000;    // about a short decode's partials
constexpr int kSharedBytes = 100000;          // a dynamic shared memory request

// Mean host microseconds of one call of f.
template <class F>
double host_us(F f) {
  for (int i = 0; i < kWarmCalls; ++i) f();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kTimedCalls; ++i) f();
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / kTimedCalls;
}

__global__ void empty_kernel() {}

}  // namespace

int main() {
  void* buffer = nullptr;
  cudaMalloc(&buffer, kBufferBytes);
  cudaStream_t stream = nullptr;
  cudaStreamCreate(&stream);
  size_t free_bytes = 0, total_bytes = 0;
  std::printf("cudaMemGetInfo            %.2f us\n",
              host_us([&] { cudaMemGetInfo(&free_bytes, &total_bytes); }));
  std::printf("cudaPointerGetAttributes  %.2f us\n", host_us([&] {
                cudaPointerAttributes attr{};
                cudaPointerGetAttributes(&attr, buffer);
              }));
  std::printf("cudaGetDevice+Attribute   %.2f us\n", host_us([&] {
                int device = 0, pools = 0;
                cudaGetDevice(&device);
                cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device);
              }));
  std::printf("cudaMallocAsync+FreeAsync %.2f us\n", host_us([&] {
                void* workspace = nullptr;
                cudaMallocAsync(&workspace, kWorkspaceBytes, stream);
                cudaFreeAsync(workspace, stream);
              }));
  std::printf("cudaFuncSetAttribute      %.2f us\n", host_us([&] {
                cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     kSharedBytes);
              }));
  std::printf("launch empty              %.2f us\n",
              host_us([&] { empty_kernel<<<1, 32, 0, stream>>>(); }));
  cudaStreamSynchronize(stream);
  cudaFree(buffer);
  cudaStreamDestroy(stream);
}
