#!/usr/bin/env python3
"""The Python helper's (notebooks/flashstep.py) doors that need neither torch
nor a GPU: stage names through libflashstep.so ($FLASHSTEP_LIB), and the checks
forward() and backward() make on their plain arguments. Prints a line per check
and exits 1 if any failed. The checks that need tensors are in its --selftest."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "notebooks"))
import flashstep  # noqa: E402


def refused(fn, exc_type, fragment):
    """Whether fn() raises exc_type with fragment in its message."""
    try:
        fn()
    except exc_type as e:
        return fragment in str(e)
    return False


class Shaped:
    """A stand-in for a tensor: a shape and nothing else, for the checks made
    before torch is imported."""

    def __init__(self, shape):
        self.shape = shape


CHECKS = [
    ("a stage name holding a NUL, which C would cut short",
     lambda: refused(lambda: flashstep.writes_lse("05\0x"), ValueError, "NUL")),
    ("a number naming two stages",
     lambda: refused(lambda: flashstep.writes_lse("6"), flashstep.FlashstepError,
                     "name exactly one")),
    ("a stage that is not a str",
     lambda: refused(lambda: flashstep.has_backward(5), TypeError, "must be a str")),
    ("a known stage", lambda: flashstep.writes_lse("05") and flashstep.has_backward("05")),
    ("grouped heads in the backward: stage 07's, not stage 05's",
     lambda: flashstep.grouped_backward("07_tensor_core")
     and flashstep.grouped_backward("07_tensor_core_deterministic")
     and not flashstep.grouped_backward("05")
     and flashstep._grouped_backward_stages() == ["07_tensor_core",
                                                  "07_tensor_core_deterministic"]),
    ("attention() with fewer k heads than q heads on a backward without them, up front",
     lambda: refused(lambda: flashstep.attention(Shaped((1, 4, 3, 8)), Shaped((1, 2, 5, 8)),
                                                 Shaped((1, 2, 5, 8)), stage="05"),
                     flashstep.FlashstepError, "does not run grouped-query attention")),
    ("causal as the string 'False', which is truthy",
     lambda: refused(lambda: flashstep._causal_arg("False"), TypeError, "True or False")),
    ("causal 2", lambda: refused(lambda: flashstep._causal_arg(2), TypeError, "True or False")),
    ("causal True, False, 1 and 0",
     lambda: [flashstep._causal_arg(c) for c in (True, False, 1, 0)] == [1, 0, 1, 0]),
    ("an infinite scale",
     lambda: refused(lambda: flashstep._scale_arg(float("inf")), ValueError, "scale")),
    ("a NaN scale", lambda: refused(lambda: flashstep._scale_arg(float("nan")), ValueError, "scale")),
]


def main():
    failures = 0
    for what, check in CHECKS:
        ok = bool(check())
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
    print(f"{len(CHECKS) - failures} of {len(CHECKS)} passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
