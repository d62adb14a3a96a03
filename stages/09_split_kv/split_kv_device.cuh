/// \file split_kv_device.cuh
/// \brief What stage 09's kernels share: their arguments (Params), where a
/// K/V tile is read from (contiguous or paged cache), and the programmatic
/// dependent launch that lets one kernel start behind the one before it.
/// Included by split_kv.cu (the CUDA-core and mma.sync kernels, the merge)
/// and split_kv_sm90.cu (the Hopper kernel for wide groups).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/cuda_check.h"
#include "common/launch.cuh"
#include "split_kv_plan.h"

namespace flashstep::split_kv {

// ln(2): L = (m + log2 l) ln 2, with m and l in log2 units.
constexpr float kLn2 = 0.6931471805599453f;

// Elem: float, __half or __nv_bfloat16 (common/element.cuh).
template <typename Elem>
struct Params {
  const Elem* Q;        // [B, H, Nq, d]
  const Elem* K;        // [B, H_kv, Nk, d], or paged [pages, H_kv, page_keys, d] (cache)
  const Elem* V;        // the same layout as K
  Elem* O;              // [B, H, Nq, d]
  float* L;             // [B, H, Nq]
  float* O_part;        // [splits, B * H, Nq, d], with splits > 1
  float* L_part;        // [splits, B * H, Nq], with splits > 1
  const std::int32_t* seqlens;  // [B] keys of each sequence (KV cache), or null: Nk each
  CacheLayout cache;            // where K and V keep their keys: contiguous or paged
  int new_keys;                 // keys appended to each sequence before this call: 0 or Nq
  std::int64_t H, H_kv;
  std::int64_t kv_heads;  // B * H_kv
  std::int64_t heads;     // B * H
  int Nq, Nk, d;
  std::int64_t group_rows, row_tiles, splits, keys_per_split;
  float scale_log2;  // softmax scale * log2(e); any sign: each score is scaled, not the max
  bool causal;
  bool vec;  // 16-byte rows (d * sizeof(Elem) % 16 == 0), aligned tensors: K/V by 16-byte cp.async
};

// Programmatic dependent launch (sm_90): a kernel launched with the
// attribute that allows it (launch_dependent) may start once every block of
// the kernel before it on the stream has called let_next_kernel_launch,
// which each does as it starts; its blocks are then placed and waiting
// while the last blocks of the one before finish, instead of being launched
// after them. It calls wait_for_previous_kernel before it reads what that
// kernel writes: that waits until the kernel before has ended and its
// writes are visible. So the merge kernel waits on the split kernel before
// it reads a partial, and the split kernel, after an append, on the append
// before it reads the cache. Below sm_90, or launched without the
// attribute, both are no-ops.
__device__ __forceinline__ void let_next_kernel_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Keys a sequence of the batch holds: its cache length plus the keys appended
// in this call, clamped to the cache (so no read leaves it), or all Nk.
template <typename Elem>
__device__ int sequence_keys(const Params<Elem>& p, std::int64_t b) {
  return p.seqlens ? min(max(p.seqlens[b] + p.new_keys, 0), p.Nk) : p.Nk;
}

// Where K/V head kvh's tiles are read from. Contiguous: the head's [Nk, d]
// block (head_base), key kt at row kt of it. Paged: the pool, key kt's page
// looked up (cache_row). A tile's keys are consecutive rows from there in
// either layout: with a paged cache every tile lies inside one page
// (kPageKeyMultiple). `width` is the row's elements (p.d; kD where the
// caller knows they are equal, so that the contiguous offset is the
// constant-stride one the copies had before the paged layout). The split
// kernels are compiled for each layout (kPaged), so that the contiguous one
// carries none of the page lookup: with a first, 64-bit lookup in every
// kernel, the 16-bit kernel at d = 64, held to 168 registers, spilled 64
// bytes where it spilled 24 (cache_row now divides in 32 bits, and the
// paged kernels spill what the contiguous ones do).
template <bool kPaged, typename Elem>
__device__ std::int64_t head_base(const Params<Elem>& p, std::int64_t kvh) {
  return kPaged ? 0 : kvh * p.Nk * p.d;
}

template <bool kPaged, typename Elem>
__device__ std::int64_t tile_offset(const Params<Elem>& p, std::int64_t kvh, int kt, int width) {
  if constexpr (kPaged) return cache_row(p.cache, kvh, p.H_kv, p.Nk, kt) * width;
  return static_cast<std::int64_t>(kt) * width;
}

// What one unit of work (split_kv_plan.h) covers: the rows r0 .. r0 + rows - 1
// of its K/V head's group (a tile of tile_rows, the last one cut at
// group_rows), and split s's keys [k_lo, k_hi) of a sequence of nk keys, in
// `tiles` K/V tiles of kTileKeys (none where the split lies past nk). 32-bit
// keys, as Nk < 2^31. Each split kernel takes its units in its own order.
struct UnitSpan {
  int rows, k_lo, k_hi, tiles;
};
template <int kTileKeys, typename Elem>
__device__ inline UnitSpan unit_span(const Params<Elem>& p, std::int64_t r0, int tile_rows,
                                     std::int64_t s, int nk) {
  const int rows = static_cast<int>(min(static_cast<std::int64_t>(tile_rows), p.group_rows - r0));
  const int k_lo = static_cast<int>(s * p.keys_per_split);
  const int k_hi = static_cast<int>(min(k_lo + p.keys_per_split, static_cast<std::int64_t>(nk)));
  return {rows, k_lo, k_hi, k_hi > k_lo ? (k_hi - k_lo - 1) / kTileKeys + 1 : 0};
}

// Whether the current device launches dependent grids early (sm_90 on).
inline bool device_has_dependent_launch() {
  int device = 0, major = 0;
  cuda_check(cudaGetDevice(&device), "stage 09: cudaGetDevice");
  cuda_check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
             "stage 09: compute capability");
  return major >= 9;
}

// Launches kernel(prm) on `stream` with smem_bytes of dynamic shared memory
// (opted in to above 48 KiB); with `early`, on sm_90, with programmatic
// stream serialization, so that its blocks may start while the kernel before
// it on the stream finishes (let_next_kernel_launch, wait_for_previous_kernel).
template <typename Elem>
void launch_dependent(void (*kernel)(Params<Elem>), dim3 grid, int threads, std::size_t smem_bytes,
                      Stream stream, const char* what, const Params<Elem>& prm, bool early) {
  if (smem_bytes > 0) {
    cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem_bytes)),
               what);
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = early && device_has_dependent_launch() ? 1 : 0;
  cuda_check(cudaLaunchKernelEx(&config, kernel, prm), what);
}

// The Hopper kernel for wide groups (split_kv_sm90.cu, built for sm_90a where
// the compiler has it: FLASHSTEP_SM90A_BUILT).
//
// Whether the current device runs sm_90a code (compute capability 9.0).
bool device_takes_wgmma();
// Launches split_wgmma_kernel for prm (prm.row_tiles in kWideRows tiles),
// Elem __half or __nv_bfloat16.
template <typename Elem>
void launch_split_wgmma(const Params<Elem>& prm, Stream stream);
// Blocks of split_wgmma_kernel one SM of the current device holds.
int wgmma_occupancy();

}  // namespace flashstep::split_kv
