"""FlashAttention-2 in Triton, forward and backward (CS336 assignment 2, part two).

Forward (``_flash_fwd_kernel``): FlashAttention-2's Algorithm 1, one program
per (Q tile, batch * head): the grid is (ceil(Nq / BLOCK_Q), B * H). Q, K, V
and O are reached through block pointers (``tl.make_block_ptr``, zero-padded
at the ragged edges by ``boundary_check``); S = Q K^T and O~ += P V are
``tl.dot``s with float32 sums; the online softmax runs in log2 units
(``exp2``, the scale folded in once); P is cast to V's type before P V, as
tensor cores need; ``IS_CAUSAL`` is a ``tl.constexpr``, so the non-causal
kernel carries no mask arithmetic for it, and causal programs stop at the
last K tile any of their rows sees. It writes O and the logsumexp L (natural
log), nothing N x N.

Backward: a Triton backward, not a ``torch.compile``d one. D = rowsum(dO o O)
first (in PyTorch: one pass over O and dO), then two kernels, each
recomputing P = exp(S - L) from the saved L, as FlashAttention-2's Algorithm 2
does:

- ``_flash_bwd_dkdv_kernel``, one program per (K/V tile, batch * head): dK_j
  and dV_j stay on chip while the Q tiles stream past (Algorithm 2's loop order);
- ``_flash_bwd_dq_kernel``, one program per (Q tile, batch * head): dQ_i on
  chip while the K/V tiles stream past.

Splitting dQ into its own kernel recomputes S once more instead of adding dQ
with atomics (what the C++ stage 05 does, and why its dQ varies in the last
bits from run to run): here every gradient is summed in a fixed order, so the
backward is deterministic.

Element types: float32 (``tl.dot`` with ``input_precision="ieee"``, true
fp32, unless allow_tf32=True), bfloat16 and float16 (tensor cores, float32
sums). Head dimensions 1..256 (padded inside to a power of two >= 16, the
smallest ``tl.dot`` operand); any Nq, Nk >= 1.

Causal masks are aligned bottom-right by default (causal_align=
"bottom_right": query i sees key j iff j <= i + Nk - Nq, as the C++ stages);
"top_left" is PyTorch's is_causal (j <= i). See reference.py.

On a machine without a GPU the same kernels run on CPU tensors under Triton's
interpreter: set TRITON_INTERPRET=1 before this module is imported. The
interpreter's ``tl.dot`` multiplies bfloat16 bit patterns as integers
(triton-lang/triton#11584, "not supported yet"), so under the interpreter
bfloat16 operands are widened to float32 just before each dot: exact (every
bfloat16 is a float32, and their products fit in float32's 24 bits), so the
sums are what the tensor cores compute, up to the order of additions.

    o, lse = forward(q, k, v, causal=True)
    dq, dk, dv = backward(q, k, v, o, lse, do, causal=True)
    o = FlashAttentionTriton.apply(q, k, v, True)   # autograd (saves L)
"""
import os

import torch
import triton
import triton.language as tl

from .contract import check_inputs, check_like
from .reference import causal_shift, softmax_scale

LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * LOG2E)
LN2 = 0.6931471805599453    # ln(2): L = (m + log2 l) * LN2 back in natural-log units
# The same inside the kernels (a kernel reads only constexpr globals).
LOG2E_C = tl.constexpr(LOG2E)
LN2_C = tl.constexpr(LN2)
# Whether the kernels below were made by the interpreter (decided by
# TRITON_INTERPRET when triton.jit ran, at this module's import).
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _mm(a, b, PRECISION: tl.constexpr, WIDEN: tl.constexpr):
    """a @ b with float32 sums; WIDEN: bfloat16 operands widened to float32 first
    (the interpreter's bfloat16 dot is broken; see the module's docstring)."""
    if WIDEN:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _round_to(x, dtype: tl.constexpr, WIDEN: tl.constexpr):
    """float32 x rounded to `dtype`, to nearest even, as the GPU rounds. Under
    the interpreter (WIDEN) a float32 -> bfloat16 cast truncates instead, so
    the rounding is done here on the bits first (the usual add-0x7FFF trick)."""
    if WIDEN:
        if dtype == tl.bfloat16:
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def _causal_key_end(q0, n_q, n_k, shift, BLOCK_Q: tl.constexpr, IS_CAUSAL: tl.constexpr):
    """One past the last key a row of the Q tile starting at q0 sees (n_k when
    not causal; <= 0 when no row sees any). Clamped with ifs, not tl.minimum:
    the interpreter's scalars are 1-element arrays, and range() needs ints."""
    k_end = n_k
    if IS_CAUSAL:
        rows_end = q0 + BLOCK_Q
        if rows_end > n_q:
            rows_end = n_q
        k_end = rows_end + shift
        if k_end > n_k:
            k_end = n_k
    return k_end


