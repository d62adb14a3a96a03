#!/usr/bin/env python3
"""Runs the course track's tests as one CTest test (label course-py).

    run.py cpu [--python PY]   the CPU tests: PyTorch on the CPU, Triton under its
                               interpreter (TRITON_INTERPRET=1); gpu-marked tests left out
    run.py gpu [--python PY]   the gpu-marked tests, for real (TRITON_INTERPRET unset)

PY (default: this Python) runs pytest; it needs torch, triton and pytest
(`make test` installs them into .venv-course). Exit 77 (CTest: skipped) when
PY is missing or lacks one of them, or for `gpu` without a CUDA device;
otherwise pytest's status.
"""
import argparse
import os
import pathlib
import subprocess
import sys

SKIP = 77
HERE = pathlib.Path(__file__).resolve().parent


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["cpu", "gpu"])
    ap.add_argument("--python", default=sys.executable)
    a, extra = ap.parse_known_args()
    py = a.python
    if not pathlib.Path(py).exists():
        print(f"course-py: skipped: no {py} (`make test` makes that venv)")
        return SKIP
    probe = subprocess.run([py, "-c", "import torch, triton, pytest"], capture_output=True,
                           text=True)
    if probe.returncode:
        print(f"course-py: skipped: {py} cannot import torch, triton and pytest "
              f"({probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else '?'}); "
              "`make test` installs them into .venv-course")
        return SKIP
    env = dict(os.environ)
    if a.mode == "cpu":
        env["TRITON_INTERPRET"] = "1"
        marks = "not gpu"
    else:
        env.pop("TRITON_INTERPRET", None)
        cuda = subprocess.run([py, "-c", "import torch, sys; sys.exit(not torch.cuda.is_available())"])
        if cuda.returncode:
            print("course-py: skipped: torch sees no CUDA device")
            return SKIP
        marks = "gpu"
    # A fresh process: TRITON_INTERPRET is read when the kernels are defined.
    cmd = [py, "-m", "pytest", str(HERE), "-m", marks, "-p", "no:cacheprovider", "-q", "-rs",
           *extra]
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
