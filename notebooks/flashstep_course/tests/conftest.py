"""Shared fixtures of the course track's tests (run by tests/run.py, or pytest).

Two kinds of test: CPU ones (the PyTorch code on the CPU, the Triton kernels
under Triton's interpreter, TRITON_INTERPRET=1) and GPU ones (marked `gpu`,
skipped unless torch sees a CUDA device and TRITON_INTERPRET is unset).
"""
import os
import pathlib
import sys

import pytest

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(NOTEBOOKS))

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (and TRITON_INTERPRET unset)")
    config.addinivalue_line("markers", "triton: runs the Triton kernels (GPU or interpreter)")
    # Triton's interpreter converts 1-element arrays to int (NumPy 2.3 warns).
    config.addinivalue_line("filterwarnings",
                            "ignore:Conversion of an array with ndim:DeprecationWarning")


def _why_no_triton():
    """None when the Triton kernels can run here, else the reason."""
    try:
        import torch
        import triton  # noqa: F401
    except ImportError as e:
        return f"Triton not installed ({e})"
    if not INTERPRET:
        return None if torch.cuda.is_available() else \
            "no CUDA device and TRITON_INTERPRET is not 1"
    # The interpreter of Triton <= 3.6 turns a loop bound into int() of a
    # 1-element array, which NumPy >= 2.4 refuses: probe it once.
    from flashstep_course import reference, triton_flash
    try:
        q = torch.ones(1, 1, 2, 16)
        triton_flash.forward(q, q, q)
    except Exception as e:  # noqa: BLE001 - the reason is reported as the skip
        import numpy
        return (f"Triton {triton.__version__}'s interpreter fails here with NumPy "
                f"{numpy.__version__} ({type(e).__name__}: {str(e)[:120]}); "
                "the venv of `make test` pins numpy<2.4")
    del reference
    return None


def pytest_collection_modifyitems(config, items):
    import torch
    why_no_triton = _why_no_triton()
    gpu_ok = torch.cuda.is_available() and not INTERPRET
    for item in items:
        if "gpu" in item.keywords and not gpu_ok:
            item.add_marker(pytest.mark.skip(
                reason="needs a CUDA device" if not torch.cuda.is_available()
                else "TRITON_INTERPRET=1: the GPU tests run without it"))
        if "triton" in item.keywords and why_no_triton:
            item.add_marker(pytest.mark.skip(reason=why_no_triton))


@pytest.fixture(scope="session")
def device():
    import torch
    return "cuda" if torch.cuda.is_available() and not INTERPRET else "cpu"
