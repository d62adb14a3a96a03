// Stage 07's backward: FlashAttention-2's Algorithm 2 on tensor cores, bf16
// or fp16 (tensor_core_backward.cuh holds the kernels and says where P and
// dS live). Two variants, two registry entries: dQ by fp32 atomic adds and a
// conversion pass (FlashAttention-2's way; 07_tensor_core), or by a separate
// kernel over the K/V blocks that sums every dQ element in one order
// (07_tensor_core_deterministic), at the cost of S and dP computed twice.
//
// Run it:
//   ./build/stages/cli/flashstep --stage 07_tensor_core --backward --dtype bf16 --N 4096 --d 128
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "common/cuda_check.h"
#include "common/error.h"
#include "common/launch.cuh"
#include "tensor_core.h"
#include "tensor_core_backward.cuh"

namespace flashstep::tensor_core {

namespace {

// The workspace: D and L in log2 units ([heads, Nq] fp32 each), then the
// atomic variant's fp32 dQ accumulator [heads, dq_accum_rows(Nq), bucket]
// (padded: tensor_core_backward_tiles.h), each 256-byte aligned.
constexpr std::int64_t kAlign = 256;
std::int64_t aligned_bytes(std::int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
std::int64_t row_bytes(const Problem& p) { return aligned_bytes(p.lse_elems() * 4); }
std::int64_t dq_accum_bytes(const Problem& p) {
  return p.heads() * bwd::dq_accum_rows(p.Nq) * head_dim_bucket(p.d) * 4;
}

template <typename Elem>
bwd::BackwardParams<Elem> make_backward_params(const Problem& p, const BackwardTensors& t) {
  auto aligned = [](const void* ptr) {
    return reinterpret_cast<std::uintptr_t>(ptr) % sm80::kChunkBytes == 0;
  };
  bwd::BackwardParams<Elem> prm;
  prm.Q = static_cast<const Elem*>(t.Q);
  prm.K = static_cast<const Elem*>(t.K);
  prm.V = static_cast<const Elem*>(t.V);
  prm.O = static_cast<const Elem*>(t.O);
  prm.L = t.L;
  prm.dO = static_cast<const Elem*>(t.dO);
  prm.dQ = static_cast<Elem*>(t.dQ);
  prm.dK = static_cast<Elem*>(t.dK);
  prm.dV = static_cast<Elem*>(t.dV);
  auto* ws = static_cast<unsigned char*>(t.workspace);
  prm.D = reinterpret_cast<float*>(ws);
  prm.L_log2 = reinterpret_cast<float*>(ws + row_bytes(p));
  prm.dQ_accum = reinterpret_cast<float*>(ws + 2 * row_bytes(p));
  prm.heads = p.heads();
  prm.kv_heads = p.B * p.kv_heads();
  prm.G = static_cast<int>(p.group());
  prm.Nq = static_cast<int>(p.Nq);
  prm.Nk = static_cast<int>(p.Nk);
  prm.d = static_cast<int>(p.d);
  prm.causal = p.causal;
  prm.scale = static_cast<float>(p.softmax_scale());
  prm.scale_log2 = static_cast<float>(p.softmax_scale() * kLog2e);
  prm.vec = p.d % sm80::kChunkElems == 0 && aligned(t.Q) && aligned(t.K) && aligned(t.V) &&
            aligned(t.dO);
  return prm;
}

// Blocks of the elementwise passes: enough to fill the GPU, then grid-stride.
constexpr std::int64_t kMaxPassBlocks = 65535;
constexpr int kPassThreads = 256;

template <typename Elem, int kHeadDim, bool kAtomicDQ>
void launch_bucket(const Problem& p, const BackwardTensors& t, Stream stream) {
  using C = bwd::BackwardConfig<kHeadDim, kAtomicDQ>;
  const auto prm = make_backward_params<Elem>(p, t);
  const std::int64_t rows = p.heads() * p.Nq;
  const auto prep_blocks = static_cast<unsigned>(
      std::min((rows + bwd::kPrepRowsPerBlock - 1) / bwd::kPrepRowsPerBlock, kMaxPassBlocks));
  if constexpr (kAtomicDQ) {  // padding included: the atomic adds read every element they add to
    cuda_check(cudaMemsetAsync(prm.dQ_accum, 0, static_cast<std::size_t>(dq_accum_bytes(p)), stream),
               "stage 07 backward: zeroing dQ's accumulator");
  }
  bwd::prepare_kernel<Elem><<<prep_blocks, bwd::kPrepRowsPerBlock * kWarpSize, 0, stream>>>(prm);
  check_launch("stage 07 backward: D pre-pass");
  // The (dK, dV) kernel runs per K/V head (its group's query heads inside),
  // the dQ kernel per query head.
  const unsigned kv_heads_y = static_cast<unsigned>(std::min(prm.kv_heads, bwd::kMaxGridY));
  const unsigned heads_y = static_cast<unsigned>(std::min(p.heads(), bwd::kMaxGridY));
  const std::int64_t Tc = (p.Nk - 1) / C::kBc + 1;
  launch_with_smem(bwd::dkdv_kernel<Elem, C>,
                   dim3(static_cast<unsigned>(Tc), kv_heads_y), C::kThreads,
                   C::smem_bytes(),
                   stream, "stage 07 backward: dK, dV kernel", prm);
  if constexpr (kAtomicDQ) {
    const auto blocks = static_cast<unsigned>(
        std::min((p.q_elems() + kPassThreads - 1) / kPassThreads, kMaxPassBlocks));
    bwd::convert_dq_kernel<Elem, kHeadDim><<<blocks, kPassThreads, 0, stream>>>(prm);
    check_launch("stage 07 backward: dQ conversion");
  } else {
    using D = bwd::DQConfig<kHeadDim>;
    const std::int64_t Tr = (p.Nq - 1) / bwd::kBr + 1;
    launch_with_smem(bwd::dq_kernel<Elem, D>, dim3(static_cast<unsigned>(Tr), heads_y),
                     D::kThreads, D::kSmemBytes, stream, "stage 07 backward: dQ kernel", prm);
  }
}

template <typename Elem, bool kAtomicDQ>
void launch_typed(const Problem& p, const BackwardTensors& t, Stream stream) {
  switch (head_dim_bucket(p.d)) {  // d is zero-padded up to the bucket inside the tiles
    case 64: launch_bucket<Elem, 64, kAtomicDQ>(p, t, stream); break;
    case 128: launch_bucket<Elem, 128, kAtomicDQ>(p, t, stream); break;
    default: launch_bucket<Elem, 256, kAtomicDQ>(p, t, stream); break;
  }
}

}  // namespace

std::int64_t backward_workspace_bytes(const Problem& p) {
  return 2 * row_bytes(p) + aligned_bytes(dq_accum_bytes(p));
}

std::int64_t deterministic_backward_workspace_bytes(const Problem& p) { return 2 * row_bytes(p); }

template <bool kAtomicDQ>
void backward(const Problem& p, const BackwardTensors& t, Stream stream) {
  validate(p);
  if (!t.Q || !t.K || !t.V || !t.O || !t.L || !t.dO || !t.dQ || !t.dK || !t.dV || !t.workspace) {
    throw Error("stage 07 backward: null tensor pointer");
  }
  // dkdv_kernel counts a group's (query head, Q block) pairs in an int, which
  // keeps its loop within the registers it had before grouped heads.
  const std::int64_t pairs = p.group() * ((p.Nq - 1) / bwd::kBr + 1);
  if (pairs > std::numeric_limits<int>::max()) {
    throw Error("stage 07 backward: " + std::to_string(p.group()) + " query heads per K/V head" +
                " times " + std::to_string((p.Nq - 1) / bwd::kBr + 1) + " Q blocks of " +
                std::to_string(bwd::kBr) + " rows is more than one thread block counts (2^31 - 1)");
  }
  if (p.dtype == DType::kBf16) {
    launch_typed<__nv_bfloat16, kAtomicDQ>(p, t, stream);
  } else if (p.dtype == DType::kFp16) {
    launch_typed<__half, kAtomicDQ>(p, t, stream);
  } else {
    throw Error("stage 07 backward: no kernel for " + std::string(dtype_name(p.dtype)));
  }
}

template void backward<true>(const Problem&, const BackwardTensors&, Stream);
template void backward<false>(const Problem&, const BackwardTensors&, Stream);

}  // namespace flashstep::tensor_core
