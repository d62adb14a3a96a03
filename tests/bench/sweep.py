#!/usr/bin/env python3
"""Times every registered stage at the FlashAttention-2 paper's settings.

hidden 2048 (H = 2048/d), B = 16384/N, N in {512 ... 16384}, d in {64, 128},
causal and not. Each problem is one `flashstep --format csv` call (so every
stage is checked against the fp64 reference on sampled rows and timed with
CUDA events, L2 flushed, median of the timed runs). Rows go to the output CSV
with the GPU, driver, date and commit, and progress goes to stderr.

Without --dtype every stage runs in its own type (fp32 for 01-06, bf16 for
07); --dtype T runs the selected stages that have a T kernel, in T (the CSV's
dtype column says which). --append keeps the rows of an existing output CSV
and adds these, each replacing an old row of the same stage, dtype and problem.

    python3 tests/bench/sweep.py --flashstep build/stages/cli/flashstep \
        --out docs/results/forward.csv [--N 1024 2048] [--d 64] [--stage 02,04] [--dtype fp32]
    python3 tests/bench/sweep.py --flashstep ... --dtype bf16 --stage 02,03,07 \
        --out docs/results/forward16.csv
    python3 tests/bench/sweep.py --flashstep ... --dtype fp16 --stage 07_tensor_core \
        --append --out docs/results/forward16.csv
    python3 tests/bench/sweep.py --flashstep ... --long --out docs/results/long.csv
"""
import argparse
import csv
import datetime
import io
import os
import subprocess
import sys
import time

HIDDEN = 2048          # model width of the paper's sweep: H = HIDDEN / d
TOKENS = 16384         # tokens per batch in the paper's sweep: B = TOKENS / N
LONG_N = 8192          # from here on, fewer timed runs: one run takes seconds
ITERS = {"short": (2, 10), "long": (1, 5), "single": (0, 3)}  # (warm-up, timed runs)
# The long-sequence, small-batch point (--long): one head group of a long
# document, where only sequence parallelism can fill the GPU. One run of the
# slow stages takes seconds here, so it gets the fewest repeats.
LONG_POINT = {"B": 1, "H": 4, "N": 65536}


# The columns that say which run a row of forward.csv is: its stage, element
# type and problem (--append replaces an old row with the same values).
ROW_KEY = ("stage", "dtype", "B", "H", "Nq", "Nk", "d", "causal")


def write_csv(path, rows, columns=None):
    """Writes rows (dicts) to path with a header: `columns`, or the first row's keys."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns or list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)


def merged(path, rows, key=ROW_KEY):
    """The rows of the CSV at `path` (none if it does not exist) with `rows` added,
    each new row replacing an old one of the same `key` columns, in the old rows'
    order and the new ones after."""
    if not os.path.exists(path):
        return rows
    with open(path, newline="") as f:
        old = list(csv.DictReader(f))
    def which(r):  # as text: a CSV's cells are, freshly made rows may hold numbers
        return tuple(str(r.get(k, "")) for k in key)
    new = {which(r) for r in rows}
    kept = [r for r in old if which(r) not in new]
    columns = list(dict.fromkeys([*(old[0].keys() if old else []), *rows[0].keys()]))
    return [{c: r.get(c, "") for c in columns} for r in kept + rows]


def gpu_facts():
    """GPU name, driver and SM clock limit from nvidia-smi (empty when absent)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm",
             "--format=csv,noheader"], capture_output=True, text=True, check=True).stdout
        name, driver, clock = [x.strip() for x in out.splitlines()[0].split(",")]
        return {"gpu": name, "driver": driver, "max_sm_clock": clock}
    except (OSError, subprocess.CalledProcessError, ValueError):
        return {"gpu": "", "driver": "", "max_sm_clock": ""}


def record_tool(label, tool, tool_args, out, commit):
    """Runs a bench binary that prints CSV rows with a "check" column
    (flashstep_tile_sweep, flashstep_causal), adds the GPU, driver, date and
    commit every CSV in docs/results/ names, and writes them to `out`; the
    binary's stderr (its progress) goes straight through. Exits non-zero when
    the binary is missing, wrote no rows, failed, or a row's check is not ok."""
    if not (tool.is_file() and os.access(tool, os.X_OK)):
        sys.exit(f"{label}: no {tool.name} at {tool} (cmake --build build --target {tool.name})")
    proc = subprocess.run([str(tool), *tool_args], stdout=subprocess.PIPE, text=True)
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    if not rows:
        sys.exit(f"{label}: {tool.name} wrote no rows (exit {proc.returncode})")
    meta = gpu_facts()
    meta.update(date=datetime.date.today().isoformat(), commit=commit)
    for r in rows:
        r.update(meta)
    write_csv(out, rows)
    bad = [r for r in rows if r["check"] != "ok"]
    print(f"{label}: {len(rows)} rows to {out}; {len(bad)} not ok", file=sys.stderr)
    sys.exit(1 if bad or proc.returncode else 0)


