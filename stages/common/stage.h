/// \file stage.h
/// \brief The contract every stage implements, and the registry that lists them.
///
/// CUDA-free: a stream is passed as the opaque `cudaStream_t` handle type,
/// declared here the way the CUDA runtime declares it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cost.h"
#include "problem.h"

struct CUstream_st;

namespace flashstep {

/// A CUDA stream (the runtime's cudaStream_t), without including CUDA headers.
using Stream = CUstream_st*;

/// Device pointers of one forward run, row-major and contiguous. Q, K, V and O
/// hold elements of p.dtype (float, __half or __nv_bfloat16 on the device:
/// a stage casts them to that type where it reads or writes them); L is fp32
/// in every type.
struct ForwardTensors {
  const void* Q = nullptr;   ///< [B, H, Nq, d], p.dtype
  const void* K = nullptr;   ///< [B, H_kv, Nk, d], p.dtype
  const void* V = nullptr;   ///< [B, H_kv, Nk, d], p.dtype
  void* O = nullptr;         ///< [B, H, Nq, d], p.dtype
  float* L = nullptr;        ///< [B, H, Nq]; may be null for a stage that does not write it
  void* workspace = nullptr; ///< Stage::workspace_bytes(problem) bytes, 256-byte aligned
};

/// Whether a kernel may use 16-byte (float4-sized) accesses on these tensors:
/// every row of Q, K, V and O starts 16-byte aligned (d * p.elem_bytes() a
/// multiple of 16, so d % 4 == 0 in fp32 and d % 8 == 0 in fp16/bf16, and
/// aligned bases).
bool float4_ok(const Problem& p, const ForwardTensors& t);

/// Host pointers for a CPU mirror: the same layout as ForwardTensors, as fp32
/// arrays in every type. A mirror runs in p.dtype as its kernel does: in fp16
/// or bf16, Q, K and V hold that type's values (rounded as the runner rounds
/// them for the device), and O is written rounded to it; L stays fp32.
struct HostTensors {
  const float* Q = nullptr;  ///< [B, H, Nq, d]
  const float* K = nullptr;  ///< [B, H_kv, Nk, d]
  const float* V = nullptr;  ///< [B, H_kv, Nk, d]
  float* O = nullptr;        ///< [B, H, Nq, d]
  float* L = nullptr;        ///< [B, H, Nq]
};

/// Device pointers of one backward run, made after the forward ran on the same
/// Q, K, V (its O, L and workspace are what the backward reads). Row-major,
/// contiguous; Q, K, V, O, dO, dQ, dK and dV hold elements of p.dtype (as in
/// ForwardTensors), L is fp32. The loss is sum(O o dO), so dO is its gradient in O.
struct BackwardTensors {
  const void* Q = nullptr;    ///< [B, H, Nq, d], p.dtype
  const void* K = nullptr;    ///< [B, H_kv, Nk, d], p.dtype
  const void* V = nullptr;    ///< [B, H_kv, Nk, d], p.dtype
  const void* O = nullptr;    ///< [B, H, Nq, d], p.dtype, the forward's output
  const float* L = nullptr;   ///< [B, H, Nq], the forward's logsumexp
  const void* dO = nullptr;   ///< [B, H, Nq, d], p.dtype, dLoss/dO
  void* dQ = nullptr;         ///< [B, H, Nq, d], p.dtype, written
  void* dK = nullptr;         ///< [B, H_kv, Nk, d], p.dtype, written: summed over a group
  void* dV = nullptr;         ///< [B, H_kv, Nk, d], p.dtype, written: summed over a group
  /// The forward's workspace as the forward left it: what a stage saves for its
  /// backward, as autograd saves tensors (stage 02: P). Read only.
  const void* saved = nullptr;
  void* workspace = nullptr;  ///< Stage::backward_workspace_bytes(problem) bytes, 256-byte aligned
};

/// Host pointers for a CPU mirror of a backward pass: the same layout.
struct HostBackwardTensors {
  const float* Q = nullptr;   ///< [B, H, Nq, d]
  const float* K = nullptr;   ///< [B, H, Nk, d]
  const float* V = nullptr;   ///< [B, H, Nk, d]
  const float* O = nullptr;   ///< [B, H, Nq, d]
  const float* L = nullptr;   ///< [B, H, Nq]
  const float* dO = nullptr;  ///< [B, H, Nq, d]
  float* dQ = nullptr;        ///< [B, H, Nq, d]
  float* dK = nullptr;        ///< [B, H, Nk, d]
  float* dV = nullptr;        ///< [B, H, Nk, d]
};

/// Launches the stage's kernel(s) on `stream`. Throws flashstep::Error on an
/// invalid problem or a CUDA error; never returns silently without output.
using ForwardFn = void (*)(const Problem&, const ForwardTensors&, Stream);
/// Device scratch memory (bytes) the stage needs beyond Q, K, V, O, L.
using WorkspaceFn = std::int64_t (*)(const Problem&);
/// The stage's closed-form traffic and FLOP model.
using ModelFn = Cost (*)(const Problem&);
/// Runs the stage's algorithm on the host, same loops and tiles as the kernel,
/// writing O and L and returning what it counted.
using MirrorFn = Cost (*)(const Problem&, const HostTensors&);
/// Launches the stage's backward kernel(s) on `stream`: dQ, dK and dV from
/// Q, K, V, O, L, dO and what the forward saved. Throws like ForwardFn.
using BackwardFn = void (*)(const Problem&, const BackwardTensors&, Stream);
/// The backward's algorithm on the host, writing dQ, dK, dV and counting.
using BackwardMirrorFn = Cost (*)(const Problem&, const HostBackwardTensors&);

/// One registered stage (or a variant of one, such as 06's split-K).
struct Stage {
  std::string_view name;         ///< unique key and folder slug, e.g. "02_safe_softmax"
  std::string_view title;        ///< one line for tables, e.g. "safe softmax"
  bool writes_lse = false;       ///< whether it writes L (logsumexp)
  ForwardFn forward = nullptr;   ///< the GPU forward pass
  WorkspaceFn workspace_bytes = nullptr;  ///< scratch it needs
  ModelFn model = nullptr;       ///< traffic and FLOPs, closed form
  MirrorFn mirror = nullptr;     ///< CPU mirror, or null when the stage has none
  BackwardFn backward = nullptr;  ///< the GPU backward pass, or null when the stage has none
  WorkspaceFn backward_workspace_bytes = nullptr;  ///< scratch the backward needs
  ModelFn backward_model = nullptr;  ///< the backward's traffic and FLOPs, closed form
  BackwardMirrorFn backward_mirror = nullptr;  ///< CPU mirror of the backward, or null
  std::string_view known_failure;  ///< empty, or what it knowingly gets wrong
  /// The element types the forward runs in, its native one first (what the
  /// CLI runs it in unless told otherwise). fp32 unless a stage says more.
  std::vector<DType> dtypes = {DType::kFp32};
  /// The element types the backward runs in (when there is one).
  std::vector<DType> backward_dtypes = {DType::kFp32};
  /// The GPU architecture the kernels need, as compute capability x 10: 0 for
  /// any GPU the build targets (CMAKE_CUDA_ARCHITECTURES), 90 for exactly a
  /// Hopper GPU (compute capability 9.0) with its arch-specific features
  /// (sm_90a: wgmma, setmaxnreg), whose machine code runs on no other chip.
  int arch = 0;
  /// Whether this build compiled the kernels for `arch` (false: e.g. a CUDA
  /// compiler too old for sm_90a; the stage is then registered but unavailable).
  bool arch_built = true;
  /// Whether the forward runs grouped-query problems (H_kv < H): query head
  /// h reads K/V head h / (H / H_kv).
  bool grouped_heads = false;
  /// Whether the backward runs them too: dK and dV of a K/V head summed over
  /// the H / H_kv query heads of its group. Only with grouped_heads (the
  /// backward needs the forward's O and L).
  bool grouped_backward = false;

