#!/usr/bin/env python3
"""Profiles each step of stage 07's ablation ladder under Nsight Compute, beside FlashAttention-2's kernel.

Stage 07 is registered as a ladder (tensor_core_tiles.h says what each step
adds): 07_step1_plain_mma, 07_step2_ldmatrix, 07_step3_cp_async,
07_step4_p_in_registers, 07_tensor_core. Each runs once (`flashstep --iters 0
--no-check`, bf16) at N = 4096, d in {64, 128}, non-causal, B = 4, H = 2048/d
(the sweep's problem at N = 4096), under
`ncu --clock-control none -k regex:tensor_core_kernel -c 1`; then PyTorch
SDPA's FLASH_ATTENTION backend (FlashAttention-2's own kernel, bf16) on the
same problem, its `flash_fwd` kernel alone. Counters, one column each:

  duration_ns             gpu__time_duration.sum
  instructions            smsp__inst_executed.sum (warp instructions)
  smem_ld_conflicts       l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum
  smem_st_conflicts       l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum
  smem_ld_wavefronts      l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum
  smem_st_wavefronts      l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum
  tensor_active_pct       sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
  stall_<reason>          smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio:
                          cycles a warp spends stalled for that reason per instruction
                          issued, for barrier, long_scoreboard, short_scoreboard, wait,
                          math_pipe_throttle, mio_throttle, lg_throttle
  registers               launch__registers_per_thread
  occupancy_pct           sm__warps_active.avg.pct_of_peak_sustained_active

With --backward (run_all step ablation16, issue 13): stage 07's bf16
backwards instead, 07_tensor_core (dQ by atomics) and
07_tensor_core_deterministic (dQ by its own kernel), `flashstep --backward`
on the same problems, a row per kernel the backward launches (prepare_kernel,
dkdv_kernel, then convert_dq_kernel or dq_kernel), then FlashAttention-2's
backward through SDPA (its `flash_bwd` kernels), with three counters more:

  l2_red_sectors          lts__t_sectors_op_red.sum: L2 sectors of reductions,
                          the atomic adds into dQ's fp32 accumulator
  local_ld_sectors        l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum and
  local_st_sectors        _op_st.sum: local-memory (register spill) traffic

Rows go to a CSV with the GPU, driver, date and commit (and the torch version
on the peer's row). A counter this ncu does not know is dropped, the rest
kept, and the note column names it; when ncu reads no counters at all the
row's note says why. Progress goes to stderr.

    python3 tests/bench/ablation.py --flashstep build/stages/cli/flashstep \
        --out docs/results/ablation.csv [--d 64 128] [--N 4096] [--no-peer]
    python3 tests/bench/ablation.py --backward --flashstep build/stages/cli/flashstep \
        --out docs/results/ablation16.csv
"""
import argparse
import csv
import datetime
import io
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sweep import HIDDEN, gpu_facts, write_csv  # noqa: E402

# The ladder, in order: registry names (tensor_core_model.cpp).
STEPS = ("07_step1_plain_mma", "07_step2_ldmatrix", "07_step3_cp_async",
         "07_step4_p_in_registers", "07_tensor_core")
# Stage 08's ladder (hopper_model.cpp), after stage 07 as the baseline. The
# hmma pipe counter (tensor_active_pct) sees wgmma too: on the H200 it reads
# 18.7% for 08_step1, whose products are all wgmma, and TFLOP/s per percent is
# the same (9.4-9.5) on every wgmma step (ablation08.csv). ncu 2025's
# sm__pipe_tensor_op_gmma_cycles_active read nothing there.
HOPPER_STEPS = ("07_tensor_core", "08_step1_wgmma_sync", "08_step2_tma_pipeline",
                "08_step3_warp_specialized", "08_step4_ping_pong", "08_hopper")
HOPPER_KERNEL = "regex:tensor_core_kernel|hopper_kernel|hopper_ws_kernel"
PEER = "sdpa_flash_bf16"  # peers.py's name for the same kernel in the sweep
STAGE_KERNEL = "regex:tensor_core_kernel"
PEER_KERNEL = "regex:flash_fwd"
BATCH = 4

STALLS = ("barrier", "long_scoreboard", "short_scoreboard", "wait", "math_pipe_throttle",
          "mio_throttle", "lg_throttle")
METRICS = {
    "duration_ns": "gpu__time_duration.sum",
    "instructions": "smsp__inst_executed.sum",
    "smem_ld_conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "smem_st_conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "smem_ld_wavefronts": "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
    "smem_st_wavefronts": "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
    "tensor_active_pct": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    **{f"stall_{s}": f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio"
       for s in STALLS},
    "registers": "launch__registers_per_thread",
    "occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
}
COLUMNS = ["stage", "dtype", "B", "H", "N", "d", "causal", "kernel", *METRICS, "note", "torch",
           "gpu", "driver", "max_sm_clock", "date", "commit"]
NOTE_CHARS = 160

