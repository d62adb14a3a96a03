#!/usr/bin/env python3
"""flashstep from Python: run any stage on PyTorch tensors through libflashstep.so.

    import sys; sys.path.insert(0, "notebooks")
    import flashstep
    flashstep.stages()        # ['01_naive', ..., '05_sequence_parallel']
    o, lse = flashstep.forward(q, k, v, stage="04_fa2_q_outer", causal=True)

q [B,H,Nq,d], k and v [B,H_kv,Nk,d] (H_kv = H, or for grouped-query attention
a divisor of H, query head h reading k/v head h // (H // H_kv), on the stages
where grouped_heads(stage) is True): contiguous, on one CUDA device, all float32,
all float16 or all bfloat16, in a type the stage runs in (dtypes(stage):
every stage runs in float32; 02_safe_softmax and 03_fa1_kv_outer also in
float16 and bfloat16). o is [B,H,Nq,d] in q's dtype; lse (the logsumexp L) is
[B,H,Nq] float32 in every dtype, or None for a stage that writes none
(01_naive). The causal mask is aligned bottom-right (query i sees
key j iff j <= i + Nk - Nq), unlike SDPA's is_causal (top-left) when Nq != Nk.
The kernels run on torch's current stream.

The backward, for a stage that has one (backward_stages(): 02_safe_softmax,
05_sequence_parallel, 07_tensor_core, 07_tensor_core_deterministic; with
grouped heads, those where grouped_backward(stage) is True: stage 07's), by
hand or through autograd:

    dq, dk, dv = flashstep.backward(q, k, v, o, lse, do, stage="05", causal=True)
    o = flashstep.attention(q, k, v, stage="05", causal=True)  # q, k, v requires_grad
    (o * do).sum().backward()                                  # q.grad, k.grad, v.grad

o and lse must be what forward() returned for the same stage and arguments;
do is the loss's gradient in o, shaped like o. Stages 02 and 05's backwards
run in float32, stage 07's in bfloat16 and float16 (backward_dtypes(stage)). flashstep.Attention is the
torch.autograd.Function behind attention() (Attention.apply(q, k, v, stage,
causal, scale)); it supports one backward, not double backward.

Decoding against a KV cache (stage 09, flash_attn_with_kvcache's arguments
with heads before positions), contiguous or paged, appending the new tokens:

    o, lse = flashstep.forward_with_kvcache(q, k_cache, v_cache, cache_seqlens,
                                            k=k_new, v=v_new, block_table=table)

The library is $FLASHSTEP_LIB (the file, or its folder), else the first of
build/stages/capi/libflashstep.so and build-gpu/stages/capi/libflashstep.so
under the repository root; `make` builds it. torch is imported only when
forward(), backward(), attention() or the self-test runs (or Attention is
first used), so CPU-only tools can call stages().

    python3 notebooks/flashstep.py             # list the stages
    python3 notebooks/flashstep.py --selftest  # on a GPU: every stage, in each of its
                                               # dtypes, against fp64 SDPA; every backward
                                               # against fp64 autograd; the KV cache
    python3 notebooks/flashstep.py --selftest-kvcache  # the KV cache alone
"""
import argparse
import ctypes
import math
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIB_NAME = "libflashstep.so"
BUILD_DIRS = ("build", "build-gpu")
DEFAULT_STAGE = "05_sequence_parallel"

# flashstep_status in stages/capi/flashstep.h.
OK, EINVAL, ESTAGE, ENOMEM, ECUDA, EINTERNAL = range(6)
# flashstep_dtype in stages/capi/flashstep.h, by name; torch's dtypes by the same names.
DTYPE_CODES = {"fp32": 0, "fp16": 1, "bf16": 2}
TORCH_DTYPE_NAMES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
CODE_NAMES = {OK: "FLASHSTEP_OK", EINVAL: "FLASHSTEP_EINVAL", ESTAGE: "FLASHSTEP_ESTAGE",
              ENOMEM: "FLASHSTEP_ENOMEM", ECUDA: "FLASHSTEP_ECUDA",
              EINTERNAL: "FLASHSTEP_EINTERNAL"}


class FlashstepError(RuntimeError):
    """A non-zero status from the C ABI; `code` is the flashstep_status value."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def library_path():
    """Where libflashstep.so is: $FLASHSTEP_LIB, else the build folders."""
    env = os.environ.get("FLASHSTEP_LIB")
    if env:
        path = Path(env)
        if path.is_dir():
            path = path / LIB_NAME
        if not path.is_file():
            raise FileNotFoundError(f"FLASHSTEP_LIB={env}: no such file")
        return path
    tried = [ROOT / b / "stages" / "capi" / LIB_NAME for b in BUILD_DIRS]
    for path in tried:
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{LIB_NAME} not found (tried {', '.join(str(p) for p in tried)}): build it with "
        "`make` or `cmake --build build --target flashstep_capi`, or set FLASHSTEP_LIB")


_lib = None


def _load():
    """The loaded library, its functions' signatures declared (once)."""
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(str(library_path()))
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        lib.flashstep_stage_count.argtypes = []
        lib.flashstep_stage_count.restype = ctypes.c_int
        lib.flashstep_stage_name.argtypes = [ctypes.c_int]
        lib.flashstep_stage_name.restype = ctypes.c_char_p
        lib.flashstep_stage_title.argtypes = [ctypes.c_int]
        lib.flashstep_stage_title.restype = ctypes.c_char_p
        lib.flashstep_stage_writes_lse.argtypes = [ctypes.c_char_p]
        lib.flashstep_stage_writes_lse.restype = ctypes.c_int
        lib.flashstep_stage_has_backward.argtypes = [ctypes.c_char_p]
        lib.flashstep_stage_has_backward.restype = ctypes.c_int
        lib.flashstep_stage_dtypes.argtypes = [ctypes.c_char_p]
        lib.flashstep_stage_dtypes.restype = ctypes.c_int
        lib.flashstep_stage_backward_dtypes.argtypes = [ctypes.c_char_p]
        lib.flashstep_stage_backward_dtypes.restype = ctypes.c_int
        lib.flashstep_forward.argtypes = [
            ctypes.c_char_p, i64, i64, i64, i64, i64, ctypes.c_int, ctypes.c_double,
            ptr, ptr, ptr, ptr, ptr, ptr]
        lib.flashstep_forward.restype = ctypes.c_int
        lib.flashstep_forward_typed.argtypes = [
            ctypes.c_char_p, ctypes.c_int, i64, i64, i64, i64, i64, ctypes.c_int,
            ctypes.c_double, ptr, ptr, ptr, ptr, ptr, ptr]
        lib.flashstep_forward_typed.restype = ctypes.c_int
        lib.flashstep_forward_v2.argtypes = [
            ctypes.c_char_p, ctypes.c_int, i64, i64, i64, i64, i64, i64, ctypes.c_int,
            ctypes.c_double, ptr, ptr, ptr, ptr, ptr, ptr]
        lib.flashstep_forward_v2.restype = ctypes.c_int
        lib.flashstep_stage_grouped_heads.argtypes = [ctypes.c_char_p]
        lib.flashstep_stage_grouped_heads.restype = ctypes.c_int
        lib.flashstep_backward.argtypes = [
            ctypes.c_char_p, i64, i64, i64, i64, i64, ctypes.c_int, ctypes.c_double,
            ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr]
        lib.flashstep_backward.restype = ctypes.c_int
        lib.flashstep_backward_typed.argtypes = [
            ctypes.c_char_p, ctypes.c_int, i64, i64, i64, i64, i64, ctypes.c_int,
            ctypes.c_double, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr]
        lib.flashstep_backward_typed.restype = ctypes.c_int
        lib.flashstep_backward_v2.argtypes = [
            ctypes.c_char_p, ctypes.c_int, i64, i64, i64, i64, i64, i64, ctypes.c_int,
            ctypes.c_double, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr]
        lib.flashstep_backward_v2.restype = ctypes.c_int
        lib.flashstep_stage_grouped_backward.argtypes = [ctypes.c_char_p]
        lib.flashstep_stage_grouped_backward.restype = ctypes.c_int
        lib.flashstep_forward_kvcache.argtypes = [
            ctypes.c_int, i64, i64, i64, i64, i64, i64, ctypes.c_int, ctypes.c_double,
            ptr, ptr, ptr, ptr, ptr, i64, i64, i64, ptr, ptr, ptr, ptr, ptr]
        lib.flashstep_forward_kvcache.restype = ctypes.c_int
        lib.flashstep_last_error.argtypes = []
        lib.flashstep_last_error.restype = ctypes.c_char_p
        _lib = lib
    return _lib


