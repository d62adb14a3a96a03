// Stage 07's launcher, one template for every ablation step; each step_*.cu
// and tensor_core.cu instantiates it for its step, so that nvcc compiles the
// steps in parallel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <string>

#include "common/error.h"
#include "common/launch.cuh"
#include "tensor_core.cuh"
#include "tensor_core.h"

namespace flashstep::tensor_core {

/// The kernel's arguments for problem p on tensors t.
template <typename Elem>
Params<Elem> make_params(const Problem& p, const ForwardTensors& t) {
  constexpr std::uintptr_t kChunkAlign = sm80::kChunkBytes;
  auto aligned = [](const void* ptr) {
    return reinterpret_cast<std::uintptr_t>(ptr) % kChunkAlign == 0;
  };
  Params<Elem> prm;
  prm.Q = static_cast<const Elem*>(t.Q);
  prm.K = static_cast<const Elem*>(t.K);
  prm.V = static_cast<const Elem*>(t.V);
  prm.O = static_cast<Elem*>(t.O);
  prm.L = t.L;
  prm.heads = p.heads();
  prm.H = p.H;
  prm.H_kv = p.kv_heads();
  prm.Nq = static_cast<int>(p.Nq);
  prm.Nk = static_cast<int>(p.Nk);
  prm.d = static_cast<int>(p.d);
  prm.causal = p.causal;
  // The kernel takes each row's max over the raw scores and scales it once
  // (one FFMA per score, as FlashAttention-2 does), which is right for a
  // positive scale only. A negative scale c runs as |c| on -Q, whose sign
  // the kernel flips once per Q tile in shared memory. A scale of 0 (every
  // logit 0: uniform weights over the visible keys) runs as the smallest
  // normal float: each visible logit then still rounds to exactly 0 in the
  // exponential (ex2.approx.ftz flushes the tiny products to zero), while a
  // masked key's -inf stays -inf instead of becoming -inf * 0 = NaN.
  const float scale_log2 = static_cast<float>(std::fabs(p.softmax_scale()) * kLog2e);
  prm.scale_log2 = scale_log2 == 0.0f ? FLT_MIN : scale_log2;
  prm.negate_q = p.softmax_scale() < 0.0;
  // Rows start on 16-byte boundaries when d is a multiple of 8 elements.
  prm.vec = p.d % sm80::kChunkElems == 0 && aligned(t.Q) && aligned(t.K) && aligned(t.V) &&
            aligned(t.O);
  return prm;
}

/// Launches the kernel of configuration C on `stream`. C's tile shape is the
/// step's own here; tests/bench/tile_sweep.cu passes others.
template <typename Elem, typename C>
void launch_config(const Problem& p, const ForwardTensors& t, Stream stream, const char* what) {
  // Grid x: Tr <= ceil((2^31 - 1) / 64) Q blocks, inside x's 2^31 - 1.
  const std::int64_t Tr = (p.Nq - 1) / C::kBr + 1;
  const dim3 grid(static_cast<unsigned>(Tr), static_cast<unsigned>(std::min(p.heads(), kMaxGridY)));
  launch_with_smem(tensor_core_kernel<Elem, C>, grid, C::kThreads, C::kSmemElems * sizeof(Elem),
                   stream, what, make_params<Elem>(p, t));
}

template <typename Elem, int kHeadDim, Step kStep>
void launch(const Problem& p, const ForwardTensors& t, Stream stream) {
  const std::string what = "stage 07 " + std::string(step_slug(kStep)) + " kernel";
  launch_config<Elem, Config<kHeadDim, kStep>>(p, t, stream, what.c_str());
}

template <typename Elem, Step kStep>
void launch_bucket(const Problem& p, const ForwardTensors& t, Stream stream) {
  switch (head_dim_bucket(p.d)) {  // d is zero-padded up to the bucket inside the tiles
    case 64: launch<Elem, 64, kStep>(p, t, stream); break;
    case 128: launch<Elem, 128, kStep>(p, t, stream); break;
    default: launch<Elem, 256, kStep>(p, t, stream); break;
  }
}

template <Step kStep>
void forward(const Problem& p, const ForwardTensors& t, Stream stream) {
  validate(p);
  if (!t.Q || !t.K || !t.V || !t.O || !t.L) throw Error("stage 07: null tensor pointer");
  // The registry says which types each step runs in (tensor_core_model.cpp);
  // DeviceRun and the C ABI refuse the others before they get here.
  if (p.dtype == DType::kBf16) {
    launch_bucket<__nv_bfloat16, kStep>(p, t, stream);
  } else if (p.dtype == DType::kFp16 && kStep == Step::kTunedTiles) {
    launch_bucket<__half, kStep>(p, t, stream);
  } else {
    throw Error("stage 07 " + std::string(step_slug(kStep)) + ": no kernel for " +
                std::string(dtype_name(p.dtype)));
  }
}

}  // namespace flashstep::tensor_core
