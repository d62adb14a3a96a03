/// \file launch.cuh
/// \brief Launching a kernel that needs more than the default 48 KiB of
/// dynamic shared memory, the same way in every tiled stage, and the SM count
/// a grid is sized by. Host code in .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "cuda_check.h"
#include "stage.h"

namespace flashstep {

/// Opts `kernel` in to `smem_bytes` of dynamic shared memory (needed above
/// 48 KiB), launches it on `stream` with `args`, and turns a failure of either
/// into an Error naming `what` (e.g. "stage 05 backward_kernel").
template <typename... Params, typename... Args>
void launch_with_smem(void (*kernel)(Params...), dim3 grid, int threads, std::size_t smem_bytes,
                      Stream stream, const char* what, Args... args) {
  cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem_bytes)),
             (std::string(what) + ": cudaFuncSetAttribute(MaxDynamicSharedMemorySize)").c_str());
  kernel<<<grid, threads, smem_bytes, stream>>>(args...);
  check_launch(what);
}

/// The current device's SMs: what a persistent grid (stage 08) or a wave of
/// split blocks (stage 09) is sized by.
inline int device_sm_count() {
  int device = 0, sms = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "SM count");
  return sms;
}

}  // namespace flashstep
