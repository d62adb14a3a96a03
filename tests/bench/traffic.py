#!/usr/bin/env python3
"""Measures each stage's HBM traffic under Nsight Compute, beside its model.

For every registered stage, one `flashstep --iters 0 --no-check` run (each
stage's kernels launched once) is profiled with
`ncu --clock-control none --replay-mode application`, and the per-kernel
counters are summed per stage:
  dram__bytes_read.sum / dram__bytes_write.sum       bytes that reached HBM
  l1tex__t_bytes_pipe_lsu_mem_global_op_{ld,st}.sum  global bytes requested
  sm__warps_active.avg.pct_of_peak_sustained_active  achieved occupancy
  sm__cycles_active.avg.pct_of_peak_sustained_elapsed how busy the SMs were
The model's bytes come from `flashstep model`. Each stage runs in its own
element type (fp32 for 01-06, bf16 for 07: the dtype column). Rows go to a CSV
with the GPU, driver, date and commit. When ncu cannot read the counters, the
CSV says so.

With --backward it profiles the backward passes instead (`flashstep --backward`,
only the backward's kernels, picked by name) beside `flashstep model
--backward`. The zeroing of dQ is a cudaMemsetAsync, not a kernel, so ncu does
not see its writes (N_q d floats per head) though the model counts them.

    python3 tests/bench/traffic.py --flashstep build/stages/cli/flashstep \
        --out docs/results/traffic.csv [--N 8192] [--d 64 128]
    python3 tests/bench/traffic.py ... --backward --N 4096 --out docs/results/backward_traffic.csv
"""
import argparse
import csv
import datetime
import io
import os
import subprocess
import sys

from sweep import HIDDEN, TOKENS, gpu_facts, write_csv

METRICS = {
    "dram_read": "dram__bytes_read.sum",
    "dram_write": "dram__bytes_write.sum",
    "requested_read": "l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum",
    "requested_write": "l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum",
    "kernel_ns": "gpu__time_duration.sum",
}
# Percentages, averaged over a stage's kernels weighted by their duration:
# achieved occupancy (active warps over the maximum, on SMs while active) and
# how busy the SMs were over the whole kernel (idle SMs pull it down).
# The kernels of the backward passes (stages 02 and 05), for ncu's --kernel-name:
# a --backward run also launches the forward, whose kernels are left out.
BACKWARD_KERNELS = "regex:row_dot_kernel|backward_kernel|gemm_kernel|ds_kernel"
PERCENTAGES = {
    "occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm_active_pct": "sm__cycles_active.avg.pct_of_peak_sustained_elapsed",
}


def flashstep_csv(exe, args):
    out = subprocess.run([exe, *args, "--format", "csv"], capture_output=True, text=True,
                         check=True).stdout
    return list(csv.DictReader(io.StringIO(out)))


def profile(exe, stage, problem_args, backward):
    """Summed counters of every kernel one forward (or backward) of `stage`
    launches, or an error."""
    select = ["--kernel-name", BACKWARD_KERNELS] if backward else []
    cmd = ["ncu", "--clock-control", "none", "--replay-mode", "application", "--csv",
           "--print-units", "base", "--metrics", ",".join([*METRICS.values(), *PERCENTAGES.values()]),
           *select, exe, "--stage", stage, *problem_args, "--iters", "0", "--no-check",
           *(["--backward"] if backward else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    sums = {k: 0 for k in METRICS}
    per_kernel = {}  # kernel ID -> {metric name: value}
    lines = [l for l in proc.stdout.splitlines() if l.startswith('"')]
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        value = float(row["Metric Value"].replace(",", ""))
        per_kernel.setdefault(row["ID"], {})[row["Metric Name"]] = value
    if not per_kernel:
        return None, (proc.stderr.strip().splitlines() or ["ncu printed no counters"])[-1]
    for metrics in per_kernel.values():
        for key, metric in METRICS.items():
            sums[key] += int(metrics.get(metric, 0))
    for key, metric in PERCENTAGES.items():
        weighted = sum(m.get(metric, 0) * m.get(METRICS["kernel_ns"], 0) for m in per_kernel.values())
        sums[key] = round(weighted / max(sums["kernel_ns"], 1), 1)
    sums["kernels"] = len(per_kernel)
    return sums, ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flashstep", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--N", type=int, nargs="+", default=[8192])
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--stage", default="all")
    ap.add_argument("--backward", action="store_true", help="profile the backward passes")
    ap.add_argument("--commit", default=os.environ.get("FLASHSTEP_COMMIT", "unknown"))
    args = ap.parse_args()

    meta = gpu_facts()
    meta["date"] = datetime.date.today().isoformat()
    meta["commit"] = args.commit
    rows = []
    for d in args.d:
        for N in args.N:
            problem = ["--B", str(TOKENS // N), "--H", str(HIDDEN // d), "--N", str(N),
                       "--d", str(d)]
            model = ["model", "--stage", args.stage, *problem, *(["--backward"] if args.backward else [])]
            for m in flashstep_csv(args.flashstep, model):
                counters, error = profile(args.flashstep, m["stage"], problem, args.backward)
                row = {"stage": m["stage"], "dtype": m.get("dtype", "fp32"), "B": m["B"],
                       "H": m["H"], "N": N, "d": d,
                       "model_read": m["HBM read"], "model_write": m["HBM write"]}
                for key in [*METRICS, *PERCENTAGES, "kernels"]:
                    row[key] = counters[key] if counters else ""
                row["note"] = error
                row.update(meta)
                rows.append(row)
                print(f"traffic: {m['stage']} N={N} d={d}: "
                      f"{'ok' if counters else error}", file=sys.stderr, flush=True)
    write_csv(args.out, rows)


if __name__ == "__main__":
    main()
