"""The Triton kernels beside the C++ stages, on the same inputs, through the C ABI
(notebooks/flashstep.py, libflashstep.so). GPU only: skipped without a CUDA
device or without the library (build it: cmake --build build --target flashstep_capi).

Each side is held to its own bound against the fp64 reference of the same
(rounded) inputs, and the two are compared with each other: in float32 both
sit within the fp32 bound of fp64, so they differ by at most twice it; in
bfloat16 both meet FlashAttention's rule. Stages: 05_sequence_parallel and
06_warp_split_q (fp32 forward), 05's backward (fp32, FlashAttention-2's
Algorithm 2 with dQ by atomics), 07_tensor_core (bf16 forward)."""
import pytest
import torch

from flashstep_course import checks
from flashstep_course import reference as R

pytestmark = [pytest.mark.gpu, pytest.mark.triton]
SHAPES = [(2, 3, 97, 113, 59), (1, 2, 130, 67, 64), (1, 4, 1000, 1000, 128), (2, 1, 33, 45, 256)]


@pytest.fixture(scope="module")
def fs():
    import flashstep
    try:
        flashstep.library_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    return flashstep


def inputs(shape, dtype, seed):
    B, H, n_q, n_k, d = shape
    return R.random_inputs((B, H, n_q, d), (B, H, n_k, d), dtype, "cuda", seed)


@pytest.mark.parametrize("stage", ["05_sequence_parallel", "06_warp_split_q"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_fp32_forward_beside_the_cpp_stage(fs, stage, causal, shape):
    from flashstep_course import triton_flash
    q, k, v, do = inputs(shape, torch.float32, 11)
    truth = checks.Truth(q, k, v, do, causal, backward=False)
    o_c, l_c = fs.forward(q, k, v, stage=stage, causal=causal)
    o_t, l_t = triton_flash.forward(q, k, v, causal=causal)
    for who, o, lse in ((stage, o_c, l_c), ("triton", o_t, l_t)):
        ok, _, _, problems = checks.check_forward(o, lse, truth)
        assert ok, f"{who}: {problems}"
    atol, rtol = R.FP32_TOLERANCE
    assert R.compare(o_t, o_c.double(), 2 * atol, 2 * rtol)[1] == 0
    assert R.compare(l_t, l_c.double(), 2 * atol, 2 * rtol)[1] == 0


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_fp32_backward_beside_stage_05(fs, causal, shape):
    from flashstep_course import triton_flash
    q, k, v, do = inputs(shape, torch.float32, 12)
    truth = checks.Truth(q, k, v, do, causal)
    o_c, l_c = fs.forward(q, k, v, stage="05", causal=causal)
    g_c = fs.backward(q, k, v, o_c, l_c, do, stage="05", causal=causal)
    o_t, l_t = triton_flash.forward(q, k, v, causal=causal)
    g_t = triton_flash.backward(q, k, v, o_t, l_t, do, causal=causal)
    for who, g in (("05", g_c), ("triton", g_t)):
        ok, _, problems = checks.check_backward(g, truth)
        assert ok, f"{who}: {problems}"
    atol, rtol = R.FP32_GRAD_TOLERANCE
    for a, b in zip(g_t, g_c):
        assert R.compare(a, b.double(), 2 * atol, 2 * rtol)[1] == 0


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_bf16_forward_beside_stage_07(fs, causal, shape):
    from flashstep_course import triton_flash
    if "07_tensor_core" not in fs.stages() or "bf16" not in fs.dtypes("07_tensor_core"):
        pytest.skip("no stage 07_tensor_core in bf16 in this libflashstep.so")
    q, k, v, do = inputs(shape, torch.bfloat16, 13)
    truth = checks.Truth(q, k, v, do, causal, backward=False)
    for who, (o, lse) in (("07_tensor_core", fs.forward(q, k, v, stage="07_tensor_core",
                                                         causal=causal)),
                          ("triton", triton_flash.forward(q, k, v, causal=causal))):
        ok, _, _, problems = checks.check_forward(o, lse, truth)
        assert ok, f"{who}: {problems}"
