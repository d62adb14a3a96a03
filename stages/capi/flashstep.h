/** \file flashstep.h
 *  \brief flashstep's C ABI (libflashstep.so): run any registered stage's
 *  forward pass, and the backward pass of a stage that has one, on device
 *  tensors you own, from C or through a foreign-function interface (Python's
 *  ctypes: notebooks/flashstep.py).
 *
 *  Every stage solves the same problem (stages/common/stage.h): row-major,
 *  contiguous Q [B,H,Nq,d], K and V [B,H,Nk,d] in; O [B,H,Nq,d] and, for a
 *  stage that writes it, the logsumexp L [B,H,Nq] out; the causal mask is
 *  aligned bottom-right (query i sees key j iff j <= i + Nk - Nq), and a row
 *  that sees no key gives O = 0, L = -inf. Q, K, V and O (and the backward's
 *  dO, dQ, dK, dV) are in one element type, a flashstep_dtype: fp32 for
 *  flashstep_forward and flashstep_backward, any type the stage runs in for
 *  the _typed entry points. L is fp32 in every type.
 *
 *  Errors: every function that can fail returns a flashstep_status code and
 *  leaves a one-line message for flashstep_last_error(); no C++ exception
 *  crosses this boundary. The thread that made the call reads the message.
 *
 *  NaN and Inf inputs are not errors: they flow through the arithmetic as in
 *  PyTorch's scaled_dot_product_attention, so each affected row of O comes out
 *  NaN (L of such a row is NaN or -inf, depending on the stage). The call
 *  still returns FLASHSTEP_OK. A NaN in Q or K reaches exactly the rows that
 *  see it (a GPU test checks this for every stage). A NaN in V can also reach
 *  rows that give its key zero weight, since kernels multiply whole tiles of V
 *  and 0 x NaN = NaN, as PyTorch's math backend does.
 */
#ifndef FLASHSTEP_CAPI_FLASHSTEP_H
#define FLASHSTEP_CAPI_FLASHSTEP_H

#include <stdint.h>

#if defined(_WIN32)
#define FLASHSTEP_API __declspec(dllexport)
#else
#define FLASHSTEP_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/** Return codes. Stable values: bindings may hard-code them. */
typedef enum flashstep_status {
  FLASHSTEP_OK = 0,        /**< success: the kernels are queued on the stream */
  FLASHSTEP_EINVAL = 1,    /**< a bad argument: sizes, scale, a null, misaligned,
                                overlapping or non-device pointer, L missing */
  FLASHSTEP_ESTAGE = 2,    /**< no registered stage has that name, or (flashstep_backward)
                                the stage has no backward pass, or the stage (or its
                                backward) does not run in the element type asked for */
  FLASHSTEP_ENOMEM = 3,    /**< the stage's workspace does not fit in free device memory */
  FLASHSTEP_ECUDA = 4,     /**< the CUDA runtime failed: no driver or device, or a
                                launch error */
  FLASHSTEP_EINTERNAL = 5  /**< anything else (a bug in flashstep: please report it) */
} flashstep_status;

/** Element types of Q, K, V and O (and dO, dQ, dK, dV). Stable values:
 *  bindings may hard-code them. Inputs are read and outputs written in the
 *  type; every sum inside a stage is fp32, and L is fp32 in every type. */
typedef enum flashstep_dtype {
  FLASHSTEP_FP32 = 0,  /**< float (torch.float32) */
  FLASHSTEP_FP16 = 1,  /**< IEEE binary16 (torch.float16, CUDA's __half) */
  FLASHSTEP_BF16 = 2   /**< bfloat16 (torch.bfloat16, CUDA's __nv_bfloat16) */
} flashstep_dtype;

/** Number of registered stages (and variants), in stage order. */
FLASHSTEP_API int flashstep_stage_count(void);

/** Name of stage i (0 <= i < flashstep_stage_count()), e.g. "05_sequence_parallel";
 *  NULL when i is out of range. The string lives as long as the library. */
FLASHSTEP_API const char* flashstep_stage_name(int i);

/** One-line title of stage i, e.g. "FlashAttention-2, Q outer"; NULL when out of range. */
FLASHSTEP_API const char* flashstep_stage_title(int i);

