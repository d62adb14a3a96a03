"""The fp64 reference and the causal conventions: what everything else is graded by."""
import math

import pytest
import torch
import torch.nn.functional as F

from flashstep_course import checks
from flashstep_course import reference as R


def loss(q, k, v, do, causal, align):
    o, _ = R.reference_forward(q, k, v, causal, None, align)
    return (o * do).sum()


@pytest.mark.parametrize("causal,align", [(False, "bottom_right"), (True, "bottom_right"),
                                          (True, "top_left")])
@pytest.mark.parametrize("n_q,n_k", [(3, 5), (5, 3), (4, 4)])
def test_reference_gradients_match_central_differences(n_q, n_k, causal, align):
    # float64 throughout: h = 1e-6 keeps truncation and rounding far below 1e-6.
    q, k, v, do = (t.double() for t in R.random_inputs((1, 2, n_q, 3), (1, 2, n_k, 3), seed=4))
    grads = R.reference_backward(q, k, v, do, causal, None, align)
    for x, g in zip((q, k, v), grads):
        for e in range(x.numel()):
            keep = x.view(-1)[e].item()
            x.view(-1)[e] = keep + 1e-6
            up = loss(q, k, v, do, causal, align)
            x.view(-1)[e] = keep - 1e-6
            down = loss(q, k, v, do, causal, align)
            x.view(-1)[e] = keep
            assert g.view(-1)[e].item() == pytest.approx(((up - down) / 2e-6).item(),
                                                         rel=1e-6, abs=1e-6)


def test_top_left_is_pytorchs_is_causal_and_bottom_right_is_the_projects():
    q, k, v, _ = (t.double() for t in R.random_inputs((2, 3, 7, 5), (2, 3, 11, 5), seed=5))
    o_top, _ = R.reference_forward(q, k, v, True, None, "top_left")
    assert torch.allclose(o_top, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    o_br, _ = R.reference_forward(q, k, v, True, None, "bottom_right")
    mask = torch.arange(11)[None, :] <= torch.arange(7)[:, None] + (11 - 7)
    assert torch.allclose(o_br, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    # Nq == Nk: one mask.
    o1, l1 = R.reference_forward(q, q, v[..., :7, :], True, None, "top_left")
    o2, l2 = R.reference_forward(q, q, v[..., :7, :], True, None, "bottom_right")
    assert torch.equal(o1, o2) and torch.equal(l1, l2)


def test_rows_that_see_no_key_are_zero_with_l_minus_inf_and_no_gradient():
    # Bottom-right with Nq > Nk: rows 0 .. Nq - Nk - 1 see no key.
    q, k, v, do = R.random_inputs((1, 2, 6, 4), (1, 2, 3, 4), seed=6)
    o, L = R.reference_forward(q, k, v, True)
    assert torch.equal(o[..., :3, :], torch.zeros_like(o[..., :3, :]))
    assert (L[..., :3] == -math.inf).all() and torch.isfinite(L[..., 3:]).all()
    dq, dk, dv = R.reference_backward(q, k, v, do, True)
    assert torch.equal(dq[..., :3, :], torch.zeros_like(dq[..., :3, :]))
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv))
    # Top-left with Nq > Nk: every row sees key 0.
    _, L_top = R.reference_forward(q, k, v, True, None, "top_left")
    assert torch.isfinite(L_top).all()


def test_a_bad_causal_align_is_one_clear_error():
    q = torch.ones(1, 2, 4)
    with pytest.raises(ValueError, match="causal_align must be one of"):
        R.reference_forward(q, q, q, True, None, "diagonal")


def test_the_ragged_grid_is_read_from_tests_shapes_h():
    shapes = checks.ragged_shapes()
    assert len(shapes) == 12 and (1, 2, 1023, 1024, 64) in shapes and (2, 1, 1, 1, 1) in shapes
    assert len(checks.ragged_problems()) == 24


def test_the_checks_name_the_tensor_and_the_rows():
    q, k, v, do = R.random_inputs((1, 2, 40, 16), (1, 2, 40, 16), seed=7)
    truth = checks.Truth(q, k, v, do, True)
    o, lse = (t.float() for t in (truth.O, truth.L))
    assert checks.check_forward(o, lse, truth)[0]
    o_bad = o.clone()
    o_bad[0, 1, 17:20] += 1.0
    ok, _, _, problems = checks.check_forward(o_bad, lse, truth)
    assert not ok and "O differs" in problems[0] and "head (0, 1), rows 17..19" in problems[0]
    grads = [g.float() for g in truth.grads]
    assert checks.check_backward(grads, truth)[0]
    grads[1] = grads[1] * 2
    ok, _, problems = checks.check_backward(grads, truth)
    assert not ok and "dK differs" in problems[0] and "likely cause (dK wrong)" in problems[-1]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_gradient_rule_allows_fp32_noise_where_dS_cancels_and_no_more(dtype):
    # One key per row: P = 1, O = V, so dS = P o (dP - D) = 0 and dQ = dK = 0
    # exactly; a correct kernel still carries the fp32 rounding of dP and D. The
    # H200 showed 2e-4 (bf16) and 3e-4 (fp16) in dK here, past the old bound of
    # 2x naive + 1e-4 = 1.3e-4: give 5e-4 of such noise.
    q, k, v, do = R.random_inputs((2, 1, 239, 256), (2, 1, 1, 256), dtype, seed=0)
    truth = checks.Truth(q, k, v, do, False)
    noise = 5e-4 * torch.sign(torch.randn(truth.grads[1].shape,
                                          generator=torch.Generator().manual_seed(1)))
    grads = [truth.grads[0].to(dtype), (truth.grads[1] + noise).to(dtype), truth.grads[2].to(dtype)]
    ok, _, problems = checks.check_backward(grads, truth)
    assert ok, problems
    # A wrong D (from an O 1% off) leaves dS = 0.01 D, about 0.6 here: caught.
    scale = 1 / math.sqrt(256)
    dS = -0.01 * (do.double() * v.double()).sum(-1, keepdim=True)   # [2, 1, 239, 1]
    grads[1] = (scale * dS.transpose(-1, -2) @ q.double()).to(dtype)
    ok, _, problems = checks.check_backward(grads, truth)
    assert not ok and "dK differs" in problems[0]


def test_the_cancellation_floors_leave_ordinary_problems_as_strict_as_before():
    q, k, v, do = R.random_inputs((1, 2, 113, 40), (1, 2, 203, 40), torch.bfloat16, seed=0)
    truth = checks.Truth(q, k, v, do, True)
    naive = R.naive_low_precision_backward(q, k, v, do, True)
    floors = R.cancellation_floors(q, k, v, do, True)
    for g, x, floor in zip(truth.grads, naive, floors):
        assert floor < 0.01 * float((x.double() - g).abs().max())