# --backward: stage 07's two backwards (registry names, tensor_core_backward_model.cpp)
# and their kernels (tensor_core_backward.cuh). One ncu call per backward,
# matching all of its kernels, rather than one call per kernel name: the
# program runs once, ncu numbers the launches in order, and a kernel the
# variant does not launch (convert_dq_kernel in the deterministic one,
# dq_kernel in the atomic one) is simply absent, with no list of which
# variant launches what to keep in step with the code. The forward that
# `flashstep --backward` runs first (tensor_core_kernel) matches none of them.
BACKWARD_STAGES = ("07_tensor_core", "07_tensor_core_deterministic")
BACKWARD_KERNEL = "regex:prepare_kernel|dkdv_kernel|convert_dq_kernel|dq_kernel"
PEER_BACKWARD_KERNEL = "regex:flash_bwd"
# ncu's -c: a backward launches 3 kernels (ours and FlashAttention-2's); the
# headroom gives a launch we did not expect its own row instead of hiding it.
BACKWARD_LAUNCHES = 8
BACKWARD_METRICS = {
    **METRICS,
    "l2_red_sectors": "lts__t_sectors_op_red.sum",
    "local_ld_sectors": "l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum",
    "local_st_sectors": "l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum",
}
BACKWARD_COLUMNS = ["stage", "dtype", "B", "H", "N", "d", "causal", "kernel", *BACKWARD_METRICS,
                    "note", "torch", "gpu", "driver", "max_sm_clock", "date", "commit"]

# FlashAttention-2's kernel through PyTorch: bf16 inputs of the sweep's kind
# (mean 0.5), one call, synchronised so that ncu sees it finish.
PEER_PROGRAM = """
import sys, torch
from torch.nn.attention import sdpa_kernel, SDPBackend
B, H, N, d = (int(x) for x in sys.argv[1:5])
q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16) + 0.5 for _ in range(3))
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    torch.nn.functional.scaled_dot_product_attention(q, k, v)
torch.cuda.synchronize()
"""
# Its backward: the same inputs and a dO of the same kind, one forward (flash_fwd,
# which the kernel filter leaves out) and one backward.
PEER_BACKWARD_PROGRAM = """
import sys, torch
from torch.nn.attention import sdpa_kernel, SDPBackend
B, H, N, d = (int(x) for x in sys.argv[1:5])
q, k, v = ((torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16) + 0.5).requires_grad_()
           for _ in range(3))
dO = torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16) + 0.5
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    torch.nn.functional.scaled_dot_product_attention(q, k, v).backward(dO)
torch.cuda.synchronize()
"""


def short(text):
    """ncu's first error line, else the last line of `text`, this long at most."""
    lines = str(text).strip().splitlines()
    errors = [ln for ln in lines if "==ERROR==" in ln]
    return (errors or lines or [""])[0 if errors else -1][:NOTE_CHARS]


def ncu(kernel, program, metrics):
    """({column: value}, kernel name, note) of the first kernel matching `kernel` in
    `program`, with the counters in `metrics` (column -> ncu metric). Counters ncu
    does not know are dropped and named in the note; values it leaves empty are ''."""
    launches, note = ncu_launches(kernel, program, metrics, 1)
    values, name = launches[0] if launches else ({}, "")
    return values, name, note


def ncu_launches(kernel, program, metrics, launches):
    """([({column: value}, kernel name)] of the first `launches` kernels matching
    `kernel` in `program`, in launch order, and a note; as ncu() otherwise."""
    dropped = []
    while True:
        cmd = ["ncu", "--clock-control", "none", "-k", kernel, "-c", str(launches), "--csv",
               "--print-units", "base", "--metrics", ",".join(metrics.values()), *program]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('"')]
        rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
        if rows:
            break
        # An unknown counter fails the whole run: drop the ones ncu names, once each.
        unknown = [c for c, m in metrics.items() if m in proc.stdout + proc.stderr]
        if not unknown:
            return [], short(proc.stderr or proc.stdout or "ncu printed no counters")
        dropped += unknown
        metrics = {c: m for c, m in metrics.items() if c not in unknown}
        if not metrics:
            return [], f"ncu knows none of the counters ({', '.join(dropped)})"
    # ncu prints a row per (launch, counter); its ID column numbers the launches.
    by_launch = {}
    for r in rows:
        by_launch.setdefault(r.get("ID", ""), []).append(r)
    out = []
    for launch in by_launch.values():
        by_metric = {r["Metric Name"]: r["Metric Value"].replace(",", "") for r in launch}
        values = {}
        for column, metric in metrics.items():
            raw = by_metric.get(metric, "")
            try:
                float(raw)
                values[column] = raw
            except ValueError:
                values[column] = ""
        # "void ns::kernel<...>(...)" -> "ns::kernel"
        name = re.split(r"[<(]", launch[0].get("Kernel Name", ""))[0].strip().removeprefix("void ")
        out.append((values, name))
    note = f"ncu does not know: {', '.join(dropped)}" if dropped else ""
    return out, note


