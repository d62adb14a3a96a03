#!/usr/bin/env python3
"""Measures this GPU's ceilings: the fp32 roofline's, and the bf16 tensor cores'.

  copy   device-to-device copy of a 2 GiB fp32 tensor, with PyTorch; bandwidth
         counts the bytes read plus the bytes written
  sgemm  8192^3 fp32 matrix product through cuBLAS with TF32 off, with PyTorch:
         what fp32 matrix work on CUDA cores reaches in practice
  fma    the fp32 FMA peak, measured by flashstep_fma_peak (tests/bench/fma_peak.cu):
         independent FMA chains on registers on every SM, 2 FLOPs per FMA; the
         roofline's compute ceiling
  gemm_bf16  8192^3 bf16 matrix product (fp32 accumulation) through cuBLAS, with
         PyTorch: what the chip's tensor cores reach with Hopper's own wgmma
  mma_bf16   the bf16 mma.sync.m16n8k16 peak, measured by flashstep_mma_peak
         (tests/bench/mma_peak.cu): independent mma chains on registers on every
         SM, 4096 FLOPs per mma; what stage 07's instruction can reach

fma and mma_bf16 are skipped, with a line on stderr, when their binary is
missing (build them: cmake --build build --target flashstep_fma_peak
flashstep_mma_peak). Median of CUDA-event timings after warm-up, on random
data (fma, mma_bf16: on registers alone). One CSV row per ceiling with the GPU,
driver, date and commit.

    python3 tests/bench/ceilings.py --out docs/results/ceilings.csv \
        [--fma-peak build/tests/bench/flashstep_fma_peak] \
        [--mma-peak build/tests/bench/flashstep_mma_peak]
"""
import argparse
import datetime
import os
import statistics
import subprocess
import sys
from pathlib import Path

from sweep import gpu_facts, write_csv

COPY_BYTES = 2 << 30   # per tensor: far beyond the 50-60 MB L2
GEMM_N = 8192          # the size the project's anchors quote
WARMUP, REPEATS = 3, 20
# Where `cmake --preset default` builds the ceiling tools.
BENCH_BUILD = Path(__file__).resolve().parents[2] / "build/tests/bench"
DEFAULT_FMA_PEAK = BENCH_BUILD / "flashstep_fma_peak"
DEFAULT_MMA_PEAK = BENCH_BUILD / "flashstep_mma_peak"


def median_ms(torch, fn):
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(REPEATS):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def peak_tool(binary, name):
    """(TFLOP/s, median ms) from a ceiling tool's CSV line `name,<value>,TFLOP/s,<ms>`,
    or None when the binary is missing. A binary that fails is an error: its own
    message ends the run."""
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        print(f"ceilings: {name} skipped, no {binary.name} at {binary} "
              f"(cmake --build build --target {binary.name})", file=sys.stderr)
        return None
    run = subprocess.run([str(binary)], capture_output=True, text=True)
    sys.stderr.write(run.stderr)
    if run.returncode != 0:
        sys.exit(f"ceilings: {binary} failed with exit {run.returncode}")
    got, value, unit, ms = run.stdout.strip().split(",")
    if (got, unit) != (name, "TFLOP/s"):
        sys.exit(f"ceilings: unexpected output from {binary}: {run.stdout.strip()!r}")
    return float(value), float(ms)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default=os.environ.get("FLASHSTEP_COMMIT", "unknown"))
    ap.add_argument("--fma-peak", type=Path, default=DEFAULT_FMA_PEAK, metavar="PATH",
                    help=f"flashstep_fma_peak binary (default: {DEFAULT_FMA_PEAK})")
    ap.add_argument("--mma-peak", type=Path, default=DEFAULT_MMA_PEAK, metavar="PATH",
                    help=f"flashstep_mma_peak binary (default: {DEFAULT_MMA_PEAK})")
    args = ap.parse_args()
    # First, alone on the GPU: separate processes, before PyTorch holds memory.
    fma = peak_tool(args.fma_peak, "fma")
    mma = peak_tool(args.mma_peak, "mma_bf16")
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    x = torch.randn(COPY_BYTES // 4, device="cuda")
    y = torch.empty_like(x)
    copy_ms = median_ms(torch, lambda: y.copy_(x))
    del x, y
    a = torch.randn(GEMM_N, GEMM_N, device="cuda")
    b = torch.randn(GEMM_N, GEMM_N, device="cuda")
    gemm_ms = median_ms(torch, lambda: torch.mm(a, b))
    a, b = a.bfloat16(), b.bfloat16()
    gemm_bf16_ms = median_ms(torch, lambda: torch.mm(a, b))
    del a, b

    meta = gpu_facts()
    meta.update(date=datetime.date.today().isoformat(), commit=args.commit, torch=torch.__version__)
    rows = [
        {"ceiling": "copy", "value": round(2 * COPY_BYTES / (copy_ms / 1e3) / 1e12, 3),
         "unit": "TB/s", "median ms": round(copy_ms, 4), **meta},
        {"ceiling": "sgemm", "value": round(2 * GEMM_N**3 / (gemm_ms / 1e3) / 1e12, 2),
         "unit": "TFLOP/s", "median ms": round(gemm_ms, 4), **meta},
    ]
    if fma:
        rows.append({"ceiling": "fma", "value": round(fma[0], 2), "unit": "TFLOP/s",
                     "median ms": round(fma[1], 4), **meta})
    rows.append({"ceiling": "gemm_bf16",
                 "value": round(2 * GEMM_N**3 / (gemm_bf16_ms / 1e3) / 1e12, 1),
                 "unit": "TFLOP/s", "median ms": round(gemm_bf16_ms, 4), **meta})
    if mma:
        rows.append({"ceiling": "mma_bf16", "value": round(mma[0], 1), "unit": "TFLOP/s",
                     "median ms": round(mma[1], 4), **meta})
    write_csv(args.out, rows)
    for r in rows:
        print(f"ceilings: {r['ceiling']} {r['value']} {r['unit']}")


if __name__ == "__main__":
    main()
