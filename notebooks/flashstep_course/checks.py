"""Grading one run against the fp64 reference, with the diagnosis in words.

The rules are the C++ project's (stages/common/check.h):

- float32: O and L within kFp32Tolerance (|got - want| <= 1e-5 + 1e-4 |want|),
  dQ, dK, dV within kFp32GradTolerance (1e-4 + 1e-4 |want|), elementwise;
- bfloat16 / float16: FlashAttention's own rule against the fp64 reference of
  the rounded inputs: max |O - O_ref| <= 2 max |O_naive - O_ref| + 1e-5, with
  O_naive attention done naively in that type (reference.naive_low_precision:
  S and softmax in fp32, P and O rounded); each gradient likewise against the
  naive backward in that type (reference.naive_low_precision_backward: the
  same formulas untiled, P, O and dS rounded where a 16-bit kernel rounds
  them), plus 1e-4, plus where dS = P o (dP - D) cancels the fp32 rounding
  a correct kernel carries there (reference.cancellation_floors). L stays
  float32 in every type and keeps the float32 bound.

Plus the contract's rules: no NaN; a row that sees no key has O = 0,
L = -inf and zero dQ; a row that sees keys has a finite L. Every failure
names the tensor, the first rows it happens in and what usually causes it.
"""
import math
import pathlib
import re

import torch

from . import reference as R

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHAPES_H = ROOT / "tests" / "shapes.h"


def ragged_shapes(path=SHAPES_H):
    """(B, H, Nq, Nk, d) of the shared ragged grid, read from tests/shapes.h
    (kRaggedShapes), the one list the C++ tests and graders use too."""
    text = pathlib.Path(path).read_text()
    body = re.search(r"kRaggedShapes\s*=\s*\{(.*?)\};", text, re.S)
    if not body:
        raise RuntimeError(f"{path}: no kRaggedShapes list")
    shapes = [tuple(int(x) for x in m.groups())
              for m in re.finditer(r"\{\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+)\s*\}",
                                   body.group(1))]
    if not shapes:
        raise RuntimeError(f"{path}: kRaggedShapes is empty")
    return shapes


def ragged_problems(path=SHAPES_H):
    """[(B, H, Nq, Nk, d, causal)]: every shape, non-causal then causal (tests/shapes.h)."""
    return [(*s, causal) for s in ragged_shapes(path) for causal in (False, True)]


def describe(B, H, n_q, n_k, d, causal, dtype=torch.float32, causal_align="bottom_right"):
    """'B=1 H=2 Nq=113 Nk=203 d=40 causal' as the C++ Problem::describe() writes it."""
    text = f"B={B} H={H} Nq={n_q} Nk={n_k} d={d}{' causal' if causal else ''}"
    if causal and causal_align != "bottom_right":
        text += f" ({causal_align})"
    name = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype)
    return text + (f" {name}" if name else "")


class Truth:
    """What one problem's outputs are checked against (computed once per problem)."""

    def __init__(self, q, k, v, do, causal, scale=None, causal_align="bottom_right",
                 backward=True):
        self.causal, self.scale, self.align = causal, scale, causal_align
        self.dtype = q.dtype
        self.O, self.L = R.reference_forward(q, k, v, causal, scale, causal_align)
        n_q, n_k = q.shape[-2], k.shape[-2]
        mask = R.visible_mask(n_q, n_k, causal, causal_align, q.device)
        self.sees = (torch.ones(n_q, dtype=torch.bool, device=q.device) if mask is None
                     else mask.any(dim=-1))          # [Nq]: row sees at least one key
        self.grads = R.reference_backward(q, k, v, do, causal, scale, causal_align) \
            if backward else None
        self.o_bound = self.grad_bounds = None
        if q.dtype != torch.float32:
            naive = R.naive_low_precision(q, k, v, causal, scale, causal_align).double()
            self.o_bound = 2 * float((naive - self.O).abs().max()) + R.LOW_PRECISION_FLOOR
            if backward:
                naive = R.naive_low_precision_backward(q, k, v, do, causal, scale, causal_align)
                floors = R.cancellation_floors(q, k, v, do, causal, scale, causal_align)
                self.grad_bounds = [2 * float((x.double() - g).abs().max())
                                    + R.LOW_PRECISION_GRAD_FLOOR + floor
                                    for x, g, floor in zip(naive, self.grads, floors)]


def _rows_text(bad_rows, n_rows):
    """'rows 96..112' / 'rows 3, 17, 40 and 9 more' of one head's bad query rows."""
    rows = sorted(set(int(r) for r in bad_rows))
    runs, start = [], rows[0]
    for a, b in zip(rows, rows[1:] + [None]):
        if b != a + 1:
            runs.append(f"{start}" if start == a else f"{start}..{a}")
            start = b
    text = ", ".join(runs[:4]) + (f" and {len(runs) - 4} more runs" if len(runs) > 4 else "")
    return f"rows {text} (of {n_rows})"


def _where(bad, per_row=False):
    """'37 elements, first in head (0, 1), rows 96..112 (of 113)' for a bool tensor
    `bad` shaped [..., N, d] (or [..., N] with per_row)."""
    rows_bad = bad if per_row else bad.any(dim=-1)
    head = tuple(int(x) for x in rows_bad.nonzero()[0])[:-1]
    rows = rows_bad[head].nonzero().flatten()
    return (f"{int(bad.sum())} elements, first in head {head}, "
            f"{_rows_text(rows, rows_bad.shape[-1])}")