  /// Whether the forward runs in `t`.
  bool supports(DType t) const;
  /// Whether the stage has a backward and it runs in `t`.
  bool backward_supports(DType t) const;
};

/// Throws flashstep::Error unless `stage`'s forward (or, with `backward`, its
/// backward) runs in `t`; the message names the types it has, e.g. "stage
/// 04_fa2_q_outer does not run in bf16 (it runs in fp32)".
void require_dtype(const Stage& stage, DType t, bool backward = false);

/// Throws flashstep::Error, in one line, when p has fewer K/V heads than
/// query heads (p.grouped()) and `stage`'s forward (Stage::grouped_heads) or,
/// with `backward`, its backward (Stage::grouped_backward) does not run
/// grouped-query problems. The runners call it beside require_dtype, so no
/// stage checks it itself.
void require_heads(const Stage& stage, const Problem& p, bool backward = false);

/// "fp32", "fp16, bf16": a list of types for messages.
std::string dtype_list(const std::vector<DType>& types);

/// Every registered stage, in stage order. Built from the list in
/// stages/CMakeLists.txt: adding a stage is adding its folder and one line there.
const std::vector<Stage>& all_stages();

/// Finds stages by a selector: an exact name ("06_warp_split_k"), a number
/// prefix ("03" or "3"), or "all". Throws flashstep::Error when nothing matches.
std::vector<const Stage*> select_stages(std::string_view selector);

}  // namespace flashstep