@triton.jit
def _flash_fwd_kernel(
    Q, K, V, O, L,                    # [BH, Nq, d], [BH, Nk, d] x2, [BH, Nq, d], [BH, Nq] f32
    stride_qb, stride_qn, stride_kb, stride_kn, stride_vb, stride_vn, stride_ob, stride_on,
    n_q, n_k, head_dim,
    scale_log2,                       # softmax scale * log2(e)
    shift,                            # causal: query i sees key j iff j <= i + shift
    D_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
    IS_CAUSAL: tl.constexpr, PRECISION: tl.constexpr, WIDEN: tl.constexpr,
):
    i = tl.program_id(0)                   # Q tile (Algorithm 1, line 3: the grid)
    bh = tl.program_id(1).to(tl.int64)     # batch * head
    q0 = i * BLOCK_Q
    Q_block = tl.make_block_ptr(Q + bh * stride_qb, shape=(n_q, head_dim), strides=(stride_qn, 1),
                                offsets=(q0, 0), block_shape=(BLOCK_Q, D_PAD), order=(1, 0))
    K_block = tl.make_block_ptr(K + bh * stride_kb, shape=(n_k, head_dim), strides=(stride_kn, 1),
                                offsets=(0, 0), block_shape=(BLOCK_K, D_PAD), order=(1, 0))
    V_block = tl.make_block_ptr(V + bh * stride_vb, shape=(n_k, head_dim), strides=(stride_vn, 1),
                                offsets=(0, 0), block_shape=(BLOCK_K, D_PAD), order=(1, 0))
    O_block = tl.make_block_ptr(O + bh * stride_ob, shape=(n_q, head_dim), strides=(stride_on, 1),
                                offsets=(q0, 0), block_shape=(BLOCK_Q, D_PAD), order=(1, 0))
    rows = q0 + tl.arange(0, BLOCK_Q)
    # Line 4: Qi on chip, and the running statistics (log2 units) and O~_i.
    q = tl.load(Q_block, boundary_check=(0, 1), padding_option="zero")
    m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q], tl.float32)
    acc = tl.zeros([BLOCK_Q, D_PAD], tl.float32)
    k_end = _causal_key_end(q0, n_q, n_k, shift, BLOCK_Q, IS_CAUSAL)
    for k0 in range(0, k_end, BLOCK_K):   # line 5
        k = tl.load(K_block, boundary_check=(0, 1), padding_option="zero")   # line 6
        v = tl.load(V_block, boundary_check=(0, 1), padding_option="zero")
        cols = k0 + tl.arange(0, BLOCK_K)
        # BEGIN ASSIGNMENT: lines 8-10 for this K/V tile, in log2 units: S_ij = (Qi Kj^T) scale_log2 with _mm; -inf where a key is past n_k (and, if IS_CAUSAL, where cols > rows + shift); m_new = max(m_i, rowmax S_ij); P~_ij = exp2(S_ij - m_new) (subtract 0 where m_new = -inf); l_i and acc rescaled by exp2(m_i - m_new), plus rowsum P~_ij and P~_ij V_j (P~_ij rounded to v's type first: _round_to(p, v.dtype, WIDEN)); m_i = m_new
        s = _mm(q, tl.trans(k), PRECISION, WIDEN) * scale_log2
        visible = cols[None, :] < n_k
        if IS_CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None] + shift)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row that has seen no key yet has m_new = -inf: subtract 0, so that
        # P~ = exp2(-inf) = 0 rather than exp2(-inf + inf) = NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + _mm(_round_to(p, v.dtype, WIDEN), v, PRECISION, WIDEN)
        m_i = m_new
        # END ASSIGNMENT
        K_block = tl.advance(K_block, (BLOCK_K, 0))
        V_block = tl.advance(V_block, (BLOCK_K, 0))
    # BEGIN ASSIGNMENT: lines 12-13: O_i = acc / l_i (_round_to O's type) into O_block, L_i = (m_i + log2 l_i) LN2_C (natural log) into L for rows < n_q; a row that saw no key (l_i = 0) gets O = 0 and L = -inf
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    tl.store(O_block, _round_to(acc / l_safe[:, None], O.dtype.element_ty, WIDEN),
             boundary_check=(0, 1))
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_safe)) * LN2_C)
    tl.store(L + bh * n_q + rows, lse, mask=rows < n_q)
    # END ASSIGNMENT


