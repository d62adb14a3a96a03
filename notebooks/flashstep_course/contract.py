"""What every implementation of the track accepts, checked in one place.

q [..., Nq, d], k and v [..., Nk, d]: the same leading dimensions (CS336's
[batch, N, d], the C++ contract's [B, H, N, d], or any other), the same d,
one dtype (float32, bfloat16 or float16) and one device. Nq, Nk >= 1 and
1 <= d <= MAX_HEAD_DIM. Every error is one TypeError or ValueError naming the
argument.
"""
import math

import torch

from .reference import CAUSAL_ALIGNS

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_HEAD_DIM = 256  # the C++ contract's d in 1..256


def check_inputs(q, k, v, causal_align="bottom_right", scale=None):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in DTYPES:
            raise TypeError(f"{name} must be torch.float32, torch.bfloat16 or torch.float16, "
                            f"got {t.dtype}")
        if t.dim() < 2:
            raise ValueError(f"{name} must be [..., N, d], got shape {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    if q.dim() != k.dim() or q.shape[:-2] != k.shape[:-2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q [..., Nq, d] {tuple(q.shape)} and k [..., Nk, d] {tuple(k.shape)} "
                         "disagree on the leading dimensions or d")
    n_q, n_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    if n_q < 1 or n_k < 1 or not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"need Nq, Nk >= 1 and 1 <= d <= {MAX_HEAD_DIM}, got Nq={n_q}, "
                         f"Nk={n_k}, d={d}")
    if causal_align not in CAUSAL_ALIGNS:
        raise ValueError(f"causal_align must be one of {CAUSAL_ALIGNS}, got {causal_align!r}")
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        raise ValueError(f"scale must be a finite number (or None for 1/sqrt(d)), got {scale!r}")


def check_like(name, t, like, dtype=None):
    """One more tensor (o, lse, do) must have `like`'s shape, device and dtype."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != tuple(like.shape):
        raise ValueError(f"{name} must be shaped {tuple(like.shape)}, got {tuple(t.shape)}")
    if t.device != like.device:
        raise ValueError(f"{name} must be on {like.device}, got {t.device}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {t.dtype}")