def _compare(name, got, want, tol, bound, problems, hint):
    """Appends the words for what is wrong with `got`; returns its max abs error."""
    if bound is None:
        err, n_bad, _ = R.compare(got, want, *tol)
        bad = None
        if n_bad:
            g = got.double()
            inf = torch.isinf(want)
            e = torch.where(inf, torch.zeros_like(want), (g - want).abs())
            bad = (inf & (g != want)) | (~inf & ~(e <= tol[0] + tol[1] * want.abs()))
        rule = f"|err| <= {tol[0]:g} + {tol[1]:g} |ref|"
    else:
        g = got.double()
        e = (g - want).abs()
        err = float(torch.nan_to_num(e, nan=math.inf).max())
        bad = ~(e <= bound) if err > bound else None
        rule = f"max |err| <= {bound:.3g} (2x naive in this type + floor)"
    if bad is not None and bad.any():
        problems.append(f"{name} differs from the fp64 reference (max abs error {err:.3g}; "
                        f"{rule}): {_where(bad, name == 'L')} outside{hint}")
    return err


def check_forward(o, lse, truth):
    """(pass, max error O, max error L, problems) for one forward's o and lse."""
    problems = []
    if o.dtype != truth.dtype:
        problems.append(f"o is {o.dtype}, not the inputs' {truth.dtype}")
    if lse is None or tuple(lse.shape) != tuple(truth.L.shape):
        problems.append(f"lse must be shaped {tuple(truth.L.shape)} (one float per query row), "
                        f"got {None if lse is None else tuple(lse.shape)}")
        return False, math.nan, math.nan, problems
    for name, t in (("O", o), ("L", lse)):
        nans = torch.isnan(t)
        if nans.any():
            problems.append(f"{name} has NaN ({_where(nans, name == 'L')}): "
                            "typically exp(-inf - (-inf)) in a row or tile that sees no key yet "
                            "(subtract 0 when the running max is -inf), or 0/0 when l = 0")
    empty = ~truth.sees
    if empty.any():
        o_empty, l_empty = o[..., empty, :], lse[..., empty]
        if (o_empty != 0).any() or (l_empty != -math.inf).any():
            problems.append(f"rows that see no key (causal, Nq > Nk: rows 0..{int(empty.sum()) - 1}) "
                            "are not O = 0, L = -inf: the contract gives such a row O = 0 and "
                            "L = -inf, never NaN")
    l_seen = lse[..., truth.sees]
    if (l_seen == -math.inf).any():
        problems.append("L = -inf in a row that sees keys: l stayed 0 (was the running sum "
                        "ever updated?)")
    causal_hint = (" (check the mask: query i sees key j iff j <= i + shift, and the K tiles "
                   "the causal loop skips)" if truth.causal else "")
    err_o = _compare("O", o, truth.O, R.FP32_TOLERANCE, truth.o_bound, problems, causal_hint)
    err_l = _compare("L", lse, truth.L, R.FP32_TOLERANCE, None, problems,
                     " (L = m + log l per row: natural log, of the scaled scores)")
    return not problems, err_o, err_l, problems


GRAD_HINTS = {
    "dV": "dV_j = sum_i P_ij^T dO_i: is P recomputed as exp(S - L) with the scale and the mask?",
    "dK": "dK_j = scale sum_i dS_ij^T Q_i with dS = P o (dP - D): check the scale, D = "
          "rowsum(dO o O) and dP = dO V^T",
    "dQ": "dQ_i = scale sum_j dS_ij K_j: check the scale and that every K tile a row sees "
          "adds into it",
}


def check_backward(grads, truth):
    """(pass, [max error dQ, dK, dV], problems) for one backward's gradients."""
    problems, errs = [], []
    causal_hint = " (only in causal cases? check the mask and the tiles skipped)" \
        if truth.causal else ""
    bad_names = []
    for k, (name, got, want) in enumerate(zip(("dQ", "dK", "dV"), grads, truth.grads)):
        if tuple(got.shape) != tuple(want.shape):
            problems.append(f"{name} must be shaped {tuple(want.shape)}, got {tuple(got.shape)}")
            errs.append(math.nan)
            continue
        if got.dtype != truth.dtype:
            problems.append(f"{name} is {got.dtype}, not the inputs' {truth.dtype}")
        nans = torch.isnan(got)
        if nans.any():
            problems.append(f"{name} has NaN ({_where(nans)}): P = exp(S - L) in a row "
                            "with L = -inf (a row that sees no key must get P = 0)")
        bound = None if truth.grad_bounds is None else truth.grad_bounds[k]
        before = len(problems)
        errs.append(_compare(name, got, want, R.FP32_GRAD_TOLERANCE, bound, problems,
                             causal_hint))
        if len(problems) > before:
            bad_names.append(name)
    if bad_names:
        if bad_names == ["dV"]:
            hint = GRAD_HINTS["dV"]
        elif "dV" in bad_names:
            hint = ("dV is wrong too, so P itself is: P_ij = exp(scale Q_i K_j^T - L_i), "
                    "masked, with L in natural-log units")
        else:
            hint = " ".join(GRAD_HINTS[n] for n in bad_names)
        problems.append(f"likely cause ({', '.join(bad_names)} wrong): {hint}")
    return not problems, errs, problems