@triton.jit
def _flash_bwd_dkdv_kernel(
    Q, K, V, dO, L, D, dK, dV,        # L, D: [BH, Nq] f32; the rest as in the forward
    stride_qb, stride_qn, stride_kb, stride_kn, stride_vb, stride_vn, stride_ob, stride_on,
    n_q, n_k, head_dim, scale, scale_log2, shift,
    D_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
    IS_CAUSAL: tl.constexpr, PRECISION: tl.constexpr, WIDEN: tl.constexpr,
):
    j = tl.program_id(0)                   # K/V tile (Algorithm 2, line 5: the grid)
    bh = tl.program_id(1).to(tl.int64)
    k0 = j * BLOCK_K
    # Causal: Q tiles whose rows all come before key k0 - shift see nothing of this tile.
    q_begin = 0
    if IS_CAUSAL:
        first_row = k0 - shift
        if first_row > 0:
            q_begin = (first_row // BLOCK_Q) * BLOCK_Q
    K_block = tl.make_block_ptr(K + bh * stride_kb, shape=(n_k, head_dim), strides=(stride_kn, 1),
                                offsets=(k0, 0), block_shape=(BLOCK_K, D_PAD), order=(1, 0))
    V_block = tl.make_block_ptr(V + bh * stride_vb, shape=(n_k, head_dim), strides=(stride_vn, 1),
                                offsets=(k0, 0), block_shape=(BLOCK_K, D_PAD), order=(1, 0))
    Q_block = tl.make_block_ptr(Q + bh * stride_qb, shape=(n_q, head_dim), strides=(stride_qn, 1),
                                offsets=(q_begin, 0), block_shape=(BLOCK_Q, D_PAD), order=(1, 0))
    dO_block = tl.make_block_ptr(dO + bh * stride_ob, shape=(n_q, head_dim),
                                 strides=(stride_on, 1), offsets=(q_begin, 0),
                                 block_shape=(BLOCK_Q, D_PAD), order=(1, 0))
    k = tl.load(K_block, boundary_check=(0, 1), padding_option="zero")   # line 6
    v = tl.load(V_block, boundary_check=(0, 1), padding_option="zero")
    cols = k0 + tl.arange(0, BLOCK_K)
    dk = tl.zeros([BLOCK_K, D_PAD], tl.float32)                          # line 7
    dv = tl.zeros([BLOCK_K, D_PAD], tl.float32)
    for q0 in range(q_begin, n_q, BLOCK_Q):                               # line 8
        q = tl.load(Q_block, boundary_check=(0, 1), padding_option="zero")   # line 9
        do = tl.load(dO_block, boundary_check=(0, 1), padding_option="zero")
        rows = q0 + tl.arange(0, BLOCK_Q)
        in_rows = rows < n_q
        L_i = tl.load(L + bh * n_q + rows, mask=in_rows, other=0.0) * LOG2E_C
        D_i = tl.load(D + bh * n_q + rows, mask=in_rows, other=0.0)
        # BEGIN ASSIGNMENT: lines 10-14 and 16 for this Q tile: S_ij = (Qi Kj^T) scale_log2 (log2 units, L_i too), P_ij = exp2(S_ij - L_i) and 0 where a row is past n_q, a key past n_k, or (IS_CAUSAL) cols > rows + shift; dv += P_ij^T dOi (P_ij rounded to do's type with _round_to); dP_ij = dOi Vj^T; dS_ij = P_ij (dP_ij - D_i); dk += dS_ij^T Qi (dS_ij rounded to q's type); all products through _mm
        s = _mm(q, tl.trans(k), PRECISION, WIDEN) * scale_log2
        visible = in_rows[:, None] & (cols[None, :] < n_k)
        if IS_CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None] + shift)
        p = tl.where(visible, tl.exp2(s - L_i[:, None]), 0.0)
        dv += _mm(tl.trans(_round_to(p, do.dtype, WIDEN)), do, PRECISION, WIDEN)
        dp = _mm(do, tl.trans(v), PRECISION, WIDEN)
        ds = p * (dp - D_i[:, None])
        dk += _mm(tl.trans(_round_to(ds, q.dtype, WIDEN)), q, PRECISION, WIDEN)
        # END ASSIGNMENT
        Q_block = tl.advance(Q_block, (BLOCK_Q, 0))
        dO_block = tl.advance(dO_block, (BLOCK_Q, 0))
    # Line 18 (the scale of S = scale Q K^T, applied once).
    dK_block = tl.make_block_ptr(dK + bh * stride_kb, shape=(n_k, head_dim),
                                 strides=(stride_kn, 1), offsets=(k0, 0),
                                 block_shape=(BLOCK_K, D_PAD), order=(1, 0))
    dV_block = tl.make_block_ptr(dV + bh * stride_vb, shape=(n_k, head_dim),
                                 strides=(stride_vn, 1), offsets=(k0, 0),
                                 block_shape=(BLOCK_K, D_PAD), order=(1, 0))
    tl.store(dK_block, _round_to(dk * scale, dK.dtype.element_ty, WIDEN), boundary_check=(0, 1))
    tl.store(dV_block, _round_to(dv, dV.dtype.element_ty, WIDEN), boundary_check=(0, 1))


