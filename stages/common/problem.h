/// \file problem.h
/// \brief The attention problem every stage solves: shapes, causal flag, softmax scale.
///
/// CUDA-free: tests, the CLI, the fp64 reference and the CPU mirrors include it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "host_device.h"

namespace flashstep {

/// Largest head dimension any stage must support (the contract: 1 <= d <= 256).
inline constexpr std::int64_t kMaxHeadDim = 256;

/// The head-dimension bucket d (1..256) is zero-padded up to inside the tiled
/// kernels (stages 03-06 and the backward): one compiled instance per bucket,
/// so a d between buckets pays for the next bucket's tiles.
constexpr int head_dim_bucket(std::int64_t d) { return d <= 64 ? 64 : d <= 128 ? 128 : 256; }

/// The element type of Q, K, V and O (and of dO, dQ, dK, dV): what a stage
/// reads and writes in HBM. L, the softmax statistics and every accumulator
/// stay fp32 in every type, as in FlashAttention.
enum class DType { kFp32, kFp16, kBf16 };

/// "fp32", "fp16" or "bf16".
std::string_view dtype_name(DType t);

/// The type a name gives: "fp32", "fp16" or "bf16". Throws flashstep::Error
/// naming the three for anything else.
DType parse_dtype(std::string_view name);

/// Bytes of one element: 4 for fp32, 2 for fp16 and bf16.
constexpr std::int64_t dtype_bytes(DType t) { return t == DType::kFp32 ? 4 : 2; }

/// Bytes of one fp32 value: L, the statistics l and m, and the fp32
/// workspaces, in every element type.
inline constexpr std::int64_t kFloatBytes = 4;

/// The K/V head that query head `bh` reads, both counted over the batch
/// (bh in 0..B*H-1, the result in 0..B*H_kv-1): grouped-query attention puts
/// H / H_kv consecutive query heads in one group, and query head h of batch b
/// reads K/V head h / (H / H_kv) of that batch. H_kv = H is multi-head
/// attention (every head its own K/V), H_kv = 1 multi-query attention.
FLASHSTEP_HOST_DEVICE constexpr std::int64_t kv_head_of(std::int64_t bh, std::int64_t H,
                                                       std::int64_t H_kv) {
  return (bh / H) * H_kv + (bh % H) / (H / H_kv);
}

/// One attention forward problem. Tensors are row-major and contiguous:
/// Q [B, H, Nq, d], K and V [B, H_kv, Nk, d], O [B, H, Nq, d] in `dtype`;
/// L [B, H, Nq] in fp32.
struct Problem {
  std::int64_t B = 1;   ///< batch
  std::int64_t H = 1;   ///< heads
  std::int64_t Nq = 1;  ///< query length
  std::int64_t Nk = 1;  ///< key (and value) length
  std::int64_t d = 64;  ///< head dimension
  bool causal = false;  ///< bottom-right aligned causal mask
  std::optional<double> scale;  ///< softmax scale; 1/sqrt(d) when unset
  DType dtype = DType::kFp32;   ///< element type of Q, K, V and O
  /// K/V heads (grouped-query attention): H a multiple of it; H when unset.
  /// Last in the struct so that code naming the fields above is unchanged.
  std::optional<std::int64_t> H_kv;

  /// The scale applied to Q K^T: the one given, or 1/sqrt(d).
  double softmax_scale() const;

  std::int64_t elem_bytes() const { return dtype_bytes(dtype); }  ///< bytes of one Q, K, V, O element
  std::int64_t heads() const { return B * H; }             ///< B * H
  std::int64_t kv_heads() const { return H_kv.value_or(H); }  ///< H_kv, or H when unset
  std::int64_t group() const { return H / kv_heads(); }    ///< query heads per K/V head
  bool grouped() const { return kv_heads() != H; }         ///< fewer K/V heads than query heads
  /// The K/V head (of B * H_kv) that query head bh (of B * H) reads.
  std::int64_t kv_head(std::int64_t bh) const { return kv_head_of(bh, H, kv_heads()); }
  std::int64_t q_elems() const { return B * H * Nq * d; }  ///< elements of Q and of O
  std::int64_t kv_elems() const { return B * kv_heads() * Nk * d; } ///< elements of K and of V
  std::int64_t lse_elems() const { return B * H * Nq; }    ///< elements of L
  std::int64_t score_elems() const { return B * H * Nq * Nk; }  ///< elements of S (and P)

  /// Number of keys query row i may see: keys 0 .. visible_keys(i)-1.
  /// Causal (bottom-right aligned, FlashAttention >= 2.1): key j is visible
  /// iff j <= i + Nk - Nq. Non-causal: all Nk keys.
  std::int64_t visible_keys(std::int64_t i) const;

  /// Forward FLOPs by the FlashAttention benchmarks' convention:
  /// 4 * B * H * Nq * Nk * d, halved when causal.
  double forward_flops() const;

  /// Short human form, e.g. "B=1 H=8 Nq=1024 Nk=1024 d=64 causal"; the
  /// K/V heads are named when fewer than H ("B=1 H=8 H_kv=2 ..."), the
  /// element type when it is not fp32 ("... causal bf16").
  std::string describe() const;
};

/// Throws flashstep::Error naming the first field that breaks the contract
/// (sizes >= 1 and within 32-bit grid limits, H a multiple of H_kv, d <= kMaxHeadDim,
/// B*H*Nq*max(Nk,64)*max(d,64) <= 2^57 so that the int64 models count it,
/// a scale finite in fp32).
void validate(const Problem& p);

}  // namespace flashstep