/** 1 when the named stage writes L, 0 when it does not, -1 (and a message for
 *  flashstep_last_error()) when no stage has that name. */
FLASHSTEP_API int flashstep_stage_writes_lse(const char* stage);

/** 1 when the named stage has a backward pass (flashstep_backward runs it), 0
 *  when it has none, -1 (and a message for flashstep_last_error()) when no
 *  stage has that name. */
FLASHSTEP_API int flashstep_stage_has_backward(const char* stage);

/** The element types the named stage's forward runs in, as bits: bit
 *  (1 << code) is set for each flashstep_dtype code it supports (stages 01-06:
 *  fp32; 02 and 03 also fp16 and bf16). -1 (and a message for
 *  flashstep_last_error()) when no stage has that name. */
FLASHSTEP_API int flashstep_stage_dtypes(const char* stage);

/** The same for the stage's backward pass: 0 for a stage without one. */
FLASHSTEP_API int flashstep_stage_backward_dtypes(const char* stage);

/** Runs one stage's forward pass in fp32: flashstep_forward_typed with
 *  FLASHSTEP_FP32. Queues its kernels on `stream` and returns without waiting
 *  for them (like a PyTorch op).
 *
 *  \param stage   a stage name ("04_fa2_q_outer") or a number ("04", "4") that
 *                 selects exactly one stage
 *  \param B,H     batch and heads (>= 1)
 *  \param Nq,Nk   query and key lengths (>= 1, each < 2^31;
 *                 B*H*Nq*max(Nk,64)*max(d,64) <= 2^57)
 *  \param d       head dimension, 1..256
 *  \param causal  non-zero: bottom-right aligned causal mask
 *  \param scale   softmax scale; <= 0 or NaN means 1/sqrt(d); one above fp32's
 *                 largest value (FLT_MAX, +Inf too) is an error, since the
 *                 kernels scale in fp32
 *  \param Q,K,V   device (or managed) pointers, 4-byte aligned:
 *                 Q [B,H,Nq,d], K and V [B,H,Nk,d], contiguous fp32
 *  \param O       device pointer [B,H,Nq,d], written; must not overlap Q, K, V or L
 *  \param L       device pointer [B,H,Nq], written, for a stage that writes L
 *                 (flashstep_stage_writes_lse); may be NULL for a stage that
 *                 writes none, and is then left untouched
 *  \param stream  a cudaStream_t (NULL: the legacy default stream) of the
 *                 current device, on which all pointers must live
 *
 *  Checks, in this order, before touching the GPU: the stage name; that it
 *  runs in fp32 (FLASHSTEP_ESTAGE if not); the problem (sizes, d, scale); null
 *  pointers; 4-byte alignment; L given to a stage that writes it; overlap of
 *  O and L with the inputs. Then, through CUDA: that every pointer is device
 *  or managed memory on the current device, and that the stage's workspace
 *  fits in free device memory. The workspace (stages 01-03: S and P, or l and
 *  m, and stage 03's fp32 running O in 16 bits) is allocated on `stream` for
 *  this call and freed after it in stream order. An error in a kernel while
 *  it runs shows up, as with PyTorch, at the next synchronizing CUDA call.
 *
 *  \return FLASHSTEP_OK or an error code; see flashstep_last_error(). */
FLASHSTEP_API int flashstep_forward(const char* stage, int64_t B, int64_t H, int64_t Nq,
                                    int64_t Nk, int64_t d, int causal, double scale,
                                    const float* Q, const float* K, const float* V, float* O,
                                    float* L, void* stream);

