#!/usr/bin/env python3
"""Records stage 10, ring attention, on a machine of several GPUs: ring.csv.

Each point is one `flashstep_ring --format csv` call (checked against the fp64
reference on sampled rows, timed with CUDA events, L2 flushed, median of the
timed runs), at B = 1, H = 8, d = 128 in stage 07's bf16. Parts:

  weak      N per GPU 16k, 32k, 64k on 1 GPU and on each larger ring up to the
            GPUs visible (2 today): non-causal, and causal with contiguous
            and zig-zag chunks
  strong    N = 256k on 1 GPU and on each larger ring, the same three
  long      the longest sequence asked (--long-N, default 2M tokens) on every
            visible GPU, causal zig-zag, one timed run
  contrast  the overlap switched off (--no-overlap) at 32k tokens per GPU on
            every visible GPU, non-causal and causal zig-zag

Rows go to the CSV with the part, GPU, driver, date and commit; progress to
stderr. --append keeps an existing CSV's rows, each replaced by a new row of
the same part, problem, ring size, assignment and overlap.

    python3 tests/bench/ring.py --flashstep-ring build/stages/10_ring/flashstep_ring \\
        --out docs/results/ring.csv [--parts weak strong] [--append]
    python3 tests/bench/ring.py --merge a/ring.csv b/ring.csv --out docs/results/ring.csv

--merge joins CSVs recorded in separate calls (each part in one of them),
later files' rows replacing earlier ones of the same key; it runs nothing.
"""
import argparse
import csv
import datetime
import io
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sweep import gpu_facts, write_csv  # noqa: E402

PROBLEM = {"B": 1, "H": 8, "d": 128}
WEAK_PER_GPU = [16384, 32768, 65536]
STRONG_N = 262144
LONG_N = 2097152          # the aim: 2M tokens on 2 GPUs
CONTRAST_PER_GPU = 32768
ITERS = {"short": (2, 10), "long": (0, 1)}  # (warm-up, timed runs)
# (causal, assignment) of the weak and strong parts: without the mask the
# assignment changes nothing, with it zig-zag is the fix.
VARIANTS = [(False, "zigzag"), (True, "contiguous"), (True, "zigzag")]
# What a row is, for --append: a new row replaces an old one with these equal.
ROW_KEY = ("part", "stage", "dtype", "gpus", "assign", "overlap", "B", "H", "Nq", "d", "causal")


def visible_gpus():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout
        return sum(1 for line in out.splitlines() if line.startswith("GPU "))
    except (OSError, subprocess.CalledProcessError):
        return 0


def ring_sizes(visible):
    """1, 2, 4, ... up to the GPUs visible."""
    sizes, p = [], 1
    while p <= visible:
        sizes.append(p)
        p *= 2
    return sizes


def points(parts, visible, long_n):
    """(part, N, gpus, causal, assign, overlap, iters) for each run."""
    out = []
    for part in parts:
        if part == "weak":
            out += [(part, n * p, p, c, a, True, "short")
                    for n in WEAK_PER_GPU for p in ring_sizes(visible) for c, a in VARIANTS]
        elif part == "strong":
            out += [(part, STRONG_N, p, c, a, True, "short")
                    for p in ring_sizes(visible) for c, a in VARIANTS]
        elif part == "long":
            out.append((part, long_n, visible, True, "zigzag", True, "long"))
        elif part == "contrast":
            out += [(part, CONTRAST_PER_GPU * visible, visible, c, "zigzag", False, "short")
                    for c in (False, True)]
    return out


def merged(path, rows):
    if not os.path.exists(path):
        return rows
    with open(path, newline="") as f:
        old = list(csv.DictReader(f))
    new = {tuple(r.get(k, "") for k in ROW_KEY) for r in rows}
    kept = [r for r in old if tuple(r.get(k, "") for k in ROW_KEY) not in new]
    columns = list(dict.fromkeys([*(old[0].keys() if old else []), *rows[0].keys()]))
    return [{c: r.get(c, "") for c in columns} for r in kept + rows]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flashstep-ring", help="path to the flashstep_ring binary")
    ap.add_argument("--merge", nargs="+", metavar="CSV", help="join these CSVs into --out; run nothing")
    ap.add_argument("--out", required=True, help="CSV to write")
    ap.add_argument("--parts", nargs="+", choices=["weak", "strong", "long", "contrast"],
                    default=["weak", "strong", "long", "contrast"])
    ap.add_argument("--long-N", type=int, default=LONG_N, help="the long part's tokens")
    ap.add_argument("--append", action="store_true", help="keep the rows of an existing --out")
    ap.add_argument("--commit", default=os.environ.get("FLASHSTEP_COMMIT", "unknown"))
    args = ap.parse_args()
    if args.merge:
        rows = []
        for path in args.merge:
            with open(path, newline="") as f:
                new = list(csv.DictReader(f))
            keys = {tuple(r.get(k, "") for k in ROW_KEY) for r in new}
            rows = [r for r in rows if tuple(r.get(k, "") for k in ROW_KEY) not in keys] + new
        columns = list(dict.fromkeys(c for r in rows for c in r))
        write_csv(args.out, [{c: r.get(c, "") for c in columns} for r in rows], columns)
        print(f"ring: {len(rows)} rows from {len(args.merge)} files to {args.out}", file=sys.stderr)
        return
    if not args.flashstep_ring:
        ap.error("--flashstep-ring is needed to run (or --merge to join CSVs)")

    visible = visible_gpus()
    if visible < 1:
        sys.exit("ring: no GPU visible (nvidia-smi -L)")
    meta = gpu_facts()
    meta["date"] = datetime.date.today().isoformat()
    meta["commit"] = args.commit
    todo = points(args.parts, visible, args.long_N)
    rows, failures = [], 0
    for k, (part, n, p, causal, assign, overlap, iters) in enumerate(todo, 1):
        warmup, timed = ITERS[iters]
        cmd = [args.flashstep_ring, "--B", str(PROBLEM["B"]), "--H", str(PROBLEM["H"]),
               "--d", str(PROBLEM["d"]), "--N", str(n), "--gpus", str(p), "--assign", assign,
               "--warmup", str(warmup), "--iters", str(timed), "--format", "csv"]
        if causal:
            cmd.append("--causal")
        if not overlap:
            cmd.append("--no-overlap")
        t0 = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        print(f"[{k}/{len(todo)}] {part}: N={n} gpus={p} causal={int(causal)} {assign}"
              f"{'' if overlap else ' no-overlap'}: {time.time() - t0:.1f} s, exit "
              f"{proc.returncode}", file=sys.stderr, flush=True)
        if proc.returncode != 0:
            failures += 1
            sys.stderr.write(proc.stderr)
        for row in csv.DictReader(io.StringIO(proc.stdout)):
            row = {"part": part, **row, **meta}
            rows.append(row)
    if not rows:
        sys.exit("ring: no results")
    n_new = len(rows)
    if args.append:
        rows = merged(args.out, rows)
    write_csv(args.out, rows)
    print(f"ring: {n_new} rows to {args.out} ({len(rows)} in all); {failures} failed",
          file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