EXIT_USAGE = 2  # a bad flag: argparse's exit status
MAX_D = 256     # flashstep's --d limit


class Parser(argparse.ArgumentParser):
    """argparse that says what was wrong in one line, "prog: message" (no usage
    block), and exits with EXIT_USAGE."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: {message}\n")


def add_problem_args(ap):
    """--N, --d and --causal: the FlashAttention-2 paper's sweep (the defaults) or part of it."""
    ap.add_argument("--N", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384],
                    help=f"sequence lengths (Nq = Nk), each dividing {TOKENS} (B = {TOKENS}/N)")
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128],
                    help=f"head dimensions, each dividing {HIDDEN} (H = {HIDDEN}/d), at most {MAX_D}")
    ap.add_argument("--causal", choices=["both", "yes", "no"], default="both")


def check_flashstep(ap, path):
    """Refuses, in one line, a --flashstep that is not an executable file."""
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        ap.error(f"--flashstep {path}: no executable there (cmake --build build --target flashstep)")


def check_problem_args(ap, args):
    """Refuses, in one line, an --N or --d the paper's shapes cannot take: B = TOKENS/N
    and H = HIDDEN/d must be whole."""
    for n in args.N:
        if n <= 0 or TOKENS % n:
            ap.error(f"--N {n}: must divide {TOKENS} (B = {TOKENS}/N)")
    for d in args.d:
        if d <= 0 or d > MAX_D or HIDDEN % d:
            ap.error(f"--d {d}: must divide {HIDDEN} (H = {HIDDEN}/d) and be at most {MAX_D}")


def causal_modes(args):
    """The causal values --causal asks for."""
    return {"both": [False, True], "yes": [True], "no": [False]}[args.causal]


def paper_problems(args):
    """(N, d, causal) of the sweep add_problem_args's flags ask for, N innermost."""
    return [(N, d, c) for d in args.d for c in causal_modes(args) for N in args.N]


def main():
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--flashstep", required=True, help="path to the flashstep binary")
    ap.add_argument("--out", required=True, help="CSV to write")
    add_problem_args(ap)
    ap.add_argument("--stage", default="all", help="flashstep --stage selector")
    ap.add_argument("--dtype", choices=["fp32", "fp16", "bf16"],
                    help="run the selected stages that have this type in it (default: each "
                         "stage in its own)")
    ap.add_argument("--append", action="store_true",
                    help="keep the rows of an existing --out CSV (rows of the same stage, dtype "
                         "and problem are replaced)")
    ap.add_argument("--long", action="store_true",
                    help="only the long point B=1 H=4 N=65536 (for each d, causal and not)")
    ap.add_argument("--commit", default=os.environ.get("FLASHSTEP_COMMIT", "unknown"))
    args = ap.parse_args()
    check_flashstep(ap, args.flashstep)
    check_problem_args(ap, args)

    meta = gpu_facts()
    meta["date"] = datetime.date.today().isoformat()
    meta["commit"] = args.commit
    if args.long:
        problems = [(LONG_POINT["N"], d, c) for d in args.d for c in causal_modes(args)]
    else:
        problems = paper_problems(args)

    rows, failures = [], 0
    for k, (N, d, causal) in enumerate(problems, 1):
        if args.long:
            B, H = LONG_POINT["B"], LONG_POINT["H"]
            warmup, iters = ITERS["single"]
        else:
            B, H = TOKENS // N, HIDDEN // d
            warmup, iters = ITERS["long" if N >= LONG_N else "short"]
        cmd = [args.flashstep, "--stage", args.stage, "--B", str(B), "--H", str(H),
               "--N", str(N), "--d", str(d), "--format", "csv",
               "--warmup", str(warmup), "--iters", str(iters)]
        if causal:
            cmd.append("--causal")
        if args.dtype:
            cmd += ["--dtype", args.dtype]
        t0 = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        print(f"[{k}/{len(problems)}] N={N} d={d} causal={int(causal)}: "
              f"{time.time() - t0:.1f} s, exit {proc.returncode}", file=sys.stderr, flush=True)
        if proc.returncode != 0:
            failures += 1
            sys.stderr.write(proc.stderr)
        for row in csv.DictReader(io.StringIO(proc.stdout)):
            row.update(meta)
            rows.append(row)

    if not rows:
        sys.exit("sweep: no results")
    n_new = len(rows)
    if args.append:
        rows = merged(args.out, rows)
    write_csv(args.out, rows)
    print(f"sweep: {n_new} rows to {args.out} ({len(rows)} in all); {failures} problem(s) with "
          "a failed stage", file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
