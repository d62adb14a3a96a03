/// \file split_kv.h
/// \brief Stage 09: split-KV decoding (flash-decoding). Each (batch, K/V head)
/// sequence of keys is cut into splits, each split handled by its own thread
/// block for all query heads of the K/V head's group at once; every block
/// writes a partial O and logsumexp, and a merge kernel combines them with the
/// two-block identity (common/partial_merge.h). Host entry points; CUDA-free.
#pragma once

#include <cstdint>
#include <vector>

#include "common/stage.h"
#include "split_kv_plan.h"

namespace flashstep::split_kv {

/// The split-KV forward: the plan of make_plan(p, SMs of the current device),
/// the split kernel, then (with more than one split) the merge kernel.
void forward(const Problem& p, const ForwardTensors& t, Stream stream);
/// The contrast: one block per (K/V head, row tile), no split, no merge. At
/// decoding sizes it launches B * H_kv blocks, too few for the GPU.
void forward_one_block(const Problem& p, const ForwardTensors& t, Stream stream);

/// The KV-cache forward: K and V are [B, H_kv, capacity, d] with capacity =
/// p.Nk, of which sequence b holds its first cache_seqlens[b] keys (device
/// array [B], each in 0..capacity, as flash_attn_with_kvcache's
/// cache_seqlens); the Nq queries of sequence b are its last Nq positions
/// (bottom-right causal: query i sees key j iff j <= i + seqlen_b - Nq). A
/// sequence of length 0 gives O = 0, L = -inf. `split` false: one block per
/// (K/V head, row tile).
void forward_kvcache(const Problem& p, const ForwardTensors& t,
                     const std::int32_t* cache_seqlens,  // [B], device
                     Stream stream, bool split = true);

/// A KV cache as forward_kvcache's full form takes it: K and V in either
/// layout (CacheLayout in split_kv_plan.h), each sequence's length before
/// the call, and optionally the new tokens' keys and values to append first.
struct KvCache {
  void* K = nullptr;  ///< [B, H_kv, capacity, d], or paged [pages, H_kv, page_keys, d], in p.dtype
  void* V = nullptr;  ///< the same layout as K
  const std::int32_t* seqlens = nullptr;  ///< [B], device: keys sequence b holds before the call
  CacheLayout layout;                     ///< contiguous, or paged through its block table (device)
  /// [B, H_kv, Nq, d] each in p.dtype, or both null: the Nq new tokens'
  /// keys and values, written into sequence b's keys seqlens[b] ..
  /// seqlens[b] + Nq - 1 before the attention, which then sees
  /// seqlens[b] + Nq keys (flash_attn_with_kvcache's k and v). The caller
  /// leaves room for them (seqlens[b] + Nq <= capacity) and moves its own
  /// seqlens on afterwards; keys past the capacity are not written, and
  /// the attention stops at the capacity.
  const void* K_new = nullptr;
  const void* V_new = nullptr;
};

/// The KV-cache forward in full: the cache of `cache` (t.K and t.V must be
/// null, so that one call cannot name two caches; t gives Q, O, L and the
/// workspace), contiguous or paged (p.Nk = capacity = pages_per_seq *
/// page_keys), with the new tokens appended first when K_new and V_new are
/// given. Throws flashstep::Error on a layout or argument that cannot work.
void forward_kvcache(const Problem& p, const ForwardTensors& t, const KvCache& cache,
                     Stream stream, bool split = true);

/// Blocks of p's split kernel (its type and head-dimension bucket) that one SM
/// of the current device holds at once, by the CUDA occupancy API: what
/// resident_blocks (split_kv_plan.h) says for sm_90, which a GPU test checks.
int device_resident_blocks(const Problem& p);

/// The partials: [splits, B, H, Nq, d] O and [splits, B, H, Nq] L in fp32,
/// for the most splits any GPU plans (max_splits); 0 when that
/// is one split (the kernel then writes O and L itself).
std::int64_t workspace_bytes(const Problem& p);
/// The one-block contrast needs none: 0.
std::int64_t workspace_bytes_one_block(const Problem& p);

/// Traffic, FLOPs and blocks in closed form, planned for kModelSmCount SMs.
/// HBM: each (row tile, split) block reads its rows of Q and its split's keys
/// of K and V once (so K/V once per group when the group fits one row tile)
/// and writes its partials (d + 1 fp32 per row), or O and L with one split;
/// the merge reads every partial and writes O and L. Matmul FLOPs: 2 d per
/// score computed (visible keys only) and 2 d per (row, key read) for P V.
/// SRAM: the tiles the split kernel stages in shared memory (fp32: Q, K, V,
/// P~ and the row statistics, read once per multiply-add operand or use;
/// fp16 and bf16: Q, K and V read as the warps load fragments, and the warp
/// slices' partials merged at the end of a split); non-matmul FLOPs: the
/// online softmax, the final division and L, and the merges
/// (split_kv_model.cpp lists them).
Cost model(const Problem& p);
/// The same for the one-block contrast.
Cost model_one_block(const Problem& p);

/// The kernels' loops on the host, planned for kModelSmCount SMs, in p.dtype
/// as the kernels run it (inputs holding that type's values, O rounded to it,
/// every sum and the partials fp32), counting what they move:
/// split_kv_mirror.cpp.
Cost mirror(const Problem& p, const HostTensors& t);
/// The one-block contrast on the host.
Cost mirror_one_block(const Problem& p, const HostTensors& t);
/// The KV-cache forward on the host: cache_seqlens [B] as forward_kvcache
/// takes them, planned for `sm_count` SMs.
Cost mirror_kvcache(const Problem& p, const HostTensors& t, const std::int64_t* cache_seqlens,
                    int sm_count, bool split = true);
/// KvCache on the host (every pointer a host array, the block table too).
struct HostKvCache {
  float* K = nullptr;                     ///< as KvCache::K
  float* V = nullptr;                     ///< as KvCache::V
  const std::int64_t* seqlens = nullptr;  ///< [B]
  CacheLayout layout;
  const float* K_new = nullptr;  ///< [B, H_kv, Nq, d], or both null
  const float* V_new = nullptr;
};
/// The full KV-cache forward on the host, as forward_kvcache(KvCache) runs
/// it: the new tokens appended into the cache first (in place, as on the
/// GPU), then the split kernels' loops reading the cache in its layout.
/// t.K and t.V must be null; t.Q, t.O and t.L as for mirror.
Cost mirror_kvcache(const Problem& p, const HostTensors& t, const HostKvCache& cache,
                    int sm_count, bool split = true);

}  // namespace flashstep::split_kv

namespace flashstep {
/// Registry entries of this folder: 09_split_kv and 09_one_block.
std::vector<Stage> stages_09_split_kv();
}  // namespace flashstep
