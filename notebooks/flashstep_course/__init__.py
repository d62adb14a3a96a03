"""flashstep's PyTorch + Triton track: Stanford CS336 assignment 2's FlashAttention
deliverables beside the C++ stages, graded by the same fp64 reference.

    import sys; sys.path.insert(0, "notebooks")
    from flashstep_course import pytorch_flash, triton_flash, reference
    o = pytorch_flash.FlashAttentionPytorch.apply(q, k, v, True)   # tiled PyTorch, autograd
    o = triton_flash.FlashAttentionTriton.apply(q, k, v, True)     # Triton (CUDA, or CPU
                                                                   # under TRITON_INTERPRET=1)

Modules: reference (fp64 truth, the causal conventions, the naive attention
that sets the low-precision bound), contract (input checks), pytorch_flash,
triton_flash (imported on first use: it needs Triton). docs/assignments/
07_pytorch_triton.md is the assignment; notebooks/README.md the overview.
"""
import importlib

from . import contract, pytorch_flash, reference  # noqa: F401
from .pytorch_flash import FlashAttentionPytorch  # noqa: F401

__all__ = ["contract", "pytorch_flash", "reference", "triton_flash", "FlashAttentionPytorch",
           "FlashAttentionTriton"]


def __getattr__(name):
    # triton_flash (and FlashAttentionTriton) without importing Triton up front:
    # the PyTorch part works where Triton is not installed.
    if name == "triton_flash":
        return importlib.import_module(".triton_flash", __name__)
    if name == "FlashAttentionTriton":
        return importlib.import_module(".triton_flash", __name__).FlashAttentionTriton
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
