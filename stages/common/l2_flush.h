/// \file l2_flush.h
/// \brief Emptying L2 between timed runs, without leaving it dirty. CUDA-free
/// header; the kernel is in l2_flush.cu.
#pragma once

#include <cstdint>

#include "stage.h"

namespace flashstep {

/// The flush buffer is this many times the L2 size, so that reading it all
/// evicts every line a timed run could find there.
inline constexpr std::int64_t kL2FlushFactor = 2;
/// Threads per block of the flush kernel.
inline constexpr int kL2FlushThreads = 256;
/// Blocks of the flush kernel: a grid-stride loop over the buffer, enough
/// blocks to keep every SM's loads in flight on any GPU of up to 1,024 SMs.
inline constexpr int kL2FlushBlocks = 4096;
/// Bytes allocated past the buffer for the kernel's sink (one 16-byte word,
/// keeping the allocation a whole number of the kernel's loads).
inline constexpr std::int64_t kL2FlushSinkBytes = 16;

/// Bytes to allocate for a flush of `bytes`: the buffer and the sink past it.
inline std::int64_t l2_flush_allocation(std::int64_t bytes) { return bytes + kL2FlushSinkBytes; }

/// Zero-fills an allocation of l2_flush_allocation(bytes) bytes on the current
/// device, as flush_l2 needs it (synchronous; once, before the timed runs).
void zero_l2_flush_buffer(void* buffer, std::int64_t bytes);

/// Reads `bytes` of `buffer` (16-byte aligned, a multiple of 16 bytes) once,
/// on `stream`. A flush that *reads* leaves L2 holding clean lines; one that
/// writes (a memset) leaves it full of dirty ones, and the next kernel then
/// pays for writing them back: on the H200 (60 MiB of L2) about 6 to 10 us
/// added to every timed run, a fifth of a 40 us decode (cuDNN's bf16
/// decoding kernel, measured: docs/results/tuning_09/README.md, run 11).
/// The timed runs start from what a profiler's cache control gives: an L2
/// with none of their data and nothing to write back. The dirty lines a run
/// leaves behind (its outputs) are written back during the next flush,
/// outside the timed region. `buffer` holds l2_flush_allocation(bytes)
/// bytes, zero-filled (zero_l2_flush_buffer); the sink past `bytes` is
/// written only if a thread's XOR of its words is not 0, which keeps the
/// loads from being dropped.
void flush_l2(void* buffer, std::int64_t bytes, Stream stream);

}  // namespace flashstep