@triton.jit
def _flash_bwd_dq_kernel(
    Q, K, V, dO, L, D, dQ,
    stride_qb, stride_qn, stride_kb, stride_kn, stride_vb, stride_vn, stride_ob, stride_on,
    n_q, n_k, head_dim, scale, scale_log2, shift,
    D_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
    IS_CAUSAL: tl.constexpr, PRECISION: tl.constexpr, WIDEN: tl.constexpr,
):
    i = tl.program_id(0)                   # Q tile
    bh = tl.program_id(1).to(tl.int64)
    q0 = i * BLOCK_Q
    Q_block = tl.make_block_ptr(Q + bh * stride_qb, shape=(n_q, head_dim), strides=(stride_qn, 1),
                                offsets=(q0, 0), block_shape=(BLOCK_Q, D_PAD), order=(1, 0))
    dO_block = tl.make_block_ptr(dO + bh * stride_ob, shape=(n_q, head_dim),
                                 strides=(stride_on, 1), offsets=(q0, 0),
                                 block_shape=(BLOCK_Q, D_PAD), order=(1, 0))
    K_block = tl.make_block_ptr(K + bh * stride_kb, shape=(n_k, head_dim), strides=(stride_kn, 1),
                                offsets=(0, 0), block_shape=(BLOCK_K, D_PAD), order=(1, 0))
    V_block = tl.make_block_ptr(V + bh * stride_vb, shape=(n_k, head_dim), strides=(stride_vn, 1),
                                offsets=(0, 0), block_shape=(BLOCK_K, D_PAD), order=(1, 0))
    q = tl.load(Q_block, boundary_check=(0, 1), padding_option="zero")
    do = tl.load(dO_block, boundary_check=(0, 1), padding_option="zero")
    rows = q0 + tl.arange(0, BLOCK_Q)
    in_rows = rows < n_q
    L_i = tl.load(L + bh * n_q + rows, mask=in_rows, other=0.0) * LOG2E_C
    D_i = tl.load(D + bh * n_q + rows, mask=in_rows, other=0.0)
    dq = tl.zeros([BLOCK_Q, D_PAD], tl.float32)
    k_end = _causal_key_end(q0, n_q, n_k, shift, BLOCK_Q, IS_CAUSAL)
    for k0 in range(0, k_end, BLOCK_K):
        k = tl.load(K_block, boundary_check=(0, 1), padding_option="zero")
        v = tl.load(V_block, boundary_check=(0, 1), padding_option="zero")
        cols = k0 + tl.arange(0, BLOCK_K)
        # BEGIN ASSIGNMENT: line 15 for this K/V tile: recompute S_ij (log2 units) and P_ij = exp2(S_ij - L_i) masked as in the dK/dV kernel, dP_ij = dOi Vj^T, dS_ij = P_ij (dP_ij - D_i), and dq += dS_ij Kj (dS_ij rounded to k's type with _round_to), through _mm
        s = _mm(q, tl.trans(k), PRECISION, WIDEN) * scale_log2
        visible = in_rows[:, None] & (cols[None, :] < n_k)
        if IS_CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None] + shift)
        p = tl.where(visible, tl.exp2(s - L_i[:, None]), 0.0)
        dp = _mm(do, tl.trans(v), PRECISION, WIDEN)
        ds = p * (dp - D_i[:, None])
        dq += _mm(_round_to(ds, k.dtype, WIDEN), k, PRECISION, WIDEN)
        # END ASSIGNMENT
        K_block = tl.advance(K_block, (BLOCK_K, 0))
        V_block = tl.advance(V_block, (BLOCK_K, 0))
    dQ_block = tl.make_block_ptr(dQ + bh * stride_qb, shape=(n_q, head_dim),
                                 strides=(stride_qn, 1), offsets=(q0, 0),
                                 block_shape=(BLOCK_Q, D_PAD), order=(1, 0))
    tl.store(dQ_block, _round_to(dq * scale, dQ.dtype.element_ty, WIDEN), boundary_check=(0, 1))


