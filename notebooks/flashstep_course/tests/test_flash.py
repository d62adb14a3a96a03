"""The PyTorch and Triton implementations against the fp64 reference.

On the CPU (CTest course_py.cpu): the PyTorch code on the whole ragged grid
in float32, the Triton kernels under the interpreter on its small shapes, and
bfloat16 on a few; both causal conventions; the autograd Functions; CS336's
[batch, N, d] layout; the input errors. On a GPU (course_py.gpu, marked gpu):
both on the whole grid in float32, bfloat16 and float16, and beside the C++
stages through the C ABI (test_capi.py).
"""
import math

import pytest
import torch

from flashstep_course import checks, pytorch_flash
from flashstep_course import reference as R

TRITON = pytest.param("triton", marks=pytest.mark.triton)
IMPLS = ["pytorch", TRITON]
GRID = checks.ragged_problems()
SMALL = [p for p in GRID if p[2] <= 256 and p[3] <= 256]
BF16_FEW = [(2, 2, 113, 203, 40), (1, 2, 128, 217, 1), (2, 1, 239, 1, 64), (1, 1, 70, 33, 128)]


def impl_module(name):
    if name == "pytorch":
        return pytorch_flash
    from flashstep_course import triton_flash
    return triton_flash


def run_and_check(impl, shape, causal, dtype, device, align="bottom_right", seed=1):
    B, H, n_q, n_k, d = shape
    q, k, v, do = R.random_inputs((B, H, n_q, d), (B, H, n_k, d), dtype, device, seed)
    truth = checks.Truth(q, k, v, do, causal, None, align)
    o, lse = impl.forward(q, k, v, causal=causal, causal_align=align)
    ok_f, _, _, problems = checks.check_forward(o, lse, truth)
    grads = impl.backward(q, k, v, o, lse, do, causal=causal, causal_align=align)
    ok_b, _, more = checks.check_backward(grads, truth)
    assert ok_f and ok_b, "; ".join(problems + more)


@pytest.mark.parametrize("problem", GRID, ids=lambda p: checks.describe(*p))
def test_pytorch_on_the_ragged_grid_fp32(problem):
    run_and_check(pytorch_flash, problem[:5], problem[5], torch.float32, "cpu")


@pytest.mark.triton
@pytest.mark.parametrize("problem", SMALL, ids=lambda p: checks.describe(*p))
def test_triton_on_the_ragged_grids_small_shapes_fp32(problem, device):
    run_and_check(impl_module("triton"), problem[:5], problem[5], torch.float32, device)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", BF16_FEW, ids=str)
def test_bf16_by_flashattentions_rule(impl, shape, causal, device):
    run_and_check(impl_module(impl), shape, causal, torch.bfloat16, device)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape", [(1, 2, 45, 33, 40), (2, 1, 33, 97, 64)], ids=str)
def test_top_left_causal_is_selectable(impl, shape, device):
    run_and_check(impl_module(impl), shape, True, torch.float32, device, align="top_left")


@pytest.mark.parametrize("impl", IMPLS)
def test_autograd_function_saves_L_and_matches_backward(impl, device):
    module = impl_module(impl)
    fn = module.FlashAttentionPytorch if impl == "pytorch" else module.FlashAttentionTriton
    # CS336's layout: [batch, N, d], causal over square sequences.
    q, k, v, do = R.random_inputs((3, 70, 32), (3, 70, 32), torch.float32, device, 2)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = fn.apply(*leaves, True)
    saved = [t for t in o.grad_fn.saved_tensors if t.shape == (3, 70)]
    assert saved and saved[0].dtype == torch.float32, "L [batch, Nq] is saved for the backward"
    (o * do).sum().backward()
    o_ref, _ = R.reference_forward(q, k, v, True)
    assert R.compare(o, o_ref, *R.FP32_TOLERANCE)[1] == 0
    for leaf, want in zip(leaves, R.reference_backward(q, k, v, do, True)):
        assert R.compare(leaf.grad, want, *R.FP32_GRAD_TOLERANCE)[1] == 0
    # o.sum() hands the backward a stride-0 gradient.
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    fn.apply(*leaves, True).sum().backward()
    want = R.reference_backward(q, k, v, torch.ones_like(do), True)[0]
    assert R.compare(leaves[0].grad, want, *R.FP32_GRAD_TOLERANCE)[1] == 0


