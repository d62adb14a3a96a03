/** \file flashstep.h
 *  \brief flashstep's C ABI (libflashstep.so): run any registered stage on
 *  device tensors you own, from C or through a foreign-function interface
 *  (Python's ctypes: notebooks/flashstep.py).
 *
 *  Every stage solves the same problem (stages/common/stage.h): fp32,
 *  row-major, contiguous Q [B,H,Nq,d], K and V [B,H,Nk,d] in; O [B,H,Nq,d] and,
 *  for a stage that writes it, the logsumexp L [B,H,Nq] out; the causal mask is
 *  aligned bottom-right (query i sees key j iff j <= i + Nk - Nq), and a row
 *  that sees no key gives O = 0, L = -inf.
 *
 *  Errors: every function that can fail returns a flashstep_status code and
 *  leaves a one-line message for flashstep_last_error(); no C++ exception
 *  crosses this boundary. The thread that made the call reads the message.
 *
 *  NaN and Inf inputs are not errors: they flow through the arithmetic as in
 *  PyTorch's scaled_dot_product_attention, so each affected row of O comes out
 *  NaN (L of such a row is NaN or -inf, depending on the stage). The call
 *  still returns FLASHSTEP_OK.
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
  FLASHSTEP_ESTAGE = 2,    /**< no registered stage has that name */
  FLASHSTEP_ENOMEM = 3,    /**< the stage's workspace does not fit in free device memory */
  FLASHSTEP_ECUDA = 4,     /**< the CUDA runtime failed: no driver or device, or a
                                launch error */
  FLASHSTEP_EINTERNAL = 5  /**< anything else (a bug in flashstep: please report it) */
} flashstep_status;

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

/** Runs one stage's forward pass: queues its kernels on `stream` and returns
 *  without waiting for them (like a PyTorch op).
 *
 *  \param stage   a stage name ("04_fa2_q_outer") or a number ("04", "4") that
 *                 selects exactly one stage
 *  \param B,H     batch and heads (>= 1)
 *  \param Nq,Nk   query and key lengths (>= 1, each < 2^31)
 *  \param d       head dimension, 1..256
 *  \param causal  non-zero: bottom-right aligned causal mask
 *  \param scale   softmax scale; <= 0 or NaN means 1/sqrt(d); +Inf is an error
 *  \param Q,K,V   device (or managed) pointers, 4-byte aligned:
 *                 Q [B,H,Nq,d], K and V [B,H,Nk,d], contiguous fp32
 *  \param O       device pointer [B,H,Nq,d], written; must not overlap Q, K, V or L
 *  \param L       device pointer [B,H,Nq], written, for a stage that writes L
 *                 (flashstep_stage_writes_lse); may be NULL for a stage that
 *                 writes none, and is then left untouched
 *  \param stream  a cudaStream_t (NULL: the legacy default stream) of the
 *                 current device, on which all pointers must live
 *
 *  Checks, in this order, before touching the GPU: the stage name; the problem
 *  (sizes, d, scale); null pointers; 4-byte alignment; L given to a stage that
 *  writes it; overlap of O and L with the inputs. Then, through CUDA: that every
 *  pointer is device or managed memory on the current device, and that the
 *  stage's workspace fits in free device memory. The workspace (stages 01-03:
 *  S and P, or l and m) is allocated on `stream` for this call and freed after
 *  it in stream order. An error in a kernel while it runs shows up, as with
 *  PyTorch, at the next synchronizing CUDA call.
 *
 *  \return FLASHSTEP_OK or an error code; see flashstep_last_error(). */
FLASHSTEP_API int flashstep_forward(const char* stage, int64_t B, int64_t H, int64_t Nq,
                                    int64_t Nk, int64_t d, int causal, double scale,
                                    const float* Q, const float* K, const float* V, float* O,
                                    float* L, void* stream);

/** One line naming what the calling thread's last failed call got wrong, e.g.
 *  "d must be <= 256, got 300"; "" after a successful call. Valid until this
 *  thread's next flashstep call. */
FLASHSTEP_API const char* flashstep_last_error(void);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* FLASHSTEP_CAPI_FLASHSTEP_H */
