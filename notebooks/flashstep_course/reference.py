"""The truth the course track is graded against, in float64 torch, and the
naive attention that sets the low-precision bound.

The same definitions as the C++ project's fp64 reference
(stages/common/reference.cpp) and its checks (stages/common/check.h):

- O = softmax(scale * Q K^T + mask) V and L = logsumexp of the masked scaled
  scores (natural log), per row; a row that sees no key has O = 0 and
  L = -inf, never NaN;
- the backward of the loss sum(O o dO): dV = P^T dO, dP = dO V^T,
  D = rowsum(dO o O), dS = P o (dP - D), dQ = scale dS K, dK = scale dS^T Q;
  a row that sees no key has P = 0 and contributes nothing.

Causal masks, two conventions (both are "query i sees key j iff j <= i + shift"):

- ``"bottom_right"`` (the default, the C++ stages' and FlashAttention >= 2.1's):
  shift = Nk - Nq, so the last query sees every key. With Nq > Nk the first
  Nq - Nk queries see no key (O = 0, L = -inf).
- ``"top_left"`` (PyTorch's ``is_causal`` in ``scaled_dot_product_attention``,
  and CS336's ``i >= j``): shift = 0, so query i sees keys 0..i.

When Nq == Nk the two are the same mask.

Tensors are [..., N, d] with any leading dimensions (CS336 uses
[batch, N, d]; the C++ contract [B, H, N, d]), on any device.
"""
import math

import torch

CAUSAL_ALIGNS = ("bottom_right", "top_left")

# common/check.h: |got - want| <= atol + rtol |want| against fp64.
FP32_TOLERANCE = (1e-5, 1e-4)       # kFp32Tolerance: O and L
FP32_GRAD_TOLERANCE = (1e-4, 1e-4)  # kFp32GradTolerance: dQ, dK, dV
# The floor of FlashAttention's low-precision rule (kLowPrecisionFloor), and
# of the gradients' (kFp32GradTolerance's absolute part).
LOW_PRECISION_FLOOR = FP32_TOLERANCE[0]
LOW_PRECISION_GRAD_FLOOR = FP32_GRAD_TOLERANCE[0]
INPUT_MEAN = 0.5  # common/check.h kInputMean: zero-mean inputs hide errors


def softmax_scale(d, scale=None):
    """1/sqrt(d) unless a scale is given."""
    return 1.0 / math.sqrt(d) if scale is None else float(scale)


def causal_shift(n_queries, n_keys, causal_align="bottom_right"):
    """The shift of the causal mask: query i sees key j iff j <= i + shift."""
    if causal_align == "bottom_right":
        return n_keys - n_queries
    if causal_align == "top_left":
        return 0
    raise ValueError(f"causal_align must be one of {CAUSAL_ALIGNS}, got {causal_align!r}")


def visible_mask(n_queries, n_keys, causal, causal_align="bottom_right", device=None):
    """[Nq, Nk] bool, True where query i may see key j; None when not causal."""
    if not causal:
        causal_shift(n_queries, n_keys, causal_align)  # still reject a bad name
        return None
    shift = causal_shift(n_queries, n_keys, causal_align)
    i = torch.arange(n_queries, device=device)[:, None]
    j = torch.arange(n_keys, device=device)[None, :]
    return j <= i + shift


def _masked_softmax(s, mask):
    """(P, L) of scores s [..., Nq, Nk] under mask (True: visible): rows that see
    nothing get P = 0 and L = -inf instead of NaN."""
    if mask is None:
        L = torch.logsumexp(s, dim=-1)
        return torch.exp(s - L[..., None]), L
    s = s.masked_fill(~mask, -math.inf)
    L = torch.logsumexp(s, dim=-1)          # -inf on an empty row
    finite = torch.where(torch.isinf(L), torch.zeros_like(L), L)
    P = torch.exp(s - finite[..., None])     # exp(-inf) = 0 on masked entries
    return P, L


def reference_forward(q, k, v, causal=False, scale=None, causal_align="bottom_right"):
    """fp64 (O, L): O [..., Nq, d], L [..., Nq] (natural-log logsumexp)."""
    q64, k64, v64 = q.double(), k.double(), v.double()
    scale = softmax_scale(q.shape[-1], scale)
    mask = visible_mask(q.shape[-2], k.shape[-2], causal, causal_align, q.device)
    P, L = _masked_softmax(scale * (q64 @ k64.transpose(-1, -2)), mask)
    return P @ v64, L


