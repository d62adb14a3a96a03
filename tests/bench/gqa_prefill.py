#!/usr/bin/env python3
"""Times prefill (Nq = Nk) with grouped-query heads on the forward stages that run them.

Issue 15's goal: prefill with GQA through the forward stages costs no more
than with H_kv = H. So each problem of the FlashAttention-2 paper's sweep
(B = 16384/N, H = 2048/d; N in {1024, 4096, 16384}, d in {64, 128}, causal
and not) runs at H_kv = H, H/4 and 1 (multi-query), one H_kv after the
other so that the runs a ratio compares are close in time. Each run is one
`flashstep --format csv` call (checked against the fp64 reference on sampled
rows, timed with CUDA events, L2 flushed, median and p20/p80 of the timed
runs) on the stages with Stage::grouped_heads, each in the type it runs in
(no --dtype: the CSV's dtype column says which):

  fp32  04_fa2_q_outer, 05_sequence_parallel, 06_warp_split_q,
        06_warp_split_k, 09_split_kv
  bf16  07_tensor_core, 08_hopper (on a Hopper GPU; elsewhere it says
        unavailable and records no row)

Stages 04-08 index the shared K/V head and still read it once per query
head (L2 may serve the repeats); stage 09 makes the heads of a group rows of
one block. --stage times fewer of them (a flashstep selector), so that a
call can add one stage's rows with --append. Rows go to the output CSV with
H_kv and the GPU, driver, date and commit; one progress line per problem and
H_kv goes to stderr. Exits 2 on a bad argument (a --stage flashstep refuses
among them) or a missing flashstep binary, 1 when flashstep finds no GPU, a
run fails or a check is not ok.

    python3 tests/bench/gqa_prefill.py --flashstep build/stages/cli/flashstep \\
        --out docs/results/gqa_prefill.csv [--N 1024 4096] [--d 64] [--causal no] \\
        [--stage 08_hopper --append]
"""
import csv
import datetime
import io
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sweep import (HIDDEN, ITERS, LONG_N, ROW_KEY, TOKENS, Parser, add_problem_args,  # noqa: E402
                   check_flashstep, check_problem_args, gpu_facts, merged, write_csv)

# flashstep --stage selector: every forward stage with grouped heads. One call
# runs them all, each in its own type, so the inputs are drawn once a point
# (at N = 16k that is 10^8 normal samples on the host). Stage 07's ladder
# steps are left out (07_tensor_core is the stage; the steps are its
# history), as are stage 08's, and so is 09_one_block: at these shapes
# 09_split_kv's rule already picks one split (the B * H_kv row tiles fill the
# GPU), the same kernel.
STAGES = "04,05,06,07_tensor_core,08_hopper,09_split_kv"
N_VALUES = [1024, 4096, 16384]
D_VALUES = [64, 128]
GROUP = 4          # the grouped case between MHA and MQA: H_kv = H / 4 (Llama-style)
COLUMNS = ["stage", "dtype", "check", "median ms", "p20 ms", "p80 ms", "TFLOP/s", "HBM read",
           "HBM write", "blocks", "B", "H", "H_kv", "Nq", "Nk", "d", "causal", "gpu", "driver",
           "max_sm_clock", "date", "commit"]
# What says which run a row is, for --append: sweep.py's key and the K/V heads.
GQA_KEY = (*ROW_KEY, "H_kv")


