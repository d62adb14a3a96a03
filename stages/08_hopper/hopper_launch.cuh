// Stage 08's launcher, one template for every ablation step; each step_*.cu
// instantiates it for its step, so that nvcc compiles the steps in parallel.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "common/cuda_check.h"
#include "common/error.h"
#include "common/launch.cuh"
#include "hopper.cuh"
#include "hopper.h"

namespace flashstep::hopper {

/// The driver's cuTensorMapEncodeTiled, fetched through the runtime
/// (cudaGetDriverEntryPointByVersion) so that no binary links libcuda: the
/// CPU-only CI starts every binary, and only a run of step 2 needs the driver.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    cuda_check(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                cudaEnableDefault, &found),
               "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled)");
    if (found != cudaDriverEntryPointSuccess || !fn) {
      throw Error("stage 08: the CUDA driver has no cuTensorMapEncodeTiled");
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

/// The tensor map of a [heads, rows, d] array of Elem: 3-D (d, rows, heads),
/// innermost first, so that a box never runs into the next head (rows past
/// the end arrive as zeros); boxes of 64 columns (128 bytes, the widest the
/// 128-byte swizzle takes) x box_rows rows (kBr for Q, Bc for K and V; at
/// most 256) x 1 head.
template <typename Elem>
CUtensorMap make_tensor_map(const Elem* base, std::int64_t heads, int rows, int d, int box_rows) {
  constexpr int kElemBytes = 2;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(d), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(heads)};
  // Bytes between consecutive rows and heads (dimension 0 is contiguous).
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(d) * kElemBytes,
                                 static_cast<cuuint64_t>(rows) * d * kElemBytes};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(sm90::kSwizzleRowElems),
                             static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUtensorMapDataType type = std::is_same_v<Elem, __nv_bfloat16>
                                       ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                       : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  CUtensorMap map{};
  const CUresult r = tensor_map_encoder()(
      &map, type, 3, const_cast<Elem*>(base), dims, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    throw Error("stage 08: cuTensorMapEncodeTiled failed (CUresult " + std::to_string(r) + ")");
  }
  return map;
}

/// The kernel's arguments for problem p on tensors t.
template <typename Elem>
Params<Elem> make_params(const Problem& p, const ForwardTensors& t) {
  auto aligned = [](const void* ptr, std::uintptr_t bytes) {
    return reinterpret_cast<std::uintptr_t>(ptr) % bytes == 0;
  };
  Params<Elem> prm;
  prm.Q = static_cast<const Elem*>(t.Q);
  prm.K = static_cast<const Elem*>(t.K);
  prm.V = static_cast<const Elem*>(t.V);
  prm.O = static_cast<Elem*>(t.O);
  prm.L = t.L;
  prm.heads = p.heads();
  prm.group = static_cast<int>(p.group());
  prm.Nq = static_cast<int>(p.Nq);
  prm.Nk = static_cast<int>(p.Nk);
  prm.d = static_cast<int>(p.d);
  prm.causal = p.causal;
  // As stage 07: the max is taken over raw scores, right for a positive
  // scale; a negative one runs as |scale| on -Q (wgmma's imm-scale-a = -1),
  // a zero one as the smallest normal float.
  const float scale_log2 = static_cast<float>(std::fabs(p.softmax_scale()) * kLog2e);
  prm.scale_log2 = scale_log2 == 0.0f ? FLT_MIN : scale_log2;
  prm.negate_q = p.softmax_scale() < 0.0;
  prm.vec = p.d % 8 == 0 && aligned(t.Q, 16) && aligned(t.K, 16) && aligned(t.V, 16);
  prm.pairs = p.d % 2 == 0 && aligned(t.O, 4);
  return prm;
}

template <typename Elem, int kHeadDim, bool kTma>
void launch(const Problem& p, const ForwardTensors& t, Stream stream, const char* what) {
  using C = Config<kHeadDim, kTma>;
  const Params<Elem> prm = make_params<Elem>(p, t);
  TensorMaps maps{};
  if constexpr (kTma) {
    maps.q = make_tensor_map(prm.Q, p.heads(), prm.Nq, prm.d, kBr);
    maps.k = make_tensor_map(prm.K, p.B * p.kv_heads(), prm.Nk, prm.d, C::kBc);
    maps.v = make_tensor_map(prm.V, p.B * p.kv_heads(), prm.Nk, prm.d, C::kBc);
  }
  const std::int64_t Tr = (p.Nq - 1) / kBr + 1;
  const dim3 grid(static_cast<unsigned>(Tr), static_cast<unsigned>(std::min(p.heads(), kMaxGridY)));
  launch_with_smem(hopper_kernel<Elem, C>, grid, kThreads, C::kSmemBytes, stream, what, prm, maps);
}

/// Counters the causal launches at d = 64 (WsLptConfig) take their items
/// from (LptCursor), per device: allocated and zeroed on the device's first
/// such launch (so not under stream capture), never freed, each launch
/// taking the next round the pool; the kernel leaves its counter 0 again.
/// A pool rather than one counter, so that launches running at once on
/// several streams (or host threads) count apart: two collide only with
/// kLptCounters launches between them, or if one captured graph is
/// replayed on two streams at once.
inline constexpr int kLptCounters = 1024;
inline int* lpt_counter() {
  struct Pool {
    int* counters = nullptr;
    unsigned next = 0;
  };
  static std::mutex mutex;
  static std::map<int, Pool> pools;  // by device
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  const std::lock_guard<std::mutex> lock(mutex);
  Pool& pool = pools[device];
  if (!pool.counters) {
    cuda_check(cudaMalloc(&pool.counters, kLptCounters * sizeof(int)), "stage 08: item counters");
    cuda_check(cudaMemset(pool.counters, 0, kLptCounters * sizeof(int)), "stage 08: item counters");
  }
  return pool.counters + pool.next++ % kLptCounters;
}