def last_error():
    """The calling thread's message for its last failed flashstep call."""
    return _load().flashstep_last_error().decode()


def stages():
    """Names of the registered stages, in stage order."""
    lib = _load()
    return [lib.flashstep_stage_name(i).decode() for i in range(lib.flashstep_stage_count())]


def titles():
    """{stage name: one-line title}."""
    lib = _load()
    return {lib.flashstep_stage_name(i).decode(): lib.flashstep_stage_title(i).decode()
            for i in range(lib.flashstep_stage_count())}


def writes_lse(stage):
    """Whether the stage writes L; FlashstepError for an unknown stage."""
    w = _load().flashstep_stage_writes_lse(_stage_bytes(stage))
    if w < 0:
        raise FlashstepError(ESTAGE, last_error())
    return bool(w)


def grouped_heads(stage):
    """Whether the stage's forward runs grouped-query problems (k, v with fewer
    heads than q); FlashstepError for an unknown stage."""
    g = _load().flashstep_stage_grouped_heads(_stage_bytes(stage))
    if g < 0:
        raise FlashstepError(ESTAGE, last_error())
    return bool(g)


def grouped_backward(stage):
    """Whether the stage's backward runs grouped-query problems (dk, dv of a
    k/v head summed over the q heads that read it); FlashstepError for an
    unknown stage."""
    g = _load().flashstep_stage_grouped_backward(_stage_bytes(stage))
    if g < 0:
        raise FlashstepError(ESTAGE, last_error())
    return bool(g)


def has_backward(stage):
    """Whether the stage has a backward pass; FlashstepError for an unknown stage."""
    h = _load().flashstep_stage_has_backward(_stage_bytes(stage))
    if h < 0:
        raise FlashstepError(ESTAGE, last_error())
    return bool(h)


def backward_stages():
    """Names of the stages that have a backward pass, in stage order."""
    return [name for name in stages() if has_backward(name)]


def _grouped_backward_stages():
    return [name for name in stages() if grouped_backward(name)]


def _dtype_names(bits):
    return [name for name, code in DTYPE_CODES.items() if bits >> code & 1]


def dtypes(stage):
    """The element types the stage's forward runs in, as names in code order
    (fp32, fp16, bf16), e.g. ['fp32', 'fp16', 'bf16']; FlashstepError for an
    unknown stage."""
    bits = _load().flashstep_stage_dtypes(_stage_bytes(stage))
    if bits < 0:
        raise FlashstepError(ESTAGE, last_error())
    return _dtype_names(bits)


def backward_dtypes(stage):
    """The element types the stage's backward runs in ([] without a backward)."""
    bits = _load().flashstep_stage_backward_dtypes(_stage_bytes(stage))
    if bits < 0:
        raise FlashstepError(ESTAGE, last_error())
    return _dtype_names(bits)


def _dtype_name(t):
    """'fp32', 'fp16' or 'bf16' for a torch dtype, else None."""
    return TORCH_DTYPE_NAMES.get(str(t).replace("torch.", ""))


def _require_backward(stage):
    """FlashstepError (ESTAGE), naming the stages that have one, unless stage has a backward."""
    if not has_backward(stage):
        raise FlashstepError(ESTAGE, f"stage {stage} has no backward pass; stages with one: "
                                     f"{', '.join(backward_stages())}")


def _stage_bytes(stage):
    if not isinstance(stage, str):
        raise TypeError(f"stage must be a str such as '{DEFAULT_STAGE}', "
                        f"got {type(stage).__name__}")
    if "\0" in stage:
        # C would read the name only up to it: "05\0x" would run stage 05.
        raise ValueError(f"stage {stage!r} holds a NUL character")
    return stage.encode()


def _causal_arg(causal):
    """The ABI's causal flag from True or False (1 or 0): anything else, such as
    the string "False", which is truthy, is a TypeError rather than a mask."""
    if causal not in (True, False):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    return int(bool(causal))


def _check_inputs(torch, q, k, v, paged=False):
    """One clear TypeError or ValueError for the first thing wrong with q, k, v
    (with `paged`, k and v a pool of pages: their first dimension is not B)."""
    named = (("q", q), ("k", k), ("v", v))
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in named:
        if _dtype_name(t.dtype) is None:
            raise TypeError(f"{name} must be torch.float32, torch.float16 or torch.bfloat16 "
                            f"(flashstep's element types), got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    for name, t in named:
        if not t.is_cuda:
            raise ValueError(f"{name} must be a CUDA tensor, got one on {t.device}")
    for name, t in named:
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D [B, H, N, d], got shape {tuple(t.shape)}")
    for name, t in named:
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (row-major [B, H, N, d]); "
                             f"call .contiguous() first")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    if (q.shape[0] != k.shape[0] and not paged) or q.shape[3] != k.shape[3] or \
            q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"q [B,H,Nq,d] {tuple(q.shape)} and k [B,H_kv,Nk,d] {tuple(k.shape)} "
                         "disagree on B or d, or H is not a multiple of H_kv")


def _check_like(torch, name, t, shape, device, what, dtype):
    """One clear error for the first thing wrong with one more tensor (o, lse, do)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {t.dtype}")
    if not t.is_cuda:
        raise ValueError(f"{name} must be a CUDA tensor, got one on {t.device}")
    if t.device != device:
        raise ValueError(f"{name} must be on q's device {device}, got {t.device}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must be {what} {tuple(shape)}, got shape {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous; call .contiguous() first")


def _scale_arg(scale):
    """The ABI's scale argument: 0 for None (its "1/sqrt(d)"), else a finite number > 0."""
    if scale is None:
        return 0.0
    scale_arg = float(scale)
    if not (math.isfinite(scale_arg) and scale_arg > 0):
        raise ValueError(f"scale must be a finite number > 0 (or None), got {scale}")
    return scale_arg


def _call_args(q, scale, causal):
    """What every ABI call takes beside the tensors, checked: (lib, dtype code,
    causal, scale), the scale and causal flag in the ABI's form."""
    scale_arg = _scale_arg(scale)
    causal_arg = _causal_arg(causal)
    code = DTYPE_CODES[_dtype_name(q.dtype)]
    return _load(), code, causal_arg, scale_arg


def _call(torch, call):
    """Runs call() (an ABI call returning a status); FlashstepError unless OK."""
    code = call()
    if code == ENOMEM:
        # torch's caching allocator may hold the memory the workspace needs.
        torch.cuda.empty_cache()
        code = call()
    if code != OK:
        raise FlashstepError(code, last_error())


