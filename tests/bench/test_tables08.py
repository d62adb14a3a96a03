#!/usr/bin/env python3
"""tables.py on stage 08's CSVs, without a GPU: writes a small synthetic
forward08.csv, ablation08.csv, peers.csv and ceilings.csv into a scratch
folder, runs `tables.py --results DIR --out OUT`, and checks what lands between
the markers of stages/08_hopper/README.md and README.md; then the same with no
CSVs at all, where each block must say how to record it. Prints a line per
check and exits 1 if any failed. The numbers are made up: only the rendering
is under test."""
import csv
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
GPU = {"gpu": "NVIDIA H200", "driver": "580.0", "date": "2026-11-23", "commit": "0123456789abcdef"}
# Synthetic TFLOP/s at d = 64, non-causal, N = 2048 and 4096: stage 07, each
# step of stage 08, and the two peers.
TFLOPS = {"07_tensor_core": (300, 300), "08_step1_wgmma_sync": (330, 330),
          "08_step2_tma_pipeline": (390, 390), "08_step3_warp_specialized": (430, 430),
          "08_step4_ping_pong": (470, 470), "08_hopper": (480, 510)}
PEERS = {"sdpa_flash_bf16": (290, 300), "sdpa_cudnn_bf16": (500, 500)}
NS = (2048, 4096)


def write(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def sweep_row(stage, dtype, n, tflops, check="ok"):
    return {"stage": stage, "dtype": dtype, "check": check, "median ms": "1.0",
            "TFLOP/s": str(tflops), "B": str(16384 // n), "H": "32", "Nq": str(n), "Nk": str(n),
            "d": "64", "causal": "0", **GPU}


def synthetic(folder):
    rows = [sweep_row(s, "bf16", n, v) for s, vs in TFLOPS.items() for n, v in zip(NS, vs)]
    rows += [sweep_row("08_hopper", "fp16", 2048, 485),
             sweep_row("08_hopper", "fp16", 4096, 9, "FAIL")]
    write(os.path.join(folder, "forward08.csv"), rows)
    write(os.path.join(folder, "peers.csv"),
          [{**sweep_row(p, "", n, v), "torch": "2.11"} for p, vs in PEERS.items()
           for n, v in zip(NS, vs)])
    write(os.path.join(folder, "ceilings.csv"),
          [{"ceiling": "gemm_bf16", "value": "800", "unit": "TFLOP/s", **GPU}])
    write(os.path.join(folder, "ablation08.csv"),
          [{"stage": s, "dtype": "bf16", "B": "4", "H": "32", "N": "4096", "d": "64", "causal": "0",
            "kernel": "hopper_kernel", "duration_ns": str(1000000 + k), "instructions": "1000",
            "tensor_active_pct": f"{10 * k}", "stall_barrier": "0.5", "note": "", **GPU}
           for k, s in enumerate(TFLOPS)])


def blocks(out):
    """{(file, tag): body} of the stage 08 blocks tables.py wrote under out."""
    found = {}
    for rel, tag in (("stages/08_hopper/README.md", "results"),
                     ("stages/08_hopper/README.md", "results:ablation"),
                     ("README.md", "results:hopper")):
        with open(os.path.join(out, rel)) as f:
            m = re.search(rf"<!-- {tag}:begin -->\n(.*?)<!-- {tag}:end -->", f.read(), re.S)
        found[rel, tag] = m.group(1) if m else None
    return found


def render(results):
    with tempfile.TemporaryDirectory(prefix="tables08_out_") as out:
        subprocess.run([sys.executable, os.path.join(HERE, "tables.py"), "--results", results,
                        "--out", out], check=True, capture_output=True, text=True)
        return blocks(out)


def main():
    with tempfile.TemporaryDirectory(prefix="tables08_csv_") as folder:
        synthetic(folder)
        got = render(folder)
    stage, ablation = got["stages/08_hopper/README.md", "results"], \
        got["stages/08_hopper/README.md", "results:ablation"]
    top = got["README.md", "results:hopper"]
    with tempfile.TemporaryDirectory(prefix="tables08_none_") as none:
        empty = render(none)
    checks = [
        ("every step of the ladder in the stage's table",
         all(f"| {s} bf16 | " in stage for s in TFLOPS)),
        ("08 over 07 per N", "| 08 ÷ 07 | ×1.60 | ×1.70 |" in stage),
        ("08 over cuDNN and FlashAttention-2 per N",
         "| 08 ÷ cuDNN | ×0.96 | ×1.02 |" in stage
         and "| 08 ÷ FlashAttention-2 | ×1.66 | ×1.70 |" in stage),
        ("the share of the GEMM ceiling", "(800 TFLOP/s, measured) | 60% | 64% |" in stage),
        ("the goal: cuDNN missed at N = 2048, 07 met",
         "| 64 | no | ×0.96 – ×1.02 | ×1.60 – ×1.70 | not met: cuDNN |" in stage),
        ("a run that failed its check is marked",
         "| 08_hopper fp16 | 485.0 | 9.0 (FAIL) |" in stage),
        ("the provenance line", "`docs/results/forward08.csv`: NVIDIA H200" in stage),
        ("README.md: 07 and 08_hopper, not the steps",
         "| 08_hopper bf16 |" in top and "08_step1" not in top and "| 08 ÷ 07 |" in top),
        ("the plot, once recorded",
         "hopper_tflops_vs_n.png" in top and "hopper_tflops_vs_n.png" in stage),
        ("the ablation: each step's gain over the one before",
         "| 08_step1_wgmma_sync | " in ablation and "×1.10" in ablation),
        ("the ablation: the tensor pipe counter, before and after",
         "0.0 → 10.0" in ablation and "30.0 → 40.0" in ablation and "tensor active %" in ablation),
        ("the ablation: cuDNN beside, 08 as a share of it", "08 at 102%" in ablation),
        ("no CSVs: each block says how to record it",
         all(b and "not recorded yet" in b and "run_all.sh" in b and "sweep08" in b
             for b in empty.values())),
        ("no CSVs: no plot shown", all("png" not in b for b in empty.values())),
    ]
    failed = 0
    for what, ok in checks:
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
        failed += not ok
    if failed:
        for key, body in got.items():
            print(f"--- {key}:\n{body}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