/// The kernel of steps 3-5: blocks of 128 rows and three warpgroups, or of
/// 192 rows and four at d = 64, one block per SM (their registers and
/// shared memory allow no second), a persistent grid of at most one block
/// per SM, as FlashAttention-3's tile scheduler runs, each block taking
/// units of work in turn (ws_schedule, WsCursor; a causal problem at d = 64
/// lpt_schedule, WsLptConfig, LptCursor, one item a unit from a counter): a
/// block copies its next item's Qi and first K/V tiles while it finishes
/// the last one, instead of a new block starting cold.
template <typename Elem, typename C>
void launch_ws(const Problem& p, const ForwardTensors& t, Stream stream, const char* what) {
  Params<Elem> prm = make_params<Elem>(p, t);
  const std::int64_t Tr = (p.Nq - 1) / C::kBlockRows + 1;
  const WsSchedule work = ws_schedule(Tr, p.heads(), p.causal);
  // With kLpt (causal only) one item a unit, FlashAttention-3's sections of
  // heads and a counter (LptCursor).
  const std::int64_t units = C::kLpt ? Tr * p.heads() : work.units;
  if (units > INT_MAX) throw Error(std::string(what) + ": more work items than an int counts");
  prm.units_per_head = static_cast<int>(work.units_per_head);
  prm.paired_units = static_cast<int>(work.paired_units);
  prm.units = static_cast<int>(units);
  if constexpr (C::kLpt) {
    prm.section_heads =
        static_cast<int>(std::min(lpt_section_heads(p.Nk, p.d, p.group()), p.heads()));
    prm.item_counter = lpt_counter();
  }
  TensorMaps maps{};
  maps.q = make_tensor_map(prm.Q, p.heads(), prm.Nq, prm.d, kBr);
  maps.k = make_tensor_map(prm.K, p.B * p.kv_heads(), prm.Nk, prm.d, C::kBc);
  maps.v = make_tensor_map(prm.V, p.B * p.kv_heads(), prm.Nk, prm.d, C::kBc);
  if constexpr (C::kOutByTma) maps.o = make_tensor_map<Elem>(prm.O, p.heads(), prm.Nq, prm.d, kBr);
  const std::int64_t blocks = std::min<std::int64_t>(device_sm_count(), units);
  launch_with_smem(hopper_ws_kernel<Elem, C>, dim3(static_cast<unsigned>(blocks)), C::kBlockThreads, C::kSmemBytes,
                   stream, what, prm, maps);
}
/// d = 64 from step 3: a causal problem runs the dynamic order's kernel
/// (WsLptConfig), one without a mask main's (WsConfig: the hand-over alone
/// made it slower, tuning_08/lpt_ab.txt). d = 128 and 256: main's.
template <typename Elem, int kHeadDim, Step kStep>
void launch_ws_bucket(const Problem& p, const ForwardTensors& t, Stream stream, const char* what) {
  if constexpr (lpt_schedule(kStep, kHeadDim)) {
    if (p.causal) {
      launch_ws<Elem, WsLptConfig<kHeadDim, kStep>>(p, t, stream, what);
      return;
    }
  }
  launch_ws<Elem, WsConfig<kHeadDim, kStep>>(p, t, stream, what);
}

template <typename Elem, bool kTma>
void launch_bucket(const Problem& p, const ForwardTensors& t, Stream stream, const char* what) {
  switch (head_dim_bucket(p.d)) {  // d is zero-padded up to the bucket inside the tiles
    case 64: launch<Elem, 64, kTma>(p, t, stream, what); break;
    case 128: launch<Elem, 128, kTma>(p, t, stream, what); break;
    default: launch<Elem, 256, kTma>(p, t, stream, what); break;
  }
}

template <typename Elem, Step kStep>
void launch_step(const Problem& p, const ForwardTensors& t, Stream stream, const char* what) {
  // TMA needs 16-byte aligned bases and row strides (d % 8 == 0), and from
  // step 3 O is stored by TMA too; anything else runs step 1's kernel (the
  // same numbers row for row: a row's result does not depend on which rows
  // share its block).
  if constexpr (kStep >= Step::kWarpSpecialized) {
    if (make_params<Elem>(p, t).vec && reinterpret_cast<std::uintptr_t>(t.O) % 16 == 0) {
      switch (head_dim_bucket(p.d)) {
        case 64: launch_ws_bucket<Elem, 64, kStep>(p, t, stream, what); break;
        case 128: launch_ws_bucket<Elem, 128, kStep>(p, t, stream, what); break;
        default: launch_ws_bucket<Elem, 256, kStep>(p, t, stream, what); break;
      }
      return;
    }
  } else if constexpr (kStep >= Step::kTmaPipeline) {
    if (make_params<Elem>(p, t).vec) {
      launch_bucket<Elem, true>(p, t, stream, what);
      return;
    }
  }
  launch_bucket<Elem, false>(p, t, stream, what);
}

template <Step kStep>
void forward(const Problem& p, const ForwardTensors& t, Stream stream) {
  validate(p);
  if (!t.Q || !t.K || !t.V || !t.O || !t.L) throw Error("stage 08: null tensor pointer");
  const std::string what = "stage 08 " + std::string(step_slug(kStep)) + " kernel";
  if (p.dtype == DType::kBf16) {
    launch_step<__nv_bfloat16, kStep>(p, t, stream, what.c_str());
  } else if (p.dtype == DType::kFp16) {
    launch_step<__half, kStep>(p, t, stream, what.c_str());
  } else {
    throw Error(what + ": no kernel for " + std::string(dtype_name(p.dtype)));
  }
}

}  // namespace flashstep::hopper
