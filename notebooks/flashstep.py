#!/usr/bin/env python3
"""flashstep from Python: run any stage on PyTorch tensors through libflashstep.so.

    import sys; sys.path.insert(0, "notebooks")
    import flashstep
    flashstep.stages()        # ['01_naive', ..., '05_sequence_parallel']
    o, lse = flashstep.forward(q, k, v, stage="04_fa2_q_outer", causal=True)

q [B,H,Nq,d], k and v [B,H,Nk,d]: float32, contiguous, on one CUDA device.
o is [B,H,Nq,d]; lse (the logsumexp L) is [B,H,Nq], or None for a stage that
writes none (01_naive). The causal mask is aligned bottom-right (query i sees
key j iff j <= i + Nk - Nq), unlike SDPA's is_causal (top-left) when Nq != Nk.
The kernels run on torch's current stream; there is no autograd.

The library is $FLASHSTEP_LIB (the file, or its folder), else the first of
build/stages/capi/libflashstep.so and build-gpu/stages/capi/libflashstep.so
under the repository root; `make` builds it. torch is imported only when
forward() or the self-test runs, so CPU-only tools can call stages().

    python3 notebooks/flashstep.py             # list the stages
    python3 notebooks/flashstep.py --selftest  # on a GPU: every stage against fp64 SDPA
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
        lib.flashstep_forward.argtypes = [
            ctypes.c_char_p, i64, i64, i64, i64, i64, ctypes.c_int, ctypes.c_double,
            ptr, ptr, ptr, ptr, ptr, ptr]
        lib.flashstep_forward.restype = ctypes.c_int
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


def _stage_bytes(stage):
    if not isinstance(stage, str):
        raise TypeError(f"stage must be a str such as '{DEFAULT_STAGE}', "
                        f"got {type(stage).__name__}")
    return stage.encode()


def _check_inputs(torch, q, k, v):
    """One clear TypeError or ValueError for the first thing wrong with q, k, v."""
    named = (("q", q), ("k", k), ("v", v))
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in named:
        if t.dtype != torch.float32:
            raise TypeError(f"{name} must be torch.float32 (flashstep's stages are fp32), "
                            f"got {t.dtype}")
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
    if (q.shape[0], q.shape[1], q.shape[3]) != (k.shape[0], k.shape[1], k.shape[3]):
        raise ValueError(f"q [B,H,Nq,d] {tuple(q.shape)} and k [B,H,Nk,d] {tuple(k.shape)} "
                         "disagree on B, H or d")


def forward(q, k, v, stage=DEFAULT_STAGE, causal=False, scale=None):
    """Runs one stage: returns (o, lse), lse None for a stage that writes no L.

    scale: softmax scale, None for 1/sqrt(d). Queued on torch's current stream
    of q's device, like any torch op. FlashstepError (a RuntimeError) carries
    the library's one-line message when the library refuses or fails."""
    import torch

    _check_inputs(torch, q, k, v)
    if scale is None:
        scale_arg = 0.0  # the ABI's "1/sqrt(d)"
    else:
        scale_arg = float(scale)
        if not (math.isfinite(scale_arg) and scale_arg > 0):
            raise ValueError(f"scale must be a finite number > 0 (or None), got {scale}")
    lse_written = writes_lse(stage)
    lib = _load()
    B, H, Nq, d = q.shape
    Nk = k.shape[2]
    with torch.cuda.device(q.device):
        o = torch.empty_like(q, memory_format=torch.contiguous_format)
        lse = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device) if lse_written else None
        stream = torch.cuda.current_stream(q.device).cuda_stream

        def call():
            return lib.flashstep_forward(
                _stage_bytes(stage), B, H, Nq, Nk, d, int(bool(causal)), scale_arg,
                q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                lse.data_ptr() if lse is not None else None, stream)

        code = call()
        if code == ENOMEM:
            # torch's caching allocator may hold the memory the workspace needs.
            torch.cuda.empty_cache()
            code = call()
    if code != OK:
        raise FlashstepError(code, last_error())
    return o, lse


# ---------------------------------------------------------------------------
# Self-test (python3 notebooks/flashstep.py --selftest): needs a GPU and torch.

# |got - want| <= ATOL + RTOL * |want|: the CLI's kFp32Tolerance (common/check.h).
ATOL, RTOL = 1e-5, 1e-4
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
# Stage 01 keeps S [B,H,Nq,Nk] in a workspace: at N = 250000 that is 233 GiB,
# more than any one GPU here has, so the call must fail with ENOMEM up front.
ENOMEM_N = 250_000


def _reference(torch, q, k, v, causal, scale):
    """fp64 O and L. SDPA's is_causal is top-left, so the bottom-right mask is
    built here; rows that see no key are O = 0 (SDPA gives NaN), L = -inf."""
    import torch.nn.functional as F

    q64, k64, v64 = q.double(), k.double(), v.double()
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


def _compare(torch, got, want):
    """(max abs error, elements outside the bound); infinities must match exactly."""
    got = got.double()
    inf = torch.isinf(want)
    err = torch.where(inf, torch.zeros_like(want), (got - want).abs())
    bad = (inf & (got != want)) | (~inf & ~(err <= ATOL + RTOL * want.abs()))
    return err.max().item(), int(bad.sum().item())


def _inputs(torch, B, H, Nq, Nk, d, device, gen):
    def draw(n):
        return torch.randn((B, H, n, d), generator=gen, device=device) + INPUT_MEAN
    return draw(Nq), draw(Nk), draw(Nk)


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


def selftest():
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
    gen = torch.Generator(device=dev).manual_seed(0)
    problems = []
    for B, H, Nq, Nk, d, causal, scale in SELFTEST_PROBLEMS:
        q, k, v = _inputs(torch, B, H, Nq, Nk, d, dev, gen)
        problems.append((q, k, v, causal, scale, _reference(torch, q, k, v, causal, scale)))

    failures = 0
    for stage in stages():
        worst_o = worst_l = 0.0
        bad = 0
        notes = []
        try:
            for q, k, v, causal, scale, (o_ref, l_ref) in problems:
                o, lse = forward(q, k, v, stage=stage, causal=causal, scale=scale)
                e, n = _compare(torch, o, o_ref)
                worst_o, bad = max(worst_o, e), bad + n
                if lse is not None:
                    e, n = _compare(torch, lse, l_ref)
                    worst_l, bad = max(worst_l, e), bad + n
            # On a side stream: same result as on the default stream.
            q, k, v, causal, scale, _ = problems[1]
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
        print(f"  {stage:<24} max err O {worst_o:.1e}  L {l_text:<8} {status}"
              + (f"  ({'; '.join(notes)})" if notes else ""))

    q, k, v, _, _, _ = problems[0]
    q_host = q.cpu()
    lib = _load()
    lse = torch.empty(q.shape[:3], device=dev)
    o = torch.empty_like(q)

    def raw(qp, kp, vp, op, lp, stage=DEFAULT_STAGE):
        B, H, Nq, d = q.shape
        code = lib.flashstep_forward(stage.encode(), B, H, Nq, k.shape[2], d, 0, 0.0,
                                     qp, kp, vp, op, lp, None)
        if code != OK:
            raise FlashstepError(code, last_error())

    checks = [
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
                    help="run every stage against fp64 SDPA and check the input errors (GPU)")
    args = ap.parse_args()
    if args.selftest:
        sys.exit(selftest())
    print(f"{library_path()}:")
    for name, title in titles().items():
        print(f"  {name:<24} {title}")


if __name__ == "__main__":
    main()
