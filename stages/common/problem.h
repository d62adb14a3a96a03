/// \file problem.h
/// \brief The attention problem every stage solves: shapes, causal flag, softmax scale.
///
/// CUDA-free: tests, the CLI, the fp64 reference and the CPU mirrors include it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace flashstep {

/// Largest head dimension any stage must support (the contract: 1 <= d <= 256).
inline constexpr std::int64_t kMaxHeadDim = 256;

/// The head-dimension bucket d (1..256) is zero-padded up to inside the tiled
/// kernels (stages 03-06 and the backward): one compiled instance per bucket,
/// so a d between buckets pays for the next bucket's tiles.
constexpr int head_dim_bucket(std::int64_t d) { return d <= 64 ? 64 : d <= 128 ? 128 : 256; }

/// Bytes in one element: stages 01-06 are fp32 throughout.
inline constexpr std::int64_t kElemBytes = 4;

/// One attention forward problem. Tensors are row-major and contiguous:
/// Q [B, H, Nq, d], K and V [B, H, Nk, d], O [B, H, Nq, d], L [B, H, Nq].
struct Problem {
  std::int64_t B = 1;   ///< batch
  std::int64_t H = 1;   ///< heads
  std::int64_t Nq = 1;  ///< query length
  std::int64_t Nk = 1;  ///< key (and value) length
  std::int64_t d = 64;  ///< head dimension
  bool causal = false;  ///< bottom-right aligned causal mask
  std::optional<double> scale;  ///< softmax scale; 1/sqrt(d) when unset

  /// The scale applied to Q K^T: the one given, or 1/sqrt(d).
  double softmax_scale() const;

  std::int64_t heads() const { return B * H; }             ///< B * H
  std::int64_t q_elems() const { return B * H * Nq * d; }  ///< elements of Q and of O
  std::int64_t kv_elems() const { return B * H * Nk * d; } ///< elements of K and of V
  std::int64_t lse_elems() const { return B * H * Nq; }    ///< elements of L
  std::int64_t score_elems() const { return B * H * Nq * Nk; }  ///< elements of S (and P)

  /// Number of keys query row i may see: keys 0 .. visible_keys(i)-1.
  /// Causal (bottom-right aligned, FlashAttention >= 2.1): key j is visible
  /// iff j <= i + Nk - Nq. Non-causal: all Nk keys.
  std::int64_t visible_keys(std::int64_t i) const;

  /// Forward FLOPs by the FlashAttention benchmarks' convention:
  /// 4 * B * H * Nq * Nk * d, halved when causal.
  double forward_flops() const;

  /// Short human form, e.g. "B=1 H=8 Nq=1024 Nk=1024 d=64 causal".
  std::string describe() const;
};

/// Throws flashstep::Error naming the first field that breaks the contract
/// (sizes >= 1 and within 32-bit grid limits, d <= kMaxHeadDim, a finite scale).
void validate(const Problem& p);

}  // namespace flashstep