/** Runs one stage's forward pass with Q, K, V and O in element type `dtype`
 *  (a flashstep_dtype), as flashstep_forward does in fp32. A stage rounds
 *  only where its algorithm stores in the type (O; stage 02 also P), and
 *  computes every sum in fp32; L is fp32.
 *
 *  \param dtype   FLASHSTEP_FP32, FLASHSTEP_FP16 or FLASHSTEP_BF16; any other
 *                 value is FLASHSTEP_EINVAL, and a type the stage does not run
 *                 in (flashstep_stage_dtypes) FLASHSTEP_ESTAGE, with a message
 *                 naming the types it has
 *  \param Q,K,V,O as for flashstep_forward, with elements of `dtype`: each
 *                 pointer aligned to one element (4 bytes in fp32, 2 in fp16
 *                 and bf16)
 *  \param stage,B,H,Nq,Nk,d,causal,scale,L,stream  as for flashstep_forward
 *                 (L is fp32 in every type)
 *
 *  Checks, in this order, before touching the GPU: the stage name; the dtype
 *  and that the stage runs in it; then flashstep_forward's, with alignment to
 *  one element. */
FLASHSTEP_API int flashstep_forward_typed(const char* stage, int dtype, int64_t B, int64_t H,
                                          int64_t Nq, int64_t Nk, int64_t d, int causal,
                                          double scale, const void* Q, const void* K,
                                          const void* V, void* O, float* L, void* stream);

/** Runs one stage's forward pass on a grouped-query problem: H query heads
 *  and H_kv K/V heads, query head h reading K/V head h / (H / H_kv)
 *  (multi-query attention: H_kv = 1), as flashstep_forward_typed does with
 *  H_kv = H (which this entry point also accepts, on every stage).
 *
 *  \param H_kv    K/V heads, >= 1, H a multiple of it; H_kv < H needs a stage
 *                 that runs grouped heads (flashstep_stage_grouped_heads),
 *                 FLASHSTEP_ESTAGE otherwise
 *  \param K,V     [B,H_kv,Nk,d], contiguous, elements of `dtype`
 *  \param stage,dtype,B,H,Nq,Nk,d,causal,scale,Q,O,L,stream  as for
 *                 flashstep_forward_typed
 *
 *  Checks, in this order, before touching the GPU: the stage name; the dtype
 *  and that the stage runs in it; the problem (H_kv among its sizes); that
 *  the stage runs grouped heads when H_kv < H; then flashstep_forward's
 *  pointer checks. */
FLASHSTEP_API int flashstep_forward_v2(const char* stage, int dtype, int64_t B, int64_t H,
                                       int64_t H_kv, int64_t Nq, int64_t Nk, int64_t d,
                                       int causal, double scale, const void* Q, const void* K,
                                       const void* V, void* O, float* L, void* stream);

/** 1 when the stage's forward runs grouped-query problems (H_kv < H,
 *  flashstep_forward_v2), 0 when it needs H_kv = H, -1 (and a message for
 *  flashstep_last_error()) when no stage has that name. */
FLASHSTEP_API int flashstep_stage_grouped_heads(const char* stage);

/** Runs one stage's backward pass in fp32 (flashstep_backward_typed with
 *  FLASHSTEP_FP32): the gradients dQ, dK, dV of a loss whose gradient in O is
 *  dO (for the loss sum(O * dO), dO is exactly that), queued on `stream`
 *  without waiting, like flashstep_forward.
 *
 *  O and L are the forward's outputs for the same stage, Q, K, V, causal and
 *  scale (flashstep_forward's); both are read, never written. Every backward
 *  reads O (D = rowsum(dO * O)) and L, which is therefore required: stage 05
 *  recomputes P = exp(S - L) from it (FlashAttention-2, Algorithm 2).
 *
 *  What a forward saved: a stage whose forward keeps state for its backward in
 *  its workspace (stage 02: P [B,H,Nq,Nk], as autograd saves it) gets it back
 *  here by a re-run of its forward on Q, K, V, into a workspace and scratch O
 *  and L of this call's own, queued on `stream` before the backward; the
 *  caller's O and L stay untouched. So a stage 02 backward costs a forward
 *  more, and holds two [B,H,Nq,Nk] arrays (P and dP/dS) while it runs. A stage
 *  whose forward has no workspace (stage 05) runs its backward alone.
 *
 *  \param stage   a stage name or number, as for flashstep_forward; a stage
 *                 without a backward (flashstep_stage_has_backward() == 0) is
 *                 FLASHSTEP_ESTAGE, with a message naming the stages that have one
 *  \param B,H,Nq,Nk,d,causal,scale  the problem, as for flashstep_forward
 *  \param Q,K,V   device (or managed) pointers, 4-byte aligned:
 *                 Q [B,H,Nq,d], K and V [B,H,Nk,d], contiguous fp32
 *  \param O       device pointer [B,H,Nq,d], the forward's output
 *  \param L       device pointer [B,H,Nq], the forward's logsumexp; never NULL
 *  \param dO      device pointer [B,H,Nq,d], the loss's gradient in O
 *  \param dQ      device pointer [B,H,Nq,d], written
 *  \param dK,dV   device pointers [B,H,Nk,d], written
 *  \param stream  a cudaStream_t (NULL: the legacy default stream) of the
 *                 current device, on which all pointers must live
 *
 *  dQ, dK and dV must overlap no input and each other; inputs may share memory.
 *  Checks, in this order, before touching the GPU: the stage name, and that it
 *  has a backward that runs in fp32; the problem; null pointers; 4-byte
 *  alignment; overlap of dQ, dK and dV with the inputs and each other. Then,
 *  through CUDA: that every pointer is device or managed memory on the
 *  current device, and that the
 *  workspace (the backward's, plus a re-run forward's) fits in free device
 *  memory; it is allocated and freed in stream order, as the forward's is.
 *  Stage 05 sums dQ with atomic adds, so its last bits may differ from run to
 *  run; dK and dV are bit-identical.
 *
 *  \return FLASHSTEP_OK or an error code; see flashstep_last_error(). */
