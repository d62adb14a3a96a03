#!/usr/bin/env python3
"""tables.py's stage 07 backward block without a GPU: synthetic backward16.csv
rows in, the goal table and the ratio rows out. Prints a line per check and
exits 1 if any failed. The numbers are made up: only the rendering is under test."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tables import backward16_body  # noqa: E402

GPU = {"gpu": "NVIDIA H200", "driver": "580.0", "date": "2026-11-23", "commit": "0123456789abcdef",
       "torch": "2.11"}
# TFLOP/s at d = 64, non-causal, per N: FlashAttention-2 at 100, the atomic
# backward below it, the deterministic one above it from N = 1024 on.
TFLOPS = {"sdpa_flash_bf16": {512: 100, 1024: 100, 2048: 100},
          "07_tensor_core": {512: 50, 1024: 60, 2048: 70},
          "07_tensor_core_deterministic": {512: 90, 1024: 110, 2048: 120}}


def row(stage, n, tflops, pass_="bwd"):
    return {"stage": stage, "pass": pass_, "dtype": "bf16", "check": "ok", "TFLOP/s": str(tflops),
            "B": str(16384 // n), "H": "32", "Nq": str(n), "Nk": str(n), "d": "64", "causal": "0",
            "note": "", **GPU}


def main():
    rows = [row(s, n, v) for s, by_n in TFLOPS.items() for n, v in by_n.items()]
    body = backward16_body(rows)
    slow = backward16_body([r for r in rows if r["stage"] != "07_tensor_core_deterministic"])
    checks = [
        ("the goal counts N >= 1024 only: deterministic ×1.10 – ×1.20, met",
         "| 64 | no | ×0.60 – ×0.70 | ×1.10 – ×1.20 | met |" in body),
        ("each stage's ratio row beside FlashAttention-2",
         "| 07_tensor_core / FlashAttention-2 | 50% | 60% | 70% |" in body
         and "| 07_tensor_core_deterministic / FlashAttention-2 | 90% | 110% | 120% |" in body),
        ("the cost of determinism", "| deterministic / atomic dQ | 180% |" in body),
        ("the atomic alone misses it, by how much",
         "| 64 | no | ×0.60 – ×0.70 | – | not met: ×0.60 at best |" in slow),
        ("no CSV: says how to record it", "not recorded yet" in backward16_body([])),
    ]
    failed = 0
    for what, ok in checks:
        print(("ok   " if ok else "FAIL ") + what)
        failed += not ok
    if failed:
        print(body)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