def torch_version(python):
    proc = subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                          capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def forward_rows(args, steps, stage_kernel, torch, meta):
    """A row per step of the ladder (and the peer) per d: its one forward kernel."""
    rows = []
    for d in args.d:
        B, H, N = BATCH, HIDDEN // d, args.N
        problem = ["--B", str(B), "--H", str(H), "--N", str(N), "--d", str(d)]
        runs = [(s, stage_kernel, [args.flashstep, "--stage", s, *problem, "--iters", "0",
                                   "--no-check", "--dtype", "bf16"]) for s in steps]
        if torch:
            runs.append((PEER, PEER_KERNEL,
                         [args.python, "-c", PEER_PROGRAM, str(B), str(H), str(N), str(d)]))
        for stage, kernel, program in runs:
            t0 = time.time()
            values, name, note = ncu(kernel, program, METRICS)
            row = {"stage": stage, "dtype": "bf16", "B": B, "H": H, "N": N, "d": d, "causal": 0,
                   "kernel": name, **values, "note": note,
                   "torch": torch if stage == PEER else "", **meta}
            rows.append({c: row.get(c, "") for c in COLUMNS})
            print(f"ablation: {stage} d={d}: "
                  + (f"{float(values['duration_ns']) / 1e6:.3f} ms under ncu"
                     if values.get("duration_ns") else f"no counters ({note})")
                  + f" ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    return rows


def backward_rows(args, torch, meta):
    """A row per kernel of each backward (stage 07's two, then the peer's) per d; a
    backward ncu read nothing from gets one row without a kernel, its note saying why."""
    rows = []
    for d in args.d:
        B, H, N = BATCH, HIDDEN // d, args.N
        problem = ["--B", str(B), "--H", str(H), "--N", str(N), "--d", str(d)]
        runs = [(s, BACKWARD_KERNEL, [args.flashstep, "--stage", s, *problem, "--backward",
                                      "--iters", "0", "--no-check", "--dtype", "bf16"])
                for s in BACKWARD_STAGES]
        if torch:
            runs.append((PEER, PEER_BACKWARD_KERNEL, [args.python, "-c", PEER_BACKWARD_PROGRAM,
                                                      str(B), str(H), str(N), str(d)]))
        for stage, kernel, program in runs:
            t0 = time.time()
            launches, note = ncu_launches(kernel, program, BACKWARD_METRICS, BACKWARD_LAUNCHES)
            for values, name in launches or [({}, "")]:
                row = {"stage": stage, "dtype": "bf16", "B": B, "H": H, "N": N, "d": d,
                       "causal": 0, "kernel": name, **values, "note": note,
                       "torch": torch if stage == PEER else "", **meta}
                rows.append({c: row.get(c, "") for c in BACKWARD_COLUMNS})
            timed = [(name, float(v["duration_ns"]) / 1e6) for v, name in launches
                     if v.get("duration_ns")]
            print(f"ablation: {stage} backward d={d}: "
                  + (f"{sum(ms for _, ms in timed):.3f} ms under ncu ("
                     + ", ".join(f"{name} {ms:.3f}" for name, ms in timed) + ")"
                     if timed else f"no counters ({note})")
                  + f" ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flashstep", required=True, help="path to the flashstep binary")
    ap.add_argument("--out", required=True, help="CSV to write")
    ap.add_argument("--N", type=int, default=4096)
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--no-peer", action="store_true",
                    help="leave out PyTorch's FlashAttention-2 kernel")
    ap.add_argument("--python", default=sys.executable, help="the Python with PyTorch (the peer)")
    ap.add_argument("--commit", default=os.environ.get("FLASHSTEP_COMMIT", "unknown"))
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--hopper", action="store_true",
                       help="stage 08's ladder beside 07_tensor_core instead (run_all step "
                            "ablation08); no peer")
    which.add_argument("--backward", action="store_true",
                       help="stage 07's bf16 backwards instead, a row per kernel, beside "
                            "FlashAttention-2's backward (run_all step ablation16)")
    args = ap.parse_args()
    steps, stage_kernel = STEPS, STAGE_KERNEL
    if args.hopper:
        steps, stage_kernel = HOPPER_STEPS, HOPPER_KERNEL
        args.no_peer = True

    meta = gpu_facts()
    meta.update(date=datetime.date.today().isoformat(), commit=args.commit)
    torch = "" if args.no_peer else torch_version(args.python)
    if not args.no_peer and not torch:
        print("ablation: no PyTorch for the peer row; profiling the stage alone", file=sys.stderr)
    if args.backward:
        rows, columns = backward_rows(args, torch, meta), BACKWARD_COLUMNS
    else:
        rows, columns = forward_rows(args, steps, stage_kernel, torch, meta), COLUMNS
    write_csv(args.out, rows, columns)
    missing = sum(not r["duration_ns"] for r in rows)
    print(f"ablation: {len(rows)} rows to {args.out}; {missing} without counters", file=sys.stderr)
    sys.exit(1 if missing == len(rows) else 0)


if __name__ == "__main__":
    main()