def reference_backward(q, k, v, do, causal=False, scale=None, causal_align="bottom_right"):
    """fp64 (dQ, dK, dV) of the loss sum(O o dO), by the textbook formulas."""
    q64, k64, v64, do64 = q.double(), k.double(), v.double(), do.double()
    scale = softmax_scale(q.shape[-1], scale)
    mask = visible_mask(q.shape[-2], k.shape[-2], causal, causal_align, q.device)
    P, _ = _masked_softmax(scale * (q64 @ k64.transpose(-1, -2)), mask)
    O = P @ v64
    dV = P.transpose(-1, -2) @ do64
    dP = do64 @ v64.transpose(-1, -2)
    D = (do64 * O).sum(-1, keepdim=True)
    dS = P * (dP - D)
    return scale * (dS @ k64), scale * (dS.transpose(-1, -2) @ q64), dV


def cancellation_floors(q, k, v, do, causal=False, scale=None, causal_align="bottom_right"):
    """(dQ, dK, dV) floors of the gradients' low-precision rule: the fp32
    rounding a correct kernel may carry where dS = P o (dP - D) cancels.

    dP_ij = dO_i . V_j and D_i = dO_i . O_i are d-term fp32 dot products, each
    off by about sqrt(d) u times the sum of its terms' sizes (u = 2^-24, the
    sqrt for errors of random sign; tensor cores and a separate D kernel sum
    in other orders than a naive backward does). Where the two nearly cancel,
    as they do exactly when a row sees one key (P = 1, O = V, dS = 0), that
    rounding is all dS holds, and dQ = scale dS K and dK = scale dS^T Q carry it
    through the same sums as the gradients themselves. Summed with absolute
    values, per gradient element, and its largest taken:

        M_ij    = P_ij (|dO_i| . |V_j| + |dO_i| . |O_i|)
        floor_dQ = sqrt(d) u max_i scale (M |K|)_i,  floor_dK likewise with M^T |Q|

    dV = P^T dO subtracts nothing: its floor is 0. On problems where dS does
    not cancel, these floors are ~1e-5 of the naive 16-bit error, so the rule
    is as strict as before; on a one-key row they are what separates a correct
    kernel's fp32 noise (seen on an H200: 2e-4 and 3e-4 in dK at Nk = 1,
    d = 256) from a wrong one, whose dS is off by |dP| itself."""
    q64, k64, v64, do64 = q.double(), k.double(), v.double(), do.double()
    d = q.shape[-1]
    scale = softmax_scale(d, scale)
    mask = visible_mask(q.shape[-2], k.shape[-2], causal, causal_align, q.device)
    P, _ = _masked_softmax(scale * (q64 @ k64.transpose(-1, -2)), mask)
    O = P @ v64
    M = P * (do64.abs() @ v64.abs().transpose(-1, -2) + (do64.abs() * O.abs()).sum(-1, keepdim=True))
    rounding = math.sqrt(d) * 2.0 ** -24
    return (rounding * scale * float((M @ k64.abs()).max()),
            rounding * scale * float((M.transpose(-1, -2) @ q64.abs()).max()), 0.0)


def reference_forward_rows(q, k, v, rows, causal=False, scale=None, causal_align="bottom_right"):
    """fp64 (O, L) of the query rows `rows` (a 1-D index tensor) only: O [..., R, d],
    L [..., R]; for spot checks of problems whose N x N would not fit."""
    q64, k64, v64 = q[..., rows, :].double(), k.double(), v.double()
    scale = softmax_scale(q.shape[-1], scale)
    mask = visible_mask(q.shape[-2], k.shape[-2], causal, causal_align, q.device)
    P, L = _masked_softmax(scale * (q64 @ k64.transpose(-1, -2)),
                           None if mask is None else mask[rows])
    return P @ v64, L


