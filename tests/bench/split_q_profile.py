#!/usr/bin/env python3
"""Profiles stage 05 and stage 06 split-Q side by side under Nsight Compute: why split-Q is slower at d = 64.

FlashAttention-2 §3.3 teaches that giving each warp whole rows (split-Q,
stage 06) beats splitting a row over warps (stage 05); at d = 64 the recorded
sweep shows the opposite (forward.csv: 32.3 against 33.5 TFLOP/s at N = 4096).
This runs each kernel once (`flashstep --iters 0 --no-check`, fp32) at
N = 4096, B = 4, H = 2048/d (the sweep's problem), non-causal, under
`ncu --clock-control none -k regex:KERNEL -c 1`, and reads the counters that
decide between the explanations stage 06's README lists: occupancy and what
limits it, issue slots, eligible warps, the stall reasons, shared-memory
wavefronts and bank conflicts, local-memory (spill) traffic, the FMA pipe.
Counters, one column each (METRICS below); a counter this ncu does not know
is dropped and named in the note. Rows go to a CSV with the GPU, driver, date
and commit; tables.py renders it into stages/06_warp_split/README.md.

    python3 tests/bench/split_q_profile.py --flashstep build/stages/cli/flashstep \
        --out docs/results/split_q_profile.csv [--d 64 128] [--N 4096]
"""
import argparse
import datetime
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ablation import ncu  # noqa: E402
from sweep import HIDDEN, gpu_facts, write_csv  # noqa: E402

# (stage, ncu kernel filter): the two kernels compared.
KERNELS = (("05_sequence_parallel", "regex:sequence_parallel_kernel"),
           ("06_warp_split_q", "regex:split_q_kernel"))
BATCH = 4
STALLS = ("barrier", "long_scoreboard", "short_scoreboard", "wait", "math_pipe_throttle",
          "mio_throttle", "not_selected", "dispatch_stall", "no_instruction", "branch_resolving",
          "lg_throttle")
METRICS = {
    "duration_ns": "gpu__time_duration.sum",
    "instructions": "smsp__inst_executed.sum",
    "ffma_thread_inst": "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum",
    "shared_ld_inst": "smsp__inst_executed_op_shared_ld.sum",
    "issue_active_pct": "sm__inst_issued.avg.pct_of_peak_sustained_active",
    "ipc": "sm__inst_executed.avg.per_cycle_active",
    "warps_active_per_scheduler": "smsp__warps_active.avg.per_cycle_active",
    "warps_eligible_per_scheduler": "smsp__warps_eligible.avg.per_cycle_active",
    "no_issue_pct": "smsp__issue_inst0.avg.pct_of_peak_sustained_active",
    "fma_pipe_pct": "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
    "smem_ld_wavefronts": "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
    "smem_st_wavefronts": "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
    "smem_ld_conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "smem_st_conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "local_ld_bytes": "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",
    "local_st_bytes": "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
    **{f"stall_{s}": f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio"
       for s in STALLS},
    "registers": "launch__registers_per_thread",
    "smem_per_block": "launch__shared_mem_per_block_dynamic",
    "blocks_limit_registers": "launch__occupancy_limit_registers",
    "blocks_limit_smem": "launch__occupancy_limit_shared_mem",
    "occupancy_theoretical_pct": "sm__maximum_warps_per_active_cycle_pct",
    "occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
}
COLUMNS = ["stage", "B", "H", "N", "d", "causal", "kernel", *METRICS, "note",
           "gpu", "driver", "max_sm_clock", "date", "commit"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flashstep", required=True, help="path to the flashstep binary")
    ap.add_argument("--out", required=True, help="CSV to write")
    ap.add_argument("--N", type=int, default=4096)
    ap.add_argument("--d", type=int, nargs="+", default=[64])
    ap.add_argument("--commit", default=os.environ.get("FLASHSTEP_COMMIT", "unknown"))
    args = ap.parse_args()
    if not shutil.which("ncu"):
        sys.exit("split_q_profile: no ncu on PATH (Nsight Compute)")
    meta = gpu_facts()
    meta.update(date=datetime.date.today().isoformat(), commit=args.commit)
    rows = []
    for d in args.d:
        B, H, N = BATCH, HIDDEN // d, args.N
        problem = ["--B", str(B), "--H", str(H), "--N", str(N), "--d", str(d)]
        for stage, kernel in KERNELS:
            t0 = time.time()
            program = [args.flashstep, "--stage", stage, *problem, "--iters", "0", "--no-check"]
            values, name, note = ncu(kernel, program, METRICS)
            row = {"stage": stage, "B": B, "H": H, "N": N, "d": d, "causal": 0, "kernel": name,
                   **values, "note": note, **meta}
            rows.append({c: row.get(c, "") for c in COLUMNS})
            print(f"split_q_profile: {stage} d={d}: "
                  + (f"{float(values['duration_ns']) / 1e6:.3f} ms under ncu"
                     if values.get("duration_ns") else f"no counters ({note})")
                  + f" ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    write_csv(args.out, rows, COLUMNS)
    missing = sum(not r["duration_ns"] for r in rows)
    print(f"split_q_profile: {len(rows)} rows to {args.out}; {missing} without counters",
          file=sys.stderr)
    sys.exit(1 if missing == len(rows) else 0)


if __name__ == "__main__":
    main()