@pytest.mark.parametrize("impl", IMPLS)
def test_a_row_that_sees_no_key_is_zero_not_nan(impl, device):
    q, k, v, do = R.random_inputs((1, 1, 50, 8), (1, 1, 20, 8), torch.float32, device, 3)
    module = impl_module(impl)
    o, lse = module.forward(q, k, v, causal=True)
    assert torch.equal(o[..., :30, :], torch.zeros_like(o[..., :30, :]))
    assert (lse[..., :30] == -math.inf).all()
    dq, dk, dv = module.backward(q, k, v, o, lse, do, causal=True)
    assert torch.equal(dq[..., :30, :], torch.zeros_like(dq[..., :30, :]))
    assert not any(torch.isnan(g).any() for g in (dq, dk, dv))


@pytest.mark.parametrize("impl", IMPLS)
def test_bad_inputs_are_one_clear_error(impl, device):
    forward = impl_module(impl).forward
    q = torch.ones(1, 2, 5, 8, device=device)
    cases = [
        (lambda: forward(q.double(), q.double(), q.double()), TypeError, "torch.float32"),
        (lambda: forward(q, q.bfloat16(), q), TypeError, "share one dtype"),
        (lambda: forward(q, q[..., :4], q[..., :4]), ValueError, "disagree"),
        (lambda: forward(q, q, q[:, :, :3]), ValueError, "shapes differ"),
        (lambda: forward(q[0, 0, 0], q, q), ValueError, "[..., N, d]"),
        (lambda: forward(q, q, q, causal=True, causal_align="diag"), ValueError, "causal_align"),
        (lambda: forward(q, q, q, scale=math.nan), ValueError, "scale"),
        (lambda: forward(*(torch.ones(1, 5, 300, device=device),) * 3), ValueError, "d <= 256"),
        (lambda: forward(q, q, "v"), TypeError, "v must be a torch.Tensor"),
    ]
    for fn, exc, fragment in cases:
        with pytest.raises(exc) as info:
            fn()
        assert fragment in str(info.value), str(info.value)


@pytest.mark.triton
def test_triton_refuses_cpu_tensors_without_the_interpreter():
    from flashstep_course import triton_flash
    if triton_flash.INTERPRETED:
        pytest.skip("under TRITON_INTERPRET=1 CPU tensors are what the kernels take")
    q = torch.ones(1, 1, 4, 16)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        triton_flash.forward(q, q, q)


# ---------------------------------------------------------------- on a GPU

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("impl", ["pytorch", "triton"])
def test_the_whole_ragged_grid_on_the_gpu(impl, dtype):
    module = impl_module(impl)
    failures = []
    for seed, (B, H, n_q, n_k, d, causal) in enumerate(GRID):
        try:
            run_and_check(module, (B, H, n_q, n_k, d), causal, dtype, "cuda", seed=seed)
        except AssertionError as e:
            failures.append(f"{checks.describe(B, H, n_q, n_k, d, causal, dtype)}: {e}")
    assert not failures, "\n".join(failures)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_triton_on_long_sequences_spot_checked(dtype):
    from flashstep_course import triton_flash
    q, k, v, _ = R.random_inputs((1, 2, 8191, 128), (1, 2, 8191, 128), dtype, "cuda", 5)
    o, lse = triton_flash.forward(q, k, v, causal=True)
    rows = torch.arange(0, 8191, 97, device="cuda")
    o_ref, l_ref = R.reference_forward_rows(q, k, v, rows, True)
    tol = R.FP32_TOLERANCE if dtype == torch.float32 else (2e-2, 2e-2)
    assert R.compare(o[..., rows, :], o_ref, *tol)[1] == 0
    assert R.compare(lse[..., rows], l_ref, *R.FP32_TOLERANCE)[1] == 0