# Tiles (rows of Q, keys of K/V per tile), warps and pipeline stages per
# (padded head dimension, 16-bit or not). Not autotuned, so that a run costs
# one compile per (d, dtype, causal) and the benchmark's time is predictable.
# fp32 without TF32 runs its dots on the CUDA cores: smaller tiles, since a
# 64 x 128 fp32 tile is 64 registers a thread in 4 warps. Shared memory
# (stages x (K, V) tiles + Q) stays under an sm_80 block's 163 KiB.
def _tiles(d_pad, sixteen_bit):
    """(BLOCK_Q, BLOCK_K, num_warps, num_stages) of the forward and the dQ kernel."""
    if sixteen_bit:
        return {16: (128, 64, 4, 3), 32: (128, 64, 4, 3), 64: (128, 64, 4, 3),
                128: (128, 64, 8, 2), 256: (64, 32, 8, 2)}[d_pad]
    return {16: (64, 32, 4, 3), 32: (64, 32, 4, 3), 64: (64, 32, 4, 3),
            128: (64, 32, 8, 2), 256: (32, 32, 8, 2)}[d_pad]


def _bwd_tiles(d_pad, sixteen_bit):
    """(BLOCK_Q, BLOCK_K, num_warps, num_stages) of the dK/dV kernel."""
    if sixteen_bit:
        return {16: (64, 64, 4, 3), 32: (64, 64, 4, 3), 64: (64, 64, 4, 2),
                128: (32, 64, 8, 2), 256: (32, 32, 8, 2)}[d_pad]
    return {16: (32, 32, 4, 3), 32: (32, 32, 4, 3), 64: (32, 32, 4, 2),
            128: (32, 32, 8, 2), 256: (32, 32, 8, 1)}[d_pad]


def _prepare(q, k, v, causal_align, scale, allow_tf32):
    check_inputs(q, k, v, causal_align, scale)
    if q.device.type != "cuda" and not INTERPRETED:
        raise ValueError(f"the Triton kernels need CUDA tensors, got {q.device} (on a machine "
                         "without a GPU, set TRITON_INTERPRET=1 before importing "
                         "flashstep_course.triton_flash to run them on the CPU, slowly)")
    d = q.shape[-1]
    d_pad = max(16, triton.next_power_of_2(d))
    sixteen_bit = q.dtype != torch.float32
    meta = dict(
        D_PAD=d_pad,
        PRECISION="tf32" if sixteen_bit or allow_tf32 else "ieee",
        WIDEN=INTERPRETED and q.dtype == torch.bfloat16)
    scale = softmax_scale(d, scale)
    flat = [t.reshape(-1, t.shape[-2], d).contiguous() for t in (q, k, v)]
    return flat, d, scale, meta, sixteen_bit