FLASHSTEP_API int flashstep_backward(const char* stage, int64_t B, int64_t H, int64_t Nq,
                                     int64_t Nk, int64_t d, int causal, double scale,
                                     const float* Q, const float* K, const float* V,
                                     const float* O, const float* L, const float* dO,
                                     float* dQ, float* dK, float* dV, void* stream);

/** Runs one stage's backward pass with Q, K, V, O, dO, dQ, dK and dV in
 *  element type `dtype`, as flashstep_backward does in fp32; L is fp32. A
 *  type the stage's backward does not run in (flashstep_stage_backward_dtypes:
 *  fp32 for stages 02 and 05, bf16 and fp16 for stage 07) is
 *  FLASHSTEP_ESTAGE, with a message naming the types it has; an unknown
 *  dtype code is FLASHSTEP_EINVAL.
 *  Checks, in this order: the stage name and that it has a backward; the
 *  dtype and that the backward runs in it; then flashstep_backward's, with
 *  alignment to one element. */
FLASHSTEP_API int flashstep_backward_typed(const char* stage, int dtype, int64_t B, int64_t H,
                                           int64_t Nq, int64_t Nk, int64_t d, int causal,
                                           double scale, const void* Q, const void* K,
                                           const void* V, const void* O, const float* L,
                                           const void* dO, void* dQ, void* dK, void* dV,
                                           void* stream);

/** Runs one stage's backward pass on a grouped-query problem, as
 *  flashstep_backward_typed does with H_kv = H (which this entry point also
 *  accepts, on every stage): dK and dV of K/V head h_kv are the sums over
 *  the H / H_kv query heads that read it (h_kv (H / H_kv) .. + H / H_kv - 1
 *  of the same batch).
 *
 *  \param H_kv    K/V heads, >= 1, H a multiple of it; H_kv < H needs a stage
 *                 whose backward runs grouped heads
 *                 (flashstep_stage_grouped_backward), FLASHSTEP_ESTAGE otherwise
 *  \param K,V     [B,H_kv,Nk,d], contiguous, elements of `dtype`
 *  \param dK,dV   [B,H_kv,Nk,d], written
 *  \param stage,dtype,B,H,Nq,Nk,d,causal,scale,Q,O,L,dO,dQ,stream  as for
 *                 flashstep_backward_typed; O and L from flashstep_forward_v2
 *
 *  Checks, in this order: the stage name and that it has a backward; the
 *  dtype and that the backward runs in it; the problem (H_kv among its
 *  sizes); that the backward runs grouped heads when H_kv < H; then
 *  flashstep_backward_typed's pointer checks. */