def forward(q, k, v, stage=DEFAULT_STAGE, causal=False, scale=None):
    """Runs one stage in q's dtype: returns (o, lse), o in q's dtype, lse float32
    or None for a stage that writes no L.

    scale: softmax scale, None for 1/sqrt(d). Queued on torch's current stream
    of q's device, like any torch op. FlashstepError (a RuntimeError) carries
    the library's one-line message when the library refuses or fails (ESTAGE
    for a dtype the stage does not run in, naming the ones it does)."""
    import torch

    _check_inputs(torch, q, k, v)
    lib, code, causal_arg, scale_arg = _call_args(q, scale, causal)
    lse_written = writes_lse(stage)
    B, H, Nq, d = q.shape
    H_kv, Nk = k.shape[1], k.shape[2]
    with torch.cuda.device(q.device):
        o = torch.empty_like(q, memory_format=torch.contiguous_format)
        lse = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device) if lse_written else None
        stream = torch.cuda.current_stream(q.device).cuda_stream

        _call(torch, lambda: lib.flashstep_forward_v2(
            _stage_bytes(stage), code, B, H, H_kv, Nq, Nk, d, causal_arg, scale_arg,
            q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
            lse.data_ptr() if lse is not None else None, stream))
    return o, lse


def forward_with_kvcache(q, k_cache, v_cache, cache_seqlens, k=None, v=None, block_table=None,
                         causal=False, scale=None):
    """Stage 09's decode against a KV cache, flash_attn_with_kvcache's arguments
    with heads before positions: returns (o, lse), o in q's dtype, lse float32.

    q [B, H, Nq, d]: each sequence's Nq newest queries (bottom-right causal).
    k_cache, v_cache: [B, H_kv, capacity, d], or with block_table a paged pool
    [num_pages, H_kv, page_keys, d] (page_keys a multiple of 64) and
    block_table int32 [B, pages_per_seq] (capacity = pages_per_seq page_keys).
    cache_seqlens int32 [B]: keys each sequence holds before the call.
    k, v [B, H_kv, Nq, d] (both or neither): appended into the caches in place
    at cache_seqlens[b] .. first, and seen by the queries; the caller leaves
    room and moves its lengths on afterwards. Queued on torch's current stream
    of q's device. One clear TypeError, ValueError or FlashstepError for the
    first thing wrong."""
    import torch

    paged = block_table is not None
    _check_inputs(torch, q, k_cache, v_cache, paged=paged)
    if (k is None) != (v is None):
        raise ValueError("k and v go together: pass both (to append) or neither")
    B, H, Nq, d = q.shape
    H_kv = k_cache.shape[1]
    if paged:
        _check_like(torch, "block_table", block_table,
                    tuple(block_table.shape) if isinstance(block_table, torch.Tensor) else (),
                    q.device, "int32 [B, pages_per_seq]", torch.int32)
        if block_table.dim() != 2 or block_table.shape[0] != B:
            raise ValueError(f"block_table must be int32 [B, pages_per_seq] with B = {B}, "
                             f"got shape {tuple(block_table.shape)}")
        num_pages, page_keys = k_cache.shape[0], k_cache.shape[2]
        pages_per_seq = block_table.shape[1]
        capacity = pages_per_seq * page_keys
    else:
        num_pages = pages_per_seq = page_keys = 0
        capacity = k_cache.shape[2]
    _check_like(torch, "cache_seqlens", cache_seqlens, (B,), q.device, "int32 [B]", torch.int32)
    if k is not None:
        for name, t in (("k", k), ("v", v)):
            _check_like(torch, name, t, (B, H_kv, Nq, d), q.device, "[B, H_kv, Nq, d]", q.dtype)
    lib, code, causal_arg, scale_arg = _call_args(q, scale, causal)
    with torch.cuda.device(q.device):
        o = torch.empty_like(q, memory_format=torch.contiguous_format)
        lse = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)
        stream = torch.cuda.current_stream(q.device).cuda_stream
        _call(torch, lambda: lib.flashstep_forward_kvcache(
            code, B, H, H_kv, Nq, capacity, d, causal_arg, scale_arg, q.data_ptr(),
            k_cache.data_ptr(), v_cache.data_ptr(), cache_seqlens.data_ptr(),
            block_table.data_ptr() if paged else None, num_pages, pages_per_seq, page_keys,
            k.data_ptr() if k is not None else None, v.data_ptr() if v is not None else None,
            o.data_ptr(), lse.data_ptr(), stream))
    return o, lse


def backward(q, k, v, o, lse, do, stage=DEFAULT_STAGE, causal=False, scale=None):
    """Runs one stage's backward pass: returns (dq, dk, dv), shaped like q, k, v.

    o and lse are what forward() returned for the same stage, q, k, v, causal
    and scale (both are read, never written); do is the loss's gradient in o,
    [B,H,Nq,d]. Contiguous, on q's CUDA device; o, do and the results in q's
    dtype, lse float32. k and v may have fewer heads than q (grouped-query
    attention) on a stage whose backward runs them (grouped_backward): dk and
    dv of a k/v head are then summed over the q heads that read it. A stage
    whose forward saves state for its backward (02_safe_softmax: P) has its
    forward re-run by the library first (stages/capi/flashstep.h). Queued on
    torch's current stream; FlashstepError (ESTAGE) for a stage without a
    backward, one whose backward does not run in q's dtype (backward_dtypes),
    or grouped heads on one whose backward does not run them."""
    import torch

    _require_backward(stage)
    _check_inputs(torch, q, k, v)
    if lse is None:
        raise ValueError("lse is None: the backward reads the forward's logsumexp L "
                         "[B,H,Nq], which forward() returns for the stages that have a backward")
    B, H, Nq, d = q.shape
    H_kv, Nk = k.shape[1], k.shape[2]
    _check_like(torch, "o", o, q.shape, q.device, "[B,H,Nq,d] like q", q.dtype)
    _check_like(torch, "lse", lse, (B, H, Nq), q.device, "[B,H,Nq]", torch.float32)
    _check_like(torch, "do", do, q.shape, q.device, "[B,H,Nq,d] like q", q.dtype)
    lib, code, causal_arg, scale_arg = _call_args(q, scale, causal)
    with torch.cuda.device(q.device):
        dq = torch.empty_like(q, memory_format=torch.contiguous_format)
        dk = torch.empty_like(k, memory_format=torch.contiguous_format)
        dv = torch.empty_like(v, memory_format=torch.contiguous_format)
        stream = torch.cuda.current_stream(q.device).cuda_stream
        _call(torch, lambda: lib.flashstep_backward_v2(
            _stage_bytes(stage), code, B, H, H_kv, Nq, Nk, d, causal_arg, scale_arg,
            q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(),
            do.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), stream))
    return dq, dk, dv


_attention_class = None


def _attention():
    """flashstep.Attention, made on first use (it subclasses torch's Function)."""
    global _attention_class
    if _attention_class is None:
        import torch
        from torch.autograd.function import once_differentiable

        # The module's functions, under names the methods below do not shadow.
        run_forward, run_backward = forward, backward

        class Attention(torch.autograd.Function):
            """O = attention(q, k, v) by one flashstep stage, forward and backward.

            Attention.apply(q, k, v, stage, causal, scale) returns o; the
            backward runs the stage's backward on the saved q, k, v, o and lse."""

            @staticmethod
            def forward(ctx, q, k, v, stage, causal, scale):
                o, lse = run_forward(q, k, v, stage=stage, causal=causal, scale=scale)
                ctx.save_for_backward(q, k, v, o, lse)
                ctx.flashstep_args = (stage, causal, scale)
                return o

            @staticmethod
            @once_differentiable
            def backward(ctx, do):
                q, k, v, o, lse = ctx.saved_tensors
                stage, causal, scale = ctx.flashstep_args
                # do is often not contiguous (o.sum() hands back a stride-0 expand).
                do = do.to(q.dtype).contiguous()
                dq, dk, dv = run_backward(q, k, v, o, lse, do, stage=stage, causal=causal,
                                          scale=scale)
                return dq, dk, dv, None, None, None

        _attention_class = Attention
    return _attention_class


