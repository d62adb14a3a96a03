/// \file cuda_check.h
/// \brief Turning CUDA errors into flashstep::Error (host code only).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "error.h"

namespace flashstep {

/// Throws Error("<what>: <CUDA error string>") when `status` is not cudaSuccess.
inline void cuda_check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw Error(std::string(what) + ": " + cudaGetErrorString(status));
  }
}

/// After a kernel launch: a bad configuration shows up here, not at the launch.
inline void check_launch(const char* kernel) {
  cuda_check(cudaGetLastError(), kernel);
}

}  // namespace flashstep