FLASHSTEP_API int flashstep_backward_v2(const char* stage, int dtype, int64_t B, int64_t H,
                                        int64_t H_kv, int64_t Nq, int64_t Nk, int64_t d,
                                        int causal, double scale, const void* Q, const void* K,
                                        const void* V, const void* O, const float* L,
                                        const void* dO, void* dQ, void* dK, void* dV,
                                        void* stream);

/** 1 when the stage's backward runs grouped-query problems (H_kv < H,
 *  flashstep_backward_v2), 0 when it needs H_kv = H or the stage has no
 *  backward, -1 (and a message for flashstep_last_error()) when no stage has
 *  that name. */
FLASHSTEP_API int flashstep_stage_grouped_backward(const char* stage);

/** Stage 09's KV-cache forward (split-KV decoding), flash_attn_with_kvcache's
 *  contract with heads before positions: the Nq queries of sequence b are its
 *  last Nq positions (bottom-right causal) in a cache of `capacity` keys a
 *  sequence, of which it holds cache_seqlens[b] before the call. With K_new
 *  and V_new the new tokens' keys and values are written into the cache at
 *  keys cache_seqlens[b] .. cache_seqlens[b] + Nq - 1 first (those past the
 *  capacity are left out) and the attention sees cache_seqlens[b] + Nq keys;
 *  the caller leaves room and moves its own lengths on afterwards. Queues
 *  its kernels on `stream` and returns without waiting.
 *
 *  \param dtype     FLASHSTEP_FP32, FLASHSTEP_FP16 or FLASHSTEP_BF16: Q, the
 *                   cache, K_new, V_new and O
 *  \param B,H,H_kv  sequences, query heads, K/V heads (H a multiple of H_kv)
 *  \param Nq        new queries a sequence (>= 1)
 *  \param capacity  keys a sequence's cache holds (>= 1); paged, it must be
 *                   pages_per_seq * page_keys
 *  \param d,causal,scale  as for flashstep_forward
 *  \param Q         [B,H,Nq,d]
 *  \param K_cache,V_cache  contiguous [B,H_kv,capacity,d], or with a block
 *                   table paged [num_pages,H_kv,page_keys,d]; written only
 *                   when appending
 *  \param cache_seqlens  int32 [B], device: each in 0..capacity (device data
 *                   is not checked, as with FlashAttention's)
 *  \param block_table  NULL (contiguous), or int32 [B,pages_per_seq],
 *                   device: key j of sequence b is slot j % page_keys of page
 *                   block_table[b][j / page_keys], each entry in 0..num_pages-1
 *  \param num_pages,pages_per_seq,page_keys  the paged cache's pool, table
 *                   width and keys a page (a multiple of 64); all 0 without
 *                   a block table
 *  \param K_new,V_new  both NULL, or [B,H_kv,Nq,d] each: the tokens to append
 *  \param O         [B,H,Nq,d], written
 *  \param L         [B,H,Nq] fp32, written
 *  \param stream    as for flashstep_forward
 *
 *  Checks, in this order, before touching the GPU: that this build has stage
 *  09 (FLASHSTEP_ESTAGE if not); the dtype; the problem (with Nk =
 *  capacity); the cache's layout (validate_kvcache's one line each, and a
 *  pool whose bytes fit 64 bits); null
 *  pointers, alignment, and that O and L (and, when appending, the cache)
 *  overlap nothing else. Then, through CUDA: every pointer device or managed
 *  memory of the current device, and the workspace. */
FLASHSTEP_API int flashstep_forward_kvcache(int dtype, int64_t B, int64_t H, int64_t H_kv,
                                            int64_t Nq, int64_t capacity, int64_t d, int causal,
                                            double scale, const void* Q, void* K_cache,
                                            void* V_cache, const int32_t* cache_seqlens,
                                            const int32_t* block_table, int64_t num_pages,
                                            int64_t pages_per_seq, int64_t page_keys,
                                            const void* K_new, const void* V_new, void* O,
                                            float* L, void* stream);

/** One line naming what the calling thread's last failed call got wrong, e.g.
 *  "d must be <= 256, got 300"; "" after a successful call. Valid until this
 *  thread's next flashstep call. */
FLASHSTEP_API const char* flashstep_last_error(void);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* FLASHSTEP_CAPI_FLASHSTEP_H */
