#!/usr/bin/env python3
"""Measures the two ceilings the roofline needs on this GPU, with PyTorch.

  copy   device-to-device copy of a 2 GiB fp32 tensor; bandwidth counts the
         bytes read plus the bytes written
  sgemm  8192^3 fp32 matrix product through cuBLAS with TF32 off: what fp32
         arithmetic on CUDA cores reaches in practice (the datasheet's FMA
         peak is the other bound)

Median of CUDA-event timings after warm-up, on random data. One CSV row per
ceiling with the GPU, driver, date and commit.

    python3 tests/bench/ceilings.py --out docs/results/ceilings.csv
"""
import argparse
import csv
import datetime
import os
import statistics

from sweep import gpu_facts

COPY_BYTES = 2 << 30   # per tensor: far beyond the 50-60 MB L2
GEMM_N = 8192          # the size the project's anchors quote
WARMUP, REPEATS = 3, 20


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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default=os.environ.get("FLASHSTEP_COMMIT", "unknown"))
    args = ap.parse_args()
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

    meta = gpu_facts()
    meta.update(date=datetime.date.today().isoformat(), commit=args.commit, torch=torch.__version__)
    rows = [
        {"ceiling": "copy", "value": round(2 * COPY_BYTES / (copy_ms / 1e3) / 1e12, 3),
         "unit": "TB/s", "median ms": round(copy_ms, 4), **meta},
        {"ceiling": "sgemm", "value": round(2 * GEMM_N**3 / (gemm_ms / 1e3) / 1e12, 2),
         "unit": "TFLOP/s", "median ms": round(gemm_ms, 4), **meta},
    ]
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    for r in rows:
        print(f"ceilings: {r['ceiling']} {r['value']} {r['unit']}")


if __name__ == "__main__":
    main()
