"""FlashAttention-2 in plain PyTorch, tile by tile (CS336 assignment 2, part one).

The forward is FlashAttention-2's Algorithm 1 with its loops written out in
Python: for each Q tile, the K/V tiles stream past while the running row max
m, the running sum l and the unnormalised output O~ stay "on chip" (here: in
small tensors), and only O and the logsumexp L = m + log l are written. The
backward is Algorithm 2 by recomputation: P = exp(S - L) rebuilt tile by tile
from the saved L, never stored whole, with D = rowsum(dO o O).

It runs on the CPU or a GPU, in float32 or bfloat16/float16 (S, the softmax
statistics and every sum in float32; P rounded to V's type before P V, as a
tensor-core kernel does), on [..., N, d] tensors with any leading dimensions.
It is slow (Python loops over tiles): it is the readable version of what the
Triton kernels (triton_flash.py) and the C++ stages 04/05 do.

    o, lse = forward(q, k, v, causal=True)                 # o in q's dtype, lse float32
    dq, dk, dv = backward(q, k, v, o, lse, do, causal=True)
    o = FlashAttentionPytorch.apply(q, k, v, True)         # autograd (saves L)

Causal masks are aligned bottom-right by default (causal_align=
"bottom_right": query i sees key j iff j <= i + Nk - Nq, as the C++ stages);
"top_left" is PyTorch's is_causal (j <= i). See reference.py.
"""
import math

import torch

from .contract import check_inputs, check_like
from .reference import causal_shift, softmax_scale

# Tile sizes (Bq, Bk): CS336 asks for at least 16 x 16. Any size works; the
# loops below handle a last tile that is smaller (ragged N).
BLOCK_Q = 32
BLOCK_K = 32


def _flatten(t):
    """[..., N, d] -> [BH, N, d] (a view where possible)."""
    return t.reshape(-1, t.shape[-2], t.shape[-1])


def _visible(rows, cols, shift, causal):
    """[R, C] bool: query rows[r] sees key cols[c] (None when nothing is masked)."""
    if not causal:
        return None
    return cols[None, :] <= rows[:, None] + shift


def _key_end(row_end, n_keys, shift, causal):
    """One past the last key that any query row < row_end sees."""
    if not causal:
        return n_keys
    return max(0, min(n_keys, row_end + shift))


def forward(q, k, v, causal=False, scale=None, causal_align="bottom_right",
            block_q=BLOCK_Q, block_k=BLOCK_K):
    """(o, lse): o [..., Nq, d] in q's dtype, lse [..., Nq] float32 (natural log;
    -inf for a row that sees no key, whose o is 0)."""
    check_inputs(q, k, v, causal_align, scale)
    scale = softmax_scale(q.shape[-1], scale)
    Q, K, V = _flatten(q), _flatten(k), _flatten(v)
    heads, n_q, d = Q.shape
    n_k = K.shape[1]
    shift = causal_shift(n_q, n_k, causal_align)
    O = torch.empty((heads, n_q, d), dtype=q.dtype, device=q.device)
    L = torch.empty((heads, n_q), dtype=torch.float32, device=q.device)
    for q0 in range(0, n_q, block_q):  # Algorithm 1, line 3 (a thread block each, on a GPU)
        q1 = min(q0 + block_q, n_q)
        Qi = Q[:, q0:q1].float()
        rows = torch.arange(q0, q1, device=q.device)
        # Line 4: the running statistics and O~, on chip.
        m_i = torch.full((heads, q1 - q0), -math.inf, device=q.device)
        l_i = torch.zeros((heads, q1 - q0), device=q.device)
        O_i = torch.zeros((heads, q1 - q0, d), device=q.device)
        for k0 in range(0, _key_end(q1, n_k, shift, causal), block_k):  # line 5
            k1 = min(k0 + block_k, n_k)
            Kj, Vj = K[:, k0:k1], V[:, k0:k1]
            visible = _visible(rows, torch.arange(k0, k1, device=q.device), shift, causal)
            # BEGIN ASSIGNMENT: lines 8-10 of Algorithm 1: S_ij = scale Qi Kj^T (masked: -inf where visible is False), m_new = max(m_i, rowmax S_ij), P~_ij = exp(S_ij - m_new) (subtract 0 where m_new = -inf), l_i = e^(m_i - m_new) l_i + rowsum P~_ij, O_i = e^(m_i - m_new) O_i + P~_ij V_j with P~_ij cast to V's dtype first; then m_i = m_new
            S_ij = scale * (Qi @ Kj.float().transpose(1, 2))
            if visible is not None:
                S_ij = S_ij.masked_fill(~visible, -math.inf)
            m_new = torch.maximum(m_i, S_ij.amax(dim=-1))
            # A row that has seen no key yet has m_new = -inf: subtract 0 instead,
            # so P~ = exp(-inf) = 0 rather than exp(-inf + inf) = NaN.
            m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            P_tilde = torch.exp(S_ij - m_safe[..., None])
            alpha = torch.exp(m_i - m_safe)
            l_i = alpha * l_i + P_tilde.sum(dim=-1)
            O_i = alpha[..., None] * O_i + P_tilde.to(V.dtype).float() @ Vj.float()
            m_i = m_new
            # END ASSIGNMENT
        # BEGIN ASSIGNMENT: lines 12-13 of Algorithm 1: O_i = O~_i / l_i and L_i = m_i + log(l_i) into O and L; a row that saw no key (l_i = 0) gets O = 0 and L = -inf, never NaN
        empty = l_i == 0
        l_safe = torch.where(empty, torch.ones_like(l_i), l_i)
        O[:, q0:q1] = (O_i / l_safe[..., None]).to(O.dtype)
        L[:, q0:q1] = torch.where(empty, torch.full_like(m_i, -math.inf), m_i + torch.log(l_safe))
        # END ASSIGNMENT
    return O.reshape(q.shape), L.reshape(q.shape[:-1])