def attention(q, k, v, stage=DEFAULT_STAGE, causal=False, scale=None):
    """o = attention(q, k, v) through autograd: o.backward(...) (or any loss of o)
    fills q.grad, k.grad and v.grad with the stage's backward. Inputs as for
    forward(); FlashstepError (ESTAGE), up front, for a stage without a backward,
    one whose backward does not run in q's dtype, or k, v with fewer heads than
    q on one whose backward does not run grouped heads (grouped_backward)."""
    _require_backward(stage)
    name, have = _dtype_name(getattr(q, "dtype", None)), backward_dtypes(stage)
    if name is not None and name not in have:
        raise FlashstepError(ESTAGE, f"stage {stage}'s backward does not run in {name} "
                                     f"(it runs in {', '.join(have)})")
    # Heads as far as q and k have them; forward() checks their shapes in full.
    q_heads, k_heads = (tuple(getattr(t, "shape", ()))[1:2] for t in (q, k))
    if q_heads and k_heads and q_heads != k_heads and not grouped_backward(stage):
        raise FlashstepError(ESTAGE, f"stage {stage}'s backward does not run grouped-query "
                                     f"attention (k has {k_heads[0]} heads, q {q_heads[0]}); "
                                     f"these do: {', '.join(_grouped_backward_stages())}")
    return _attention().apply(q, k, v, stage, causal, scale)


def __getattr__(name):
    # flashstep.Attention without importing torch at module import (PEP 562).
    if name == "Attention":
        return _attention()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------
# Self-test (python3 notebooks/flashstep.py --selftest): needs a GPU and torch.

# |got - want| <= ATOL + RTOL * |want|: the CLI's kFp32Tolerance (common/check.h).
# In fp16 and bf16, o is held to FlashAttention's rule instead (_truth).
ATOL, RTOL = 1e-5, 1e-4
# flashstep's dtype names and torch's dtypes, filled in when torch is imported.
TORCH_DTYPES = {}
# (B, H, Nq, Nk, d, causal, scale): ragged sizes; Nq > Nk causal leaves rows
# that see no key (O = 0, L = -inf); d = 256 and a non-default scale. The
# scale stays modest: at 0.3 with d = 256 the logits reach ~40 and fp32
# rounding of them alone moves O by ~2e-5 in every stage (measured on the
# H200), more than the absolute part of the bound where O is near 0.
SELFTEST_PROBLEMS = [
    (2, 3, 97, 113, 59, False, None),
    (2, 3, 97, 113, 59, True, None),
    (1, 2, 130, 67, 64, True, None),
    (2, 1, 1, 239, 128, False, None),
    (1, 2, 33, 45, 256, True, 0.1),
]
INPUT_MEAN = 0.5  # common/check.h kInputMean: zero-mean inputs hide errors
# The gradients' bound: common/check.h kFp32GradTolerance (dS = P o (dP - D)
# cancels leading digits, so elements of dQ and dK near 0 carry a little more
# absolute error than O does).
GRAD_ATOL, GRAD_RTOL = 1e-4, 1e-4
# (B, H, Nq, Nk, d, causal, scale) for the backward: d = 59 (no float4 path),
# 96 and 256 (stage 05's other head-dimension buckets), Nq > Nk causal (rows
# that see no key: dq = 0), and a non-default scale (dq = scale dS K).
BACKWARD_PROBLEMS = [
    (2, 3, 97, 113, 59, False, None),
    (2, 3, 97, 113, 59, True, None),
    (1, 2, 130, 67, 64, True, None),
    (2, 1, 113, 203, 96, True, None),
    (1, 2, 33, 45, 256, False, None),
    (1, 2, 45, 33, 40, True, 0.25),
]
# (B, H, H_kv, Nq, Nk, d, causal, scale): grouped-query problems for the
# backwards that run them (grouped_backward), H / H_kv = 4 and 8 (MQA).
GROUPED_BACKWARD_PROBLEMS = [
    (2, 8, 2, 97, 113, 64, False, None),
    (1, 8, 1, 130, 67, 128, True, None),
]
# Stage 01 keeps S [B,H,Nq,Nk] in a workspace: at N = 250000 that is 233 GiB,
# more than any one GPU here has, so the call must fail with ENOMEM up front.
ENOMEM_N = 250_000


def _reference(torch, q, k, v, causal, scale):
    """fp64 O and L. SDPA's is_causal is top-left, so the bottom-right mask is
    built here; rows that see no key are O = 0 (SDPA gives NaN), L = -inf."""
    import torch.nn.functional as F

    group = q.shape[1] // k.shape[1]  # grouped-query: each k/v head serves `group` q heads
    q64 = q.double()
    k64, v64 = (t.double().repeat_interleave(group, dim=1) for t in (k, v))
    Nq, Nk, d = q.shape[2], k.shape[2], q.shape[3]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    mask = None
    if causal:
        i = torch.arange(Nq, device=q.device)[:, None]
        j = torch.arange(Nk, device=q.device)[None, :]
        mask = j <= i + (Nk - Nq)  # True: may attend
    o = F.scaled_dot_product_attention(q64, k64, v64, attn_mask=mask, scale=scale)
    s = (q64 @ k64.transpose(-1, -2)) * scale
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf)
        o = o.masked_fill(~mask.any(dim=-1)[:, None], 0.0)
    return o, torch.logsumexp(s, dim=-1)


def _softmax(torch, s, causal):
    """P = softmax(S) over the last axis, causal bottom-right (key j visible to
    query i iff j <= i + Nk - Nq); a row that sees no key gets P = 0, not the
    NaN of softmax over all -inf."""
    if not causal:
        return torch.softmax(s, dim=-1)
    Nq, Nk = s.shape[-2], s.shape[-1]
    i = torch.arange(Nq, device=s.device)[:, None]
    j = torch.arange(Nk, device=s.device)[None, :]
    mask = j <= i + (Nk - Nq)  # True: may attend
    s = s.masked_fill(~mask, -math.inf).masked_fill(~mask.any(dim=-1)[:, None], 0.0)
    return torch.softmax(s, dim=-1).masked_fill(~mask, 0.0)


def _naive(torch, q, k, v, causal, scale):
    """O of attention done naively in q's 16-bit dtype, common/check.h's O_naive:
    S and its softmax in fp32 from the (rounded) inputs, P rounded to the dtype,
    O = P V summed in fp32 and rounded. Rows that see no key give 0."""
    d = q.shape[3]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    k, v = (_expand(t, q) for t in (k, v))
    p = _softmax(torch, (q.float() @ k.float().transpose(-1, -2)) * scale, causal)
    return (p.to(q.dtype).float() @ v.float()).to(q.dtype)