def _strides(Q, K, V, O):
    return (Q.stride(0), Q.stride(1), K.stride(0), K.stride(1), V.stride(0), V.stride(1),
            O.stride(0), O.stride(1))


def forward(q, k, v, causal=False, scale=None, causal_align="bottom_right", allow_tf32=False):
    """(o, lse): o [..., Nq, d] in q's dtype, lse [..., Nq] float32 (natural log;
    -inf for a row that sees no key, whose o is 0)."""
    (Q, K, V), d, scale, meta, sixteen_bit = _prepare(q, k, v, causal_align, scale, allow_tf32)
    heads, n_q, _ = Q.shape
    n_k = K.shape[1]
    O = torch.empty_like(Q)
    L = torch.empty((heads, n_q), dtype=torch.float32, device=q.device)
    block_q, block_k, warps, stages = _tiles(meta["D_PAD"], sixteen_bit)
    grid = (triton.cdiv(n_q, block_q), heads)
    _flash_fwd_kernel[grid](
        Q, K, V, O, L, *_strides(Q, K, V, O), n_q, n_k, d, scale * LOG2E,
        causal_shift(n_q, n_k, causal_align), BLOCK_Q=block_q, BLOCK_K=block_k,
        IS_CAUSAL=bool(causal), num_warps=warps, num_stages=stages, **meta)
    return O.reshape(q.shape), L.reshape(q.shape[:-1])


def backward(q, k, v, o, lse, do, causal=False, scale=None, causal_align="bottom_right",
             allow_tf32=False):
    """(dq, dk, dv) of the loss sum(o * do), in q's dtype, from the forward's o and lse."""
    (Q, K, V), d, scale, meta, sixteen_bit = _prepare(q, k, v, causal_align, scale, allow_tf32)
    check_like("o", o, q, q.dtype)
    check_like("do", do, q)
    check_like("lse", lse, q[..., 0], torch.float32)
    heads, n_q, _ = Q.shape
    n_k = K.shape[1]
    dO = do.to(q.dtype).reshape(Q.shape).contiguous()
    L = lse.reshape(heads, n_q).contiguous()
    # Algorithm 2, line 4: D = rowsum(dO o O), in float32.
    D = (dO.float() * o.reshape(Q.shape).float()).sum(-1).contiguous()
    dQ, dK, dV = torch.empty_like(Q), torch.empty_like(K), torch.empty_like(V)
    shift = causal_shift(n_q, n_k, causal_align)
    args = (n_q, n_k, d, scale, scale * LOG2E, shift)
    block_q, block_k, warps, stages = _bwd_tiles(meta["D_PAD"], sixteen_bit)
    _flash_bwd_dkdv_kernel[(triton.cdiv(n_k, block_k), heads)](
        Q, K, V, dO, L, D, dK, dV, *_strides(Q, K, V, dO), *args, BLOCK_Q=block_q,
        BLOCK_K=block_k, IS_CAUSAL=bool(causal), num_warps=warps, num_stages=stages, **meta)
    block_q, block_k, warps, stages = _tiles(meta["D_PAD"], sixteen_bit)
    _flash_bwd_dq_kernel[(triton.cdiv(n_q, block_q), heads)](
        Q, K, V, dO, L, D, dQ, *_strides(Q, K, V, dO), *args, BLOCK_Q=block_q,
        BLOCK_K=block_k, IS_CAUSAL=bool(causal), num_warps=warps, num_stages=stages, **meta)
    return dQ.reshape(q.shape), dK.reshape(k.shape), dV.reshape(v.shape)


class FlashAttentionTriton(torch.autograd.Function):
    """o = FlashAttentionTriton.apply(q, k, v, is_causal=False, scale=None,
    causal_align="bottom_right"): the Triton forward, saving L (and q, k, v, o)
    for the Triton backward. One backward; no double backward."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False, scale=None, causal_align="bottom_right"):
        o, lse = forward(q, k, v, is_causal, scale, causal_align)
        ctx.save_for_backward(lse, q, k, v, o)
        ctx.args = (bool(is_causal), scale, causal_align)
        return o

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do):
        lse, q, k, v, o = ctx.saved_tensors
        is_causal, scale, causal_align = ctx.args
        dq, dk, dv = backward(q, k, v, o, lse, do, is_causal, scale, causal_align)
        return dq, dk, dv, None, None, None