def backward(q, k, v, o, lse, do, causal=False, scale=None, causal_align="bottom_right",
             block_q=BLOCK_Q, block_k=BLOCK_K):
    """(dq, dk, dv) of the loss sum(o * do), shaped like q, k, v and in their
    dtype, from the forward's o and lse (FlashAttention-2's Algorithm 2: K/V
    tiles outside, Q tiles inside, P recomputed from L)."""
    check_inputs(q, k, v, causal_align, scale)
    check_like("o", o, q, q.dtype)
    check_like("do", do, q)
    check_like("lse", lse, q[..., 0], torch.float32)
    scale = softmax_scale(q.shape[-1], scale)
    Q, K, V = _flatten(q), _flatten(k), _flatten(v)
    O, dO = _flatten(o).float(), _flatten(do).float()
    L = lse.reshape(Q.shape[:2])
    heads, n_q, d = Q.shape
    n_k = K.shape[1]
    shift = causal_shift(n_q, n_k, causal_align)
    # BEGIN ASSIGNMENT: line 4 of Algorithm 2: D = rowsum(dO o O), one float per query row [heads, Nq]
    D = (dO * O).sum(dim=-1)
    # END ASSIGNMENT
    dQ = torch.zeros((heads, n_q, d), device=q.device)  # line 3: float32 sums
    dK = torch.empty(K.shape, dtype=k.dtype, device=k.device)
    dV = torch.empty(V.shape, dtype=v.dtype, device=v.device)
    for k0 in range(0, n_k, block_k):  # line 5
        k1 = min(k0 + block_k, n_k)
        Kj, Vj = K[:, k0:k1].float(), V[:, k0:k1].float()
        cols = torch.arange(k0, k1, device=q.device)
        dK_j = torch.zeros((heads, k1 - k0, d), device=q.device)  # line 7: on chip
        dV_j = torch.zeros((heads, k1 - k0, d), device=q.device)
        # Causal: Q tiles whose rows all come before key k0 - shift see nothing of this tile.
        first_row = max(0, k0 - shift) if causal else 0
        for q0 in range(first_row - first_row % block_q, n_q, block_q):  # line 8
            q1 = min(q0 + block_q, n_q)
            Qi, dOi = Q[:, q0:q1].float(), dO[:, q0:q1]
            visible = _visible(torch.arange(q0, q1, device=q.device), cols, shift, causal)
            # BEGIN ASSIGNMENT: lines 10-16 of Algorithm 2: S_ij = scale Qi Kj^T, P_ij = exp(S_ij - L_i) (0 where masked, and in a row with L_i = -inf), dV_j += P_ij^T dOi (P_ij cast to V's dtype first), dP_ij = dOi Vj^T, dS_ij = P_ij o (dP_ij - D_i), dQ_i += scale dS_ij Kj, dK_j += scale dS_ij^T Qi
            S_ij = scale * (Qi @ Kj.transpose(1, 2))
            L_i = L[:, q0:q1, None]
            seen = torch.isfinite(L_i)
            P_ij = torch.exp(S_ij - torch.where(seen, L_i, torch.zeros_like(L_i)))
            P_ij = torch.where(seen, P_ij, torch.zeros_like(P_ij))
            if visible is not None:
                P_ij = P_ij.masked_fill(~visible, 0.0)
            dV_j += P_ij.to(V.dtype).float().transpose(1, 2) @ dOi
            dP_ij = dOi @ Vj.transpose(1, 2)
            dS_ij = P_ij * (dP_ij - D[:, q0:q1, None])
            dQ[:, q0:q1] += scale * (dS_ij @ Kj)
            dK_j += scale * (dS_ij.transpose(1, 2) @ Qi)
            # END ASSIGNMENT
        dK[:, k0:k1], dV[:, k0:k1] = dK_j.to(dK.dtype), dV_j.to(dV.dtype)  # line 18
    return dQ.to(q.dtype).reshape(q.shape), dK.reshape(k.shape), dV.reshape(v.shape)


class FlashAttentionPytorch(torch.autograd.Function):
    """o = FlashAttentionPytorch.apply(q, k, v, is_causal=False, scale=None,
    causal_align="bottom_right"): the tiled forward, saving L (and q, k, v, o)
    for the recomputing backward. One backward; no double backward."""

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
        dq, dk, dv = backward(q, k, v, o, lse, do.contiguous(), is_causal, scale, causal_align)
        return dq, dk, dv, None, None, None