def standard_attention(q, k, v, causal=False, scale=None, causal_align="bottom_right"):
    """Attention as PyTorch code writes it without FlashAttention, in q's dtype,
    differentiable by autograd: S = scale Q K^T and O = P V in the input type,
    the softmax in fp32 (then rounded to the type, as FlashAttention's own
    tests' attention_ref does). It stores S and P: O(N^2) memory. The
    benchmark's "naive PyTorch"."""
    scale = softmax_scale(q.shape[-1], scale)
    s = (q @ k.transpose(-1, -2)) * scale
    mask = visible_mask(q.shape[-2], k.shape[-2], causal, causal_align, q.device)
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf)
        # A row that sees no key: 0 instead of -inf everywhere, zeroed below.
        s = s.masked_fill(~mask.any(dim=-1)[:, None], 0.0)
    p = torch.softmax(s.float(), dim=-1)
    if mask is not None:
        p = p.masked_fill(~mask, 0.0)
    return p.to(q.dtype) @ v


def naive_low_precision(q, k, v, causal=False, scale=None, causal_align="bottom_right"):
    """O of attention done naively in q's 16-bit dtype, common/check.h's O_naive:
    S and its softmax in fp32 from the (rounded) inputs, P rounded to the dtype,
    O = P V summed in fp32 and rounded. Rows that see no key give 0."""
    scale = softmax_scale(q.shape[-1], scale)
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    mask = visible_mask(q.shape[-2], k.shape[-2], causal, causal_align, q.device)
    P, _ = _masked_softmax(s, mask)
    return (P.to(q.dtype).float() @ v.float()).to(q.dtype)


def naive_low_precision_backward(q, k, v, do, causal=False, scale=None,
                                 causal_align="bottom_right"):
    """(dQ, dK, dV) of the backward done naively in q's 16-bit dtype, the
    gradients' counterpart of naive_low_precision: untiled, every product from
    operands in the dtype with fp32 sums, and rounded to the dtype wherever a
    16-bit kernel stores or multiplies: O and P (as in the forward), dS before
    dS K and dS^T Q, and the gradients themselves. D = rowsum(dO o O) and
    dS = P o (dP - D) in fp32, from the rounded O. What the gradients' bound
    in checks.py is measured against."""
    dt = q.dtype
    scale = softmax_scale(q.shape[-1], scale)
    qf, kf, vf, dof = q.float(), k.float(), v.float(), do.to(dt).float()
    mask = visible_mask(q.shape[-2], k.shape[-2], causal, causal_align, q.device)
    P, _ = _masked_softmax(scale * (qf @ kf.transpose(-1, -2)), mask)
    P16 = P.to(dt).float()
    O = (P16 @ vf).to(dt).float()
    D = (dof * O).sum(-1, keepdim=True)
    dS = (P * (dof @ vf.transpose(-1, -2) - D)).to(dt).float()
    return ((scale * (dS @ kf)).to(dt), (scale * (dS.transpose(-1, -2) @ qf)).to(dt),
            (P16.transpose(-1, -2) @ dof).to(dt))


def random_inputs(shape_q, shape_kv, dtype=torch.float32, device="cpu", seed=0):
    """(q, k, v, do): q and do [..., Nq, d], k and v [..., Nk, d], each from
    Normal(INPUT_MEAN, 1) with a fixed seed (as common/check.h's random_inputs
    and random_output_grad: a nonzero mean makes dS = P o (dP - D) cancel, as a
    real backward must survive), drawn in fp32 and rounded to dtype."""
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def draw(shape):
        return (torch.randn(shape, generator=gen, dtype=torch.float32) + INPUT_MEAN).to(
            device=device, dtype=dtype)
    return draw(shape_q), draw(shape_kv), draw(shape_kv), draw(shape_q)


def compare(got, want, atol, rtol):
    """(max abs error, elements outside |got - want| <= atol + rtol |want|, index of
    the worst element or None). Infinite reference values must match exactly;
    NaN in got is always outside."""
    got = got.detach().double()
    want = want.detach().to(got.device)
    inf = torch.isinf(want)
    err = torch.where(inf, torch.zeros_like(want), (got - want).abs())
    bad = (inf & (got != want)) | (~inf & ~(err <= atol + rtol * want.abs()))
    finite_err = torch.where(torch.isnan(err), torch.full_like(err, math.inf), err)
    worst = None
    if bad.any():
        ratio = torch.where(bad, finite_err / (atol + rtol * want.abs()), torch.zeros_like(err))
        ratio = torch.where(torch.isnan(ratio), torch.full_like(ratio, math.inf), ratio)
        worst = tuple(int(x) for x in torch.unravel_index(torch.argmax(ratio), ratio.shape))
    max_err = float(finite_err.max()) if err.numel() else 0.0
    return max_err, int(bad.sum()), worst