def kv_heads(H):
    """H_kv values for H query heads: H (MHA), H / 4 where 4 divides H, 1 (MQA)."""
    values = [H] + ([H // GROUP] if H % GROUP == 0 else []) + [1]
    return list(dict.fromkeys(values))


def parse_args(argv=None):
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--flashstep", required=True, help="path to the flashstep binary")
    ap.add_argument("--out", required=True, help="CSV to write")
    ap.add_argument("--stage", default=STAGES,
                    help=f"flashstep's stage selector (default: {STAGES})")
    add_problem_args(ap)
    ap.set_defaults(N=N_VALUES, d=D_VALUES)
    ap.add_argument("--append", action="store_true",
                    help="add the rows to those already in --out (a run of the same stage, type "
                         "and problem replaces its old row), so that one sweep can be split into "
                         "calls")
    ap.add_argument("--commit", default=os.environ.get("FLASHSTEP_COMMIT", "unknown"))
    args = ap.parse_args(argv)
    check_problem_args(ap, args)
    check_flashstep(ap, args.flashstep)
    check_stages(ap, args.flashstep, args.stage)
    return args


def check_stages(ap, exe, selector):
    """Refuses, in one line, a --stage that flashstep does not know or that
    selects no stage with grouped heads: its model, asked once, says which."""
    proc = subprocess.run([exe, "model", "--stage", selector, "--H", str(GROUP), "--H-kv", "1",
                           "--format", "csv"], capture_output=True, text=True)
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or ["flashstep refused it"])[-1]
        ap.error(f"--stage {selector}: {why.removeprefix('flashstep: ')}")


def problems(args):
    """(N, d, causal, H_kv), the H_kv values of one problem one after the other."""
    causals = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    for d in args.d:
        for causal in causals:
            for N in args.N:
                for h_kv in kv_heads(HIDDEN // d):
                    yield N, d, causal, h_kv


def run_point(exe, stages, N, d, causal, h_kv):
    """flashstep's rows on one problem, and its exit status."""
    B, H = TOKENS // N, HIDDEN // d
    warmup, iters = ITERS["long" if N >= LONG_N else "short"]
    cmd = [exe, "--stage", stages, "--B", str(B), "--H", str(H),
           "--H-kv", str(h_kv), "--N", str(N), "--d", str(d), "--format", "csv",
           "--warmup", str(warmup), "--iters", str(iters)]
    if causal:
        cmd.append("--causal")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    if rows and "check" not in rows[0]:
        # The model alone: flashstep found no GPU. Its stderr says why, in
        # "flashstep: no usable CUDA device (why); printing the modelled ...".
        why = next((line.removeprefix("flashstep: ").split(";")[0]
                    for line in proc.stderr.splitlines() if "CUDA device" in line),
                   "it printed the model only")
        sys.exit(f"gqa_prefill: flashstep found no GPU: {why}; nothing recorded")
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
    # A stage not built for this GPU (stage 08 off Hopper) has no time to record.
    rows = [r for r in rows if r["check"] != "unavailable"]
    point = {"B": B, "H": H, "H_kv": h_kv, "Nq": N, "Nk": N, "d": d, "causal": int(causal)}
    return [{**{c: r.get(c, "") for c in COLUMNS}, **point} for r in rows], proc.returncode


def main():
    args = parse_args()
    meta = gpu_facts()
    meta.update(date=datetime.date.today().isoformat(), commit=args.commit)
    points = list(problems(args))
    rows, failures = [], 0
    for k, (N, d, causal, h_kv) in enumerate(points, 1):
        t0 = time.time()
        got, rc = run_point(args.flashstep, args.stage, N, d, causal, h_kv)
        failures += rc != 0 or not got
        rows += [{**r, **meta} for r in got]
        print(f"[{k}/{len(points)}] N={N} d={d} causal={int(causal)} H={HIDDEN // d} "
              f"H_kv={h_kv}: {time.time() - t0:.1f} s, exit {rc}", file=sys.stderr, flush=True)
    if not rows:
        sys.exit("gqa_prefill: no results")
    n_new = len(rows)
    bad = sum(1 for r in rows if r["check"] != "ok")
    if args.append:
        rows = merged(args.out, rows, GQA_KEY)
    write_csv(args.out, rows, COLUMNS)
    print(f"gqa_prefill: {n_new} rows to {args.out} ({len(rows)} in all); {failures} run(s) "
          f"failed, {bad} check(s) not ok", file=sys.stderr)
    sys.exit(1 if failures or bad else 0)


if __name__ == "__main__":
    main()
