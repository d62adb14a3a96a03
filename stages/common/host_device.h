/// \file host_device.h
/// \brief FLASHSTEP_HOST_DEVICE: marks a function that runs on both sides, so
/// one header (the partial merge, the causal tile classification) serves the
/// kernels, their CPU mirrors and the tests. Empty when a host compiler reads it.
#pragma once

#if defined(__CUDACC__)
#define FLASHSTEP_HOST_DEVICE __host__ __device__
#else
#define FLASHSTEP_HOST_DEVICE
#endif