def _expand(t, q):
    """k or v [B,H_kv,N,d] repeated to q's H heads: query head h's k/v head h // (H // H_kv)."""
    return t.repeat_interleave(q.shape[1] // t.shape[1], dim=1)


def _group_sum(t, k):
    """[B,H,N,d] summed over each group of H // H_kv query heads to k's [B,H_kv,N,d]:
    a k/v head's gradient from those of the query heads that read it."""
    B, H_kv = k.shape[:2]
    return t.reshape(B, H_kv, t.shape[1] // H_kv, *t.shape[2:]).sum(2)


def _truth(torch, q, k, v, causal, scale, dtype):
    """What a stage running in `dtype` is checked against (common/check.h):
    ((q, k, v) rounded to dtype, fp64 o and lse from them, the bound on o).
    The bound is None in float32 (ATOL + RTOL |o|, elementwise); in 16 bits it
    is FlashAttention's rule: twice the error of naive attention in that dtype,
    plus ATOL, over all of o."""
    qd, kd, vd = q.to(dtype), k.to(dtype), v.to(dtype)
    o_ref, l_ref = _reference(torch, qd, kd, vd, causal, scale)
    if dtype == torch.float32:
        return (qd, kd, vd), o_ref, l_ref, None
    naive = _naive(torch, qd, kd, vd, causal, scale).double()
    return (qd, kd, vd), o_ref, l_ref, 2 * (naive - o_ref).abs().max().item() + ATOL


def _reference_grads(torch, q, k, v, do, causal, scale):
    """fp64 autograd of attention written out (S, masked softmax, P V): dq, dk, dv.
    Rows that see no key have P = 0, so O = 0 and their gradients are 0. With
    grouped heads k and v are repeated to q's heads inside the graph, so
    autograd sums dk, dv over each group."""
    d = q.shape[3]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    with torch.enable_grad():
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
        p = _softmax(torch, (q64 @ _expand(k64, q64).transpose(-1, -2)) * scale, causal)
        (p @ _expand(v64, q64)).backward(do.double())
    return q64.grad, k64.grad, v64.grad


def _grad_truth(torch, q, k, v, do, causal, scale, dtype, o_read=None):
    """What a backward running in `dtype` is checked against (common/check.h,
    BackwardTruth): ((q, k, v, do) rounded to dtype, fp64 (dq, dk, dv) from them,
    the bounds on each). The bounds are None in float32 (GRAD_ATOL + GRAD_RTOL |g|,
    elementwise); in 16 bits FlashAttention's rule, twice the error of the naive
    backward in that dtype plus a floor: GRAD_ATOL, and for dq and dk the fp32
    error bound of the cancellation in dS = P o (dP - D). The naive reads o_read,
    the O the stage's backward reads (its forward's), when given. With grouped
    heads the naive's dk, dv are summed over each group in fp32, then rounded
    once (common/check.h), and so is dk's floor."""
    qd, kd, vd, dod = (t.to(dtype) for t in (q, k, v, do))
    want = _reference_grads(torch, qd, kd, vd, dod, causal, scale)
    if dtype == torch.float32:
        return (qd, kd, vd, dod), want, None
    d = q.shape[3]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    qf, kf, vf, dof = (t.float() for t in (qd, _expand(kd, qd), _expand(vd, qd), dod))
    p = _softmax(torch, (qf @ kf.transpose(-1, -2)) * scale, causal)
    # D = rowsum(dO o O) from the O the stage's backward read (check.h says why:
    # at small d one ulp of O moves every dS of its row), else the naive's own.
    # As in check.h, that O must pass the forward's rule first: a wrong O would
    # make the naive wrong too and loosen the bound.
    if o_read is None:
        o = (p.to(dtype).float() @ vf).to(dtype).float()
    else:
        _, o_ref, _, o_bound = _truth(torch, qd, kd, vd, causal, scale, dtype)
        if (o_read.double() - o_ref).abs().max().item() > o_bound:
            raise ValueError("the stage's o fails the forward's rule; its gradients "
                             "cannot be checked against a naive reading it")
        o = o_read.float()
    D = (dof * o).sum(-1, keepdim=True)
    ds = (p * (dof @ vf.transpose(-1, -2) - D)).to(dtype).float()
    naive = ((scale * (ds @ kf)).to(dtype),
             _group_sum(scale * (ds.transpose(-1, -2) @ qf), kd).to(dtype),
             _group_sum(p.to(dtype).float().transpose(-1, -2) @ dof, kd).to(dtype))
    unit = 2.0 ** -11 if dtype == torch.float16 else 2.0 ** -8
    gamma = (d + 2) * 2.0 ** -24 / (1 - (d + 2) * 2.0 ** -24) * (1 + unit)
    ad, av, ak, aq = (t.double().abs() for t in (dod, _expand(vd, qd), _expand(kd, qd), qd))
    ds_error = p.double() * gamma * (ad @ av.transpose(-1, -2) +
                                     (ad * o.double().abs()).sum(-1, keepdim=True))
    floors = (GRAD_ATOL + abs(scale) * (ds_error @ ak).max().item(),
              GRAD_ATOL + abs(scale) * _group_sum(ds_error.transpose(-1, -2) @ aq, kd).max().item(),
              GRAD_ATOL)
    bounds = tuple(2 * (n.double() - w).abs().max().item() + f
                   for n, w, f in zip(naive, want, floors))
    return (qd, kd, vd, dod), want, bounds


def _compare(torch, got, want, atol=ATOL, rtol=RTOL):
    """(max abs error, elements outside the bound); infinities must match exactly."""
    got = got.double()
    inf = torch.isinf(want)
    err = torch.where(inf, torch.zeros_like(want), (got - want).abs())
    bad = (inf & (got != want)) | (~inf & ~(err <= atol + rtol * want.abs()))
    return err.max().item(), int(bad.sum().item())


def _inputs(torch, B, H, Nq, Nk, d, device, gen, H_kv=None):
    def draw(heads, n):
        return torch.randn((B, heads, n, d), generator=gen, device=device) + INPUT_MEAN
    H_kv = H if H_kv is None else H_kv
    return draw(H, Nq), draw(H_kv, Nk), draw(H_kv, Nk)


def _expect(what, fn, exc_type, fragment, code=None):
    """Runs fn, which must raise exc_type whose message holds fragment."""
    try:
        fn()
    except exc_type as e:
        if fragment in str(e) and (code is None or getattr(e, "code", None) == code):
            print(f"  bad input, {what}: {type(e).__name__}: {e}")
            return True
        print(f"  bad input, {what}: FAIL, wrong error {type(e).__name__}: {e}")
        return False
    except Exception as e:  # noqa: BLE001 - any other exception is the failure reported
        print(f"  bad input, {what}: FAIL, {type(e).__name__}: {e}")
        return False
    print(f"  bad input, {what}: FAIL, no error raised")
    return False


# (B, H, H_kv, Nq, capacity, d, causal): KV-cache decodes for
# forward_with_kvcache, each contiguous and paged (pages of 64 keys, shuffled,
# with spare pages of NaN), appended to and not; MQA with Nq = 4 at d = 128
# is a wide group (stage 09's Hopper kernel on sm_90 in 16 bits).
KVCACHE_PROBLEMS = [
    (3, 8, 2, 3, 256, 64, True),
    (2, 32, 1, 4, 320, 128, False),
    (2, 4, 4, 1, 128, 40, True),
]
KVCACHE_PAGE_KEYS = 64  # stage 09's kPageKeyMultiple
KVCACHE_SPARE_PAGES = 2


def _selftest_kvcache(torch, dev, gen):
    """forward_with_kvcache against fp64 sequence by sequence: returns the failures."""
    failures = 0
    for B, H, H_kv, Nq, cap, d, causal in KVCACHE_PROBLEMS:
        # Lengths before the call: 0, something ragged, and room for Nq more.
        seqlens = [0, 37, cap - Nq][:B]
        for name in ("fp32", "bf16"):
            dtype = TORCH_DTYPES[name]
            for paged in (False, True):
                for appends in (False, True):
                    q, k_full, v_full = (t.to(dtype) for t in _inputs(
                        torch, B, H, Nq, cap, d, dev, gen, H_kv=H_kv))
                    k_new, v_new = (t.to(dtype) for t in _inputs(
                        torch, B, H_kv, Nq, Nq, d, dev, gen)[1:])
                    lens = torch.tensor(seqlens, dtype=torch.int32, device=dev)
                    table = None
                    k_cache, v_cache = k_full.clone(), v_full.clone()
                    if paged:
                        per_seq = cap // KVCACHE_PAGE_KEYS
                        pages = B * per_seq + KVCACHE_SPARE_PAGES
                        order = torch.randperm(pages, generator=gen, device=dev)[:B * per_seq]
                        table = order.reshape(B, per_seq).to(torch.int32).contiguous()
                        pool_shape = (pages, H_kv, KVCACHE_PAGE_KEYS, d)
                        k_cache = torch.full(pool_shape, math.nan, dtype=dtype, device=dev)
                        v_cache = torch.full(pool_shape, math.nan, dtype=dtype, device=dev)
                        for b in range(B):
                            for j in range(per_seq):
                                keys = slice(j * KVCACHE_PAGE_KEYS, (j + 1) * KVCACHE_PAGE_KEYS)
                                k_cache[table[b, j]] = k_full[b, :, keys]
                                v_cache[table[b, j]] = v_full[b, :, keys]
                    o, lse = forward_with_kvcache(
                        q, k_cache, v_cache, lens, k=k_new if appends else None,
                        v=v_new if appends else None, block_table=table, causal=causal)
                    torch.cuda.synchronize()
                    bad, worst = 0, 0.0
                    for b in range(B):
                        n = seqlens[b]
                        k_seq, v_seq = k_full[b:b + 1, :, :n], v_full[b:b + 1, :, :n]
                        if appends:
                            k_seq = torch.cat([k_seq, k_new[b:b + 1]], dim=2)
                            v_seq = torch.cat([v_seq, v_new[b:b + 1]], dim=2)
                        if k_seq.shape[2] == 0:  # nothing cached, nothing appended
                            bad += int((o[b] != 0).sum().item())
                            bad += int((lse[b] != -math.inf).sum().item())
                            continue
                        _, o_ref, l_ref, bound = _truth(torch, q[b:b + 1], k_seq, v_seq, causal,
                                                        None, dtype)
                        e, nb = _compare(torch, o[b:b + 1], o_ref) if bound is None else \
                            _compare(torch, o[b:b + 1], o_ref, atol=bound, rtol=0.0)
                        worst, bad = max(worst, e), bad + nb
                        bad += _compare(torch, lse[b:b + 1], l_ref)[1]
                        if appends:  # the new keys landed in the cache
                            got = k_cache[table[b, n // KVCACHE_PAGE_KEYS], :,
                                          n % KVCACHE_PAGE_KEYS:n % KVCACHE_PAGE_KEYS + Nq] \
                                if paged else k_cache[b, :, n:n + Nq]
                            bad += 0 if torch.equal(got, k_new[b]) else 1
                    status = "ok" if bad == 0 else "FAIL"
                    failures += bad != 0
                    print(f"  forward_with_kvcache {name} B={B} H={H} H_kv={H_kv} Nq={Nq} "
                          f"cap={cap} d={d}{' causal' if causal else ''}"
                          f"{' paged' if paged else ''}{' +append' if appends else ''}"
                          f"  max err O {worst:.1e}  {status}")
    # Bad input: one clear error each, before or from the library.
    q, k_cache, v_cache = _inputs(torch, 2, 4, 1, 128, 64, dev, gen, H_kv=2)
    lens = torch.zeros(2, dtype=torch.int32, device=dev)
    pool = torch.zeros(4, 2, 32, 64, device=dev)  # pages of 32 keys: not a multiple of 64
    table = torch.zeros(2, 4, dtype=torch.int32, device=dev)
    checks = [
        ("kvcache: int64 cache_seqlens", lambda: forward_with_kvcache(
            q, k_cache, v_cache, lens.long()), TypeError, "must be torch.int32", None),
        ("kvcache: k without v", lambda: forward_with_kvcache(
            q, k_cache, v_cache, lens, k=q[:, :2]), ValueError, "k and v go together", None),
        ("kvcache: pages of 32 keys", lambda: forward_with_kvcache(
            q, pool, pool.clone(), lens, block_table=table), FlashstepError,
         "multiple of 64", EINVAL),
        ("kvcache: host cache_seqlens", lambda: forward_with_kvcache(
            q, k_cache, v_cache, lens.cpu()), ValueError, "must be a CUDA tensor", None),
    ]
    for what, fn, exc, fragment, code in checks:
        failures += not _expect(what, fn, exc, fragment, code)
    return failures


def _selftest_backward(torch, dev, gen):
    """Each stage's backward, in each dtype it runs in, against fp64 autograd (in
    16 bits by the gradients' rule, _grad_truth), by backward() and through
    attention(); prints a line per stage and dtype, returns the number that failed."""
    problems = []
    for B, H, H_kv, Nq, Nk, d, causal, scale in (
            [(B, H, H, *rest) for B, H, *rest in BACKWARD_PROBLEMS] + GROUPED_BACKWARD_PROBLEMS):
        q, k, v = _inputs(torch, B, H, Nq, Nk, d, dev, gen, H_kv)
        do = torch.randn((B, H, Nq, d), generator=gen, device=dev)  # zero mean, as dO is
        problems.append((q, k, v, do, causal, scale))
    failures = 0
    for stage, name in [(s, n) for s in backward_stages() for n in backward_dtypes(s)]:
        dtype = TORCH_DTYPES[name]
        worst = [0.0, 0.0, 0.0]  # dq, dk, dv
        worst_autograd = 0.0
        bad = 0
        notes = []

        def compare(got, want, bound):
            if bound is None:
                return _compare(torch, got, want, GRAD_ATOL, GRAD_RTOL)
            return _compare(torch, got, want, atol=bound, rtol=0.0)

        try:
            for q, k, v, do, causal, scale in problems:
                if k.shape[1] != q.shape[1] and not grouped_backward(stage):
                    continue  # refused in one line (the C ABI's tests)
                q, k, v, do = (t.to(dtype) for t in (q, k, v, do))
                o, lse = forward(q, k, v, stage=stage, causal=causal, scale=scale)
                _, want, bounds = _grad_truth(torch, q, k, v, do, causal, scale, dtype, o)
                bounds = bounds or (None, None, None)
                o_before, lse_before = o.clone(), lse.clone()
                got = backward(q, k, v, o, lse, do, stage=stage, causal=causal, scale=scale)
                for i, (g, w, b) in enumerate(zip(got, want, bounds)):
                    e, n = compare(g, w, b)
                    worst[i], bad = max(worst[i], e), bad + n
                if not (torch.equal(o, o_before) and torch.equal(lse, lse_before)):
                    notes.append("backward wrote o or lse")
                    bad += 1
                # Through autograd: the loss sum(o * do) has gradient do in o.
                leaves = [t.clone().requires_grad_() for t in (q, k, v)]
                o_auto = attention(*leaves, stage=stage, causal=causal, scale=scale)
                if not torch.equal(o_auto.detach(), o):
                    notes.append("attention()'s o differs from forward()'s")
                    bad += 1
                (o_auto * do).sum().backward()
                for leaf, w, b in zip(leaves, want, bounds):
                    e, n = compare(leaf.grad, w, b)
                    worst_autograd, bad = max(worst_autograd, e), bad + n
            # o.sum() hands the backward a stride-0 gradient; only q needs one here.
            # In 16 bits dq's atomics may round the two runs one unit apart.
            q, k, v = (t.to(dtype) for t in problems[1][:3])
            causal, scale = problems[1][4], problems[1][5]
            q_leaf = q.clone().requires_grad_()
            attention(q_leaf, k, v, stage=stage, causal=causal, scale=scale).sum().backward()
            o, lse = forward(q, k, v, stage=stage, causal=causal, scale=scale)
            dq_ones, _, _ = backward(q, k, v, o, lse, torch.ones_like(o), stage=stage,
                                     causal=causal, scale=scale)
            rtol = GRAD_RTOL if dtype == torch.float32 else 2.0 ** -7
            if _compare(torch, q_leaf.grad, dq_ones.double(), GRAD_ATOL, rtol)[1]:
                notes.append("o.sum().backward() differs from backward() with do = 1")
                bad += 1
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - report the stage and go on
            notes.append(f"{type(e).__name__}: {e}")
            bad += 1
        status = "ok" if bad == 0 else "FAIL"
        failures += bad != 0
        print(f"  {stage:<24} {name} backward: max err dQ {worst[0]:.1e}  dK {worst[1]:.1e}  "
              f"dV {worst[2]:.1e}  autograd {worst_autograd:.1e}  {status}"
              + (f"  ({'; '.join(notes)})" if notes else ""))
    return failures


def selftest(kvcache_only=False):
    try:
        import torch
    except ImportError as e:
        print(f"selftest: needs PyTorch with CUDA: {e}", file=sys.stderr)
        return 1

    if not torch.cuda.is_available():
        print("selftest: no CUDA device visible to torch", file=sys.stderr)
        return 1
    dev = torch.device("cuda", torch.cuda.current_device())
    print(f"selftest: {library_path()}; torch {torch.__version__}; "
          f"{torch.cuda.get_device_name(dev)}")
    TORCH_DTYPES.update(fp32=torch.float32, fp16=torch.float16, bf16=torch.bfloat16)
    gen = torch.Generator(device=dev).manual_seed(0)
    if kvcache_only:
        failures = _selftest_kvcache(torch, dev, gen)
        print(f"selftest: {'FAIL' if failures else 'ok'} ({failures} failing)")
        return 1 if failures else 0
    problems = []
    for B, H, Nq, Nk, d, causal, scale in SELFTEST_PROBLEMS:
        q, k, v = _inputs(torch, B, H, Nq, Nk, d, dev, gen)
        problems.append((q, k, v, causal, scale, _reference(torch, q, k, v, causal, scale)))

    truths = {}  # (problem, dtype name) -> _truth(...), made when first needed

    def truth(i, name):
        if (i, name) not in truths:
            q, k, v, causal, scale, _ = problems[i]
            truths[i, name] = _truth(torch, q, k, v, causal, scale, TORCH_DTYPES[name])
        return truths[i, name]

    failures = 0
    for stage, name in [(s, n) for s in stages() for n in dtypes(s)]:
        worst_o = worst_l = 0.0
        bad = 0
        notes = []
        try:
            for i, (_, _, _, causal, scale, _) in enumerate(problems):
                (q, k, v), o_ref, l_ref, bound = truth(i, name)
                o, lse = forward(q, k, v, stage=stage, causal=causal, scale=scale)
                if o.dtype != q.dtype:
                    notes.append(f"o is {o.dtype}, not q's {q.dtype}")
                    bad += 1
                e, n = _compare(torch, o, o_ref) if bound is None else \
                    _compare(torch, o, o_ref, atol=bound, rtol=0.0)
                worst_o, bad = max(worst_o, e), bad + n
                if lse is not None:
                    e, n = _compare(torch, lse, l_ref)
                    worst_l, bad = max(worst_l, e), bad + n
            # On a side stream: same result as on the default stream.
            (q, k, v), _, _, _ = truth(1, name)
            causal, scale = problems[1][3], problems[1][4]
            o_default, _ = forward(q, k, v, stage=stage, causal=causal, scale=scale)
            side = torch.cuda.Stream(dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                o_side, _ = forward(q, k, v, stage=stage, causal=causal, scale=scale)
            torch.cuda.current_stream(dev).wait_stream(side)
            if not torch.equal(o_default, o_side):
                notes.append("side stream differs")
                bad += 1
            # NaN in one query row: that row of O is NaN, the other rows are not.
            q_nan = q.clone()
            q_nan[0, 0, 5, 0] = math.nan
            o_nan, _ = forward(q_nan, k, v, stage=stage, causal=causal, scale=scale)
            if not (torch.isnan(o_nan[0, 0, 5]).all() and torch.equal(o_nan[1], o_default[1])):
                notes.append("NaN input not propagated like PyTorch")
                bad += 1
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - report the stage and go on
            notes.append(f"{type(e).__name__}: {e}")
            bad += 1
        status = "ok" if bad == 0 else "FAIL"
        failures += bad != 0
        l_text = f"{worst_l:.1e}" if writes_lse(stage) else "-"
        print(f"  {stage:<24} {name}  max err O {worst_o:.1e}  L {l_text:<8} {status}"
              + (f"  ({'; '.join(notes)})" if notes else ""))

    failures += _selftest_backward(torch, dev, gen)
    if "09_split_kv" in stages():
        failures += _selftest_kvcache(torch, dev, gen)

    q, k, v, _, _, _ = problems[0]
    q_host = q.cpu()
    lib = _load()
    lse = torch.empty(q.shape[:3], device=dev)
    o = torch.empty_like(q)
    do = torch.randn(q.shape, generator=gen, device=dev)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def raw(qp, kp, vp, op, lp, stage=DEFAULT_STAGE):
        B, H, Nq, d = q.shape
        code = lib.flashstep_forward(stage.encode(), B, H, Nq, k.shape[2], d, 0, 0.0,
                                     qp, kp, vp, op, lp, None)
        if code != OK:
            raise FlashstepError(code, last_error())

    def raw_backward(lp, dop, dqp, stage=DEFAULT_STAGE):
        B, H, Nq, d = q.shape
        code = lib.flashstep_backward(stage.encode(), B, H, Nq, k.shape[2], d, 0, 0.0,
                                      q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                                      lp, dop, dqp, dk.data_ptr(), dv.data_ptr(), None)
        if code != OK:
            raise FlashstepError(code, last_error())

    qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
    ob = torch.empty_like(qb)

    def raw_typed(dtype_code, qp, stage="02_safe_softmax"):
        B, H, Nq, d = q.shape
        code = lib.flashstep_forward_typed(stage.encode(), dtype_code, B, H, Nq, k.shape[2], d, 0,
                                           0.0, qp, kb.data_ptr(), vb.data_ptr(), ob.data_ptr(),
                                           lse.data_ptr(), None)
        if code != OK:
            raise FlashstepError(code, last_error())

    def backward_in_bf16():
        o16, lse16 = forward(qb, kb, vb, stage="02_safe_softmax")
        return backward(qb, kb, vb, o16, lse16, o16, stage="02_safe_softmax")

    big = torch.ones(1, 1, ENOMEM_N, 1, device=dev)
    with_backward = ", ".join(backward_stages())
    checks = [
        ("bf16 q with float32 k and v", lambda: forward(qb, k, v), TypeError, "share one dtype",
         None),
        ("bf16 on a stage that runs in fp32 only", lambda: forward(qb, kb, vb, stage="04_fa2_q_outer"),
         FlashstepError, "04_fa2_q_outer does not run in bf16 (it runs in fp32)", ESTAGE),
        ("backward in bf16 on stage 02 (its backward is fp32)", backward_in_bf16, FlashstepError,
         "02_safe_softmax's backward does not run in bf16 (it runs in fp32)", ESTAGE),
        ("ABI typed: bf16 Q at an odd address", lambda: raw_typed(DTYPE_CODES["bf16"],
                                                                 qb.data_ptr() + 1),
         FlashstepError, "not aligned to 2 bytes (one bf16 element)", EINVAL),
        ("ABI typed: an unknown dtype code", lambda: raw_typed(7, qb.data_ptr()),
         FlashstepError, "got 7", EINVAL),
        ("float64 q", lambda: forward(q.double(), k, v), TypeError, "torch.float32", None),
        ("CPU tensors", lambda: forward(q_host, k.cpu(), v.cpu()), ValueError, "CUDA tensor",
         None),
        ("3-D q", lambda: forward(q[0], k, v), ValueError, "4-D", None),
        ("non-contiguous q", lambda: forward(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2)), ValueError, "contiguous", None),
        ("k and v shapes differ", lambda: forward(q, k, v[:, :, :-1].contiguous()), ValueError,
         "differ", None),
        ("q and k disagree on d", lambda: forward(q, k[..., :-1].contiguous(),
                                                  v[..., :-1].contiguous()),
         ValueError, "disagree", None),
        ("scale <= 0", lambda: forward(q, k, v, scale=0.0), ValueError, "scale", None),
        ("scale beyond fp32", lambda: forward(q, k, v, scale=1e39), FlashstepError,
         "scale must be finite in fp32", EINVAL),
        ("causal as a string", lambda: forward(q, k, v, causal="False"), TypeError,
         "causal must be True or False", None),
        ("stage name with a NUL", lambda: forward(q, k, v, stage="05\0x"), ValueError,
         "NUL", None),
        ("unknown stage", lambda: forward(q, k, v, stage="99_nope"), FlashstepError,
         "unknown stage '99_nope'", ESTAGE),
        ("d = 300", lambda: forward(*(torch.zeros(1, 1, 4, 300, device=dev),) * 3),
         FlashstepError, "d must be <= 256, got 300", EINVAL),
        ("stage 01's S beyond device memory", lambda: forward(
            *(torch.ones(1, 1, ENOMEM_N, 1, device=dev),) * 3, stage="01_naive"),
         FlashstepError, "of device workspace", ENOMEM),
        ("ABI: host pointer", lambda: raw(q_host.data_ptr(), k.data_ptr(), v.data_ptr(),
                                          o.data_ptr(), lse.data_ptr()),
         FlashstepError, "must be device or managed memory", EINVAL),
        ("ABI: misaligned Q", lambda: raw(q.data_ptr() + 2, k.data_ptr(), v.data_ptr(),
                                          o.data_ptr(), lse.data_ptr()),
         FlashstepError, "not aligned to 4 bytes", EINVAL),
        ("ABI: NULL V", lambda: raw(q.data_ptr(), k.data_ptr(), None, o.data_ptr(),
                                    lse.data_ptr()),
         FlashstepError, "V is NULL", EINVAL),
        ("ABI: L NULL for a stage that writes L", lambda: raw(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), None),
         FlashstepError, "L is NULL", EINVAL),
        ("ABI: O overlaps Q", lambda: raw(q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                          q.data_ptr(), lse.data_ptr()),
         FlashstepError, "O overlaps Q", EINVAL),
        ("backward of a stage without one", lambda: backward(q, k, v, o, lse, do,
                                                             stage="04_fa2_q_outer"),
         FlashstepError, f"has no backward pass; stages with one: {with_backward}", ESTAGE),
        ("attention() with a stage without a backward",
         lambda: attention(q, k, v, stage="01_naive"),
         FlashstepError, "has no backward pass", ESTAGE),
        ("backward, unknown stage", lambda: backward(q, k, v, o, lse, do, stage="99_nope"),
         FlashstepError, "unknown stage '99_nope'", ESTAGE),
        ("backward, lse None", lambda: backward(q, k, v, o, None, do), ValueError,
         "lse is None", None),
        ("backward, do shaped like k", lambda: backward(q, k, v, o, lse, k), ValueError,
         "do must be [B,H,Nq,d]", None),
        ("backward, lse [B,H,Nq,1]", lambda: backward(q, k, v, o, lse[..., None], do),
         ValueError, "lse must be [B,H,Nq]", None),
        ("backward, float64 do", lambda: backward(q, k, v, o, lse, do.double()), TypeError,
         "do must be torch.float32", None),
        ("backward, non-contiguous o", lambda: backward(
            q, k, v, o.transpose(0, 1).contiguous().transpose(0, 1), lse, do),
         ValueError, "o must be contiguous", None),
        ("backward, CPU do", lambda: backward(q, k, v, o, lse, do.cpu()), ValueError,
         "do must be a CUDA tensor", None),
        ("stage 02's backward, P and dS beyond device memory", lambda: backward(
            big, big, big, big, big[..., 0], big, stage="02_safe_softmax"),
         FlashstepError, "of device workspace", ENOMEM),
        ("ABI backward: stage 04", lambda: raw_backward(
            lse.data_ptr(), do.data_ptr(), dq.data_ptr(), stage="04_fa2_q_outer"),
         FlashstepError, f"stages with one: {with_backward}", ESTAGE),
        ("ABI backward: L NULL", lambda: raw_backward(None, do.data_ptr(), dq.data_ptr()),
         FlashstepError, "L is NULL", EINVAL),
        ("ABI backward: dQ overlaps dO", lambda: raw_backward(
            lse.data_ptr(), do.data_ptr(), do.data_ptr()),
         FlashstepError, "dQ overlaps dO", EINVAL),
        ("ABI backward: host dO", lambda: raw_backward(
            lse.data_ptr(), q_host.data_ptr(), dq.data_ptr()),
         FlashstepError, "must be device or managed memory", EINVAL),
    ]
    if torch.cuda.device_count() > 1:
        other = torch.device("cuda", (dev.index + 1) % torch.cuda.device_count())
        checks.append(("tensors on two devices", lambda: forward(q, k.to(other), v),
                       ValueError, "one device", None))
    else:
        print("  bad input, tensors on two devices: skipped (one GPU)")
    for what, fn, exc, fragment, code in checks:
        failures += not _expect(what, fn, exc, fragment, code)
    torch.cuda.synchronize()
    print(f"selftest: {'all passed' if failures == 0 else f'{failures} failure(s)'}")
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--selftest", action="store_true",
                    help="run every stage against fp64 SDPA, every backward against fp64 "
                         "autograd, and check the input errors (GPU)")
    ap.add_argument("--selftest-kvcache", action="store_true",
                    help="run forward_with_kvcache alone against fp64 (GPU; a build with stage "
                         "09 is enough)")
    args = ap.parse_args()
    if args.selftest:
        sys.exit(selftest())
    if args.selftest_kvcache:
        sys.exit(selftest(kvcache_only=True))
    print(f"{library_path()}:")
    for name, title in titles().items():
        print(f"  {name:<24} {title}  [{', '.join(dtypes(name))}]"
              + ("  (+ backward)" if has_backward(name) else ""))


if __name__ == "__main__":
    main()
