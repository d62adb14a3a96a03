#!/usr/bin/env python3
"""gqa_prefill.py and its table (gqa_tables.py), without a GPU.

The script runs against a stand-in flashstep (a small Python script written
to a scratch folder) that answers as the CLI does on a GPU, with a failed
check, or without a GPU (the model alone, no "check" column); then with a
missing binary and a bad argument, each of which must be one line on stderr.
The table: a synthetic gqa_prefill.csv goes through `tables.py --results DIR
--out OUT`, and the block between <!-- results:gqa --> markers of
stages/09_split_kv/README.md is checked; then with no CSV, where it must say
how to record it. Prints a line per check and exits 1 if any failed. The
numbers are made up: only the plumbing and the rendering are under test."""
import csv
import json
import os
import re
import stat
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "gqa_prefill.py")
GPU = {"gpu": "NVIDIA H200", "driver": "580.0", "date": "2026-11-23", "commit": "0123456789abcdef"}

# The stand-in: logs its arguments (one JSON list a line) to $FAKE_LOG and
# prints CSV as flashstep does. $FAKE_MODE: run (checks ok), fail (every check
# FAIL, exit 1), hopperless (ok, but stage 08 unavailable) or model (no GPU:
# the model's columns, a line on stderr).
FAKE = r'''#!{python}
import json, os, sys
args = sys.argv[1:]
opt = dict(zip(args, args[1:]))
if args[0] == "model":  # the script's check of --stage, as flashstep answers it
    if "nope" in opt["--stage"].split(","):
        sys.stderr.write("flashstep: unknown stage 'nope' (known: 04_fa2_q_outer, all)\n")
        sys.exit(2)
    sys.exit(0)
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps(args) + "\n")
mode = os.environ["FAKE_MODE"]


def dtype_of(stage):  # each stage in its own type, as flashstep without --dtype
    return "bf16" if stage.startswith(("07", "08")) else "fp32"


problem = [opt["--B"], opt["--H"], opt["--N"], opt["--N"], opt["--d"], str(int("--causal" in args))]
if mode == "model":
    sys.stderr.write("flashstep: no usable CUDA device (no CUDA driver); printing the "
                     "modelled traffic only, no timings\n")
    print("stage,dtype,HBM read,HBM write,blocks,B,H,Nq,Nk,d,causal")
    for s in opt["--stage"].split(","):
        print(",".join([s, dtype_of(s), "1", "1", "1"] + problem))
    sys.exit(0)
print("stage,dtype,check,max err O,max err L,median ms,p20 ms,p80 ms,TFLOP/s,HBM read,"
      "HBM write,blocks,B,H,Nq,Nk,d,causal,gpu")
ms = 1 + int(opt["--H"]) / int(opt["--H-kv"]) / 100
check = "FAIL" if mode == "fail" else "ok"
for s in opt["--stage"].split(","):
    # hopperless: a GPU that is not Hopper, where stage 08 says unavailable.
    status = "unavailable" if mode == "hopperless" and s.startswith("08") else check
    print(",".join([s, dtype_of(s), status, "0", "0", str(ms), str(ms), str(ms), "1", "1", "1",
                    "1"] + problem + ["fake GPU"]))
sys.exit(1 if mode == "fail" else 0)
'''


def fake_flashstep(folder):
    path = os.path.join(folder, "flashstep")
    with open(path, "w") as f:
        f.write(FAKE.replace("{python}", sys.executable))
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


def run_script(folder, exe, mode, *extra, name=None):
    """(exit status, stderr lines, CSV rows or None, the stand-in's argument lists);
    the CSV and the log are named `name` (default: the mode) in `folder`."""
    name = name or mode
    out, log = os.path.join(folder, f"{name}.csv"), os.path.join(folder, f"{name}.log")
    env = {**os.environ, "FAKE_MODE": mode, "FAKE_LOG": log}
    proc = subprocess.run([sys.executable, SCRIPT, "--flashstep", exe, "--out", out,
                           "--commit", "abc123", *extra], capture_output=True, text=True, env=env)
    rows = None
    if os.path.exists(out):
        with open(out, newline="") as f:
            rows = list(csv.DictReader(f))
    calls = []
    if os.path.exists(log):
        with open(log) as f:
            calls = [json.loads(line) for line in f]
    return proc.returncode, proc.stderr.splitlines(), rows, calls


def script_checks():
    with tempfile.TemporaryDirectory(prefix="gqa_prefill_") as folder:
        exe = fake_flashstep(folder)
        rc, err, rows, calls = run_script(folder, exe, "run", "--N", "1024", "--d", "64", "128")
        heads = {(r["d"], r["H"], r["H_kv"]) for r in rows or []}
        progress = [line for line in err if line.startswith("[")]
        stages = {c[c.index("--stage") + 1] for c in calls}
        typed = any("--dtype" in c for c in calls)
        frc, _, frows, _ = run_script(folder, exe, "fail", "--N", "1024", "--d", "64",
                                      "--causal", "no")
        mrc, merr, mrows, _ = run_script(folder, exe, "model", "--N", "1024", "--d", "64")
        missing = run_script(folder, os.path.join(folder, "nope"), "run", name="missing")
        bad_n = run_script(folder, exe, "run", "--N", "3000", name="bad_n")
        bad_stage = run_script(folder, exe, "run", "--stage", "07_tensor_core,nope",
                               name="bad_stage")
        hrc, _, hrows, hcalls = run_script(folder, exe, "hopperless", "--N", "1024", "--d", "64",
                                           "--causal", "no", "--stage", "07_tensor_core,08_hopper")
        bad_d = run_script(folder, exe, "run", "--d", "100", name="bad_d")
        helped = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True)
        # --append: d = 64 into the run's CSV (its d = 64 rows replaced, d = 128 kept).
        arc, _, arows, _ = run_script(folder, exe, "run", "--N", "1024", "--d", "64",
                                      "--causal", "no", "--append", name="run")
    point_rows = [r for r in rows or [] if r["d"] == "64" and r["causal"] == "1"
                  and r["H_kv"] == "8"]
    return [
        ("--help works", helped.returncode == 0 and "--flashstep" in helped.stdout),
        ("a run: exit 0, rows written", rc == 0 and rows),
        ("H_kv = H, H/4 and 1 at each d (H = 2048/d)",
         heads == {("64", "32", "32"), ("64", "32", "8"), ("64", "32", "1"),
                   ("128", "16", "16"), ("128", "16", "4"), ("128", "16", "1")}),
        ("the stages with grouped heads, each in its own type (no --dtype)",
         stages == {"04,05,06,07_tensor_core,08_hopper,09_split_kv"} and not typed),
        ("the problem passed on: B = 16384/N, --H-kv, --causal, N",
         len(calls) == 12
         and all(c[c.index("--B") + 1] == "16" and "--H-kv" in c and c[c.index("--N") + 1] == "1024"
                 for c in calls) and sum("--causal" in c for c in calls) == 6),
        ("a row per stage of each call, with its problem",
         [(r["stage"], r["dtype"], r["B"], r["Nq"], r["Nk"]) for r in point_rows]
         == [("04", "fp32", "16", "1024", "1024"), ("05", "fp32", "16", "1024", "1024"),
             ("06", "fp32", "16", "1024", "1024"), ("07_tensor_core", "bf16", "16", "1024", "1024"),
             ("08_hopper", "bf16", "16", "1024", "1024"),
             ("09_split_kv", "fp32", "16", "1024", "1024")]),
        ("the provenance columns, the commit given",
         rows and all(r["commit"] == "abc123" and r["date"] and "gpu" in r and "driver" in r
                      for r in rows)),
        ("one progress line per problem and H_kv (2 d x 2 causal x 3 H_kv)",
         len(progress) == 12 and progress[0].startswith("[1/12] N=1024 d=64 causal=0")),
        ("--append: new rows replace the same runs, the others are kept",
         arc == 0 and rows and arows and len(arows) == len(rows)
         and sorted(tuple(r.values()) for r in arows if r["d"] == "128")
         == sorted(tuple(r.values()) for r in rows if r["d"] == "128")),
        ("--stage: its selector passed on; an unavailable stage (08 off Hopper) leaves no row",
         hrc == 0 and hcalls and all(c[c.index("--stage") + 1] == "07_tensor_core,08_hopper"
                                     for c in hcalls)
         and hrows and {r["stage"] for r in hrows} == {"07_tensor_core"}),
        ("--stage that flashstep refuses: exit 2, one line with its reason, nothing run",
         bad_stage[0] == 2 and len(bad_stage[1]) == 1 and "unknown stage 'nope'" in bad_stage[1][0]
         and bad_stage[2] is None and not bad_stage[3]),
        ("a failed check: exit 1, the rows still written",
         frc == 1 and frows and all(r["check"] == "FAIL" for r in frows)),
        ("no GPU: exit 1, one line that says so, nothing written",
         mrc == 1 and len(merr) == 1 and "found no GPU" in merr[0]
         and "no CUDA driver" in merr[0] and mrows is None),
        ("a missing flashstep: exit 2, one line naming it, nothing written",
         missing[0] == 2 and len(missing[1]) == 1 and "nope" in missing[1][0]
         and missing[2] is None),
        ("--N that does not divide 16384: exit 2, one line",
         bad_n[0] == 2 and len(bad_n[1]) == 1 and "--N 3000" in bad_n[1][0]),
        ("--d that does not divide 2048: exit 2, one line",
         bad_d[0] == 2 and len(bad_d[1]) == 1 and "--d 100" in bad_d[1][0]),
    ]


def row(stage, dtype, n, h_kv, ms, spread=0.01, check="ok", d=64, causal=0):
    return {"stage": stage, "dtype": dtype, "check": check, "median ms": str(ms),
            "p20 ms": str(ms - spread), "p80 ms": str(ms + spread), "B": str(16384 // n),
            "H": "32", "H_kv": str(h_kv), "Nq": str(n), "Nk": str(n), "d": str(d),
            "causal": str(causal), **GPU}


def synthetic(folder):
    """d = 64 only. Non-causal: a ratio under 1, one over 1 within the spread
    (met), one beyond it (not met), a failed check (not met) and a missing
    point; causal: every grouped point met, one of them beyond the spread but
    within the variation between runs (RUN_TO_RUN)."""
    rows = [row("04_fa2_q_outer", "fp32", 1024, 32, 1.0), row("04_fa2_q_outer", "fp32", 1024, 8, 0.98),
            row("04_fa2_q_outer", "fp32", 1024, 1, 1.005),
            row("04_fa2_q_outer", "fp32", 4096, 32, 4.0), row("04_fa2_q_outer", "fp32", 4096, 8, 4.0),
            row("04_fa2_q_outer", "fp32", 4096, 1, 4.4),
            row("07_tensor_core", "bf16", 1024, 32, 0.5),
            row("07_tensor_core", "bf16", 1024, 8, 0.45, check="FAIL"),
            row("07_tensor_core", "bf16", 1024, 1, 0.4),
            row("07_tensor_core", "bf16", 4096, 32, 2.0), row("07_tensor_core", "bf16", 4096, 1, 1.9),
            row("04_fa2_q_outer", "fp32", 1024, 32, 0.6, causal=1),
            row("04_fa2_q_outer", "fp32", 1024, 8, 0.6, causal=1),
            row("04_fa2_q_outer", "fp32", 1024, 1, 0.608, spread=0.001, causal=1)]
    with open(os.path.join(folder, "gqa_prefill.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def render(results):
    """The body of stage 09's <!-- results:gqa --> block as tables.py writes it."""
    with tempfile.TemporaryDirectory(prefix="gqa_tables_out_") as out:
        subprocess.run([sys.executable, os.path.join(HERE, "tables.py"), "--results", results,
                        "--out", out], check=True, capture_output=True, text=True)
        with open(os.path.join(out, "stages", "09_split_kv", "README.md")) as f:
            m = re.search(r"<!-- results:gqa:begin -->\n(.*?)<!-- results:gqa:end -->", f.read(),
                          re.S)
    return m.group(1) if m else None


def table_checks():
    with tempfile.TemporaryDirectory(prefix="gqa_tables_csv_") as folder:
        synthetic(folder)
        body = render(folder)
    with tempfile.TemporaryDirectory(prefix="gqa_tables_none_") as none:
        empty = render(none)
    sys.path.insert(0, HERE)
    from gqa_tables import MAX_LISTED, gqa_table
    ns = [1024 * 2 ** k for k in range(MAX_LISTED + 1)]
    all_slower = gqa_table([row("05_sequence_parallel", "fp32", n, h, 1.0 if h == 32 else 2.0)
                            for n in ns for h in (32, 8, 1)], 64, False)
    more = 2 * len(ns) - MAX_LISTED
    body = body or ""
    return body, [
        ("a table per recorded (d, causal), none for d = 128",
         "**d = 64, non-causal** (B = 16384/N, H = 32)" in body
         and "**d = 64, causal**" in body and "d = 128" not in body),
        ("the header: time at H_kv = H, then each grouped H_kv",
         "| stage | N | H_kv = 32 ms | H_kv = 8 | H_kv = 1 |" in body),
        ("ratios; one over 1 within the spread is not slower",
         "| 04_fa2_q_outer fp32 | 1,024 | 1 | ×0.98 | ×1.00 |" in body),
        ("one beyond the spread is marked slower",
         "| 04_fa2_q_outer fp32 | 4,096 | 4 | ×1.00 | ×1.10 *slower* |" in body),
        ("beyond the spread but within the variation between runs is not slower",
         "| 04_fa2_q_outer fp32 | 1,024 | 0.6 | ×1.00 | ×1.01 |" in body),
        ("a failed check is marked", "| 07_tensor_core bf16 | 1,024 | 0.5 | ×0.90 (FAIL) | ×0.80 |"
         in body),
        ("a missing point is a dash", "| 07_tensor_core bf16 | 4,096 | 2 | – | ×0.95 |" in body),
        ("the goal line names the misses, the failed check among them",
         "Goal (no grouped run slower than H_kv = 32): not met at 2 of 7 grouped points: 04_fa2_q_outer fp32 N = 4,096 H_kv = 1 (×1.10); "
         "07_tensor_core bf16 N = 1,024 H_kv = 8 (×0.90)." in body),
        ("the goal line when every point meets it", "32): met at all 2 grouped points." in body),
        ("many misses: the first few named, the rest counted",
         f"not met at {2 * len(ns)} of {2 * len(ns)} grouped points: " in all_slower
         and all_slower.count("(×2.00)") == MAX_LISTED and f"; and {more} more." in all_slower),
        ("the criterion is stated", "p20 above the H_kv = H run's p80" in body),
        ("the provenance line",
         "`docs/results/gqa_prefill.csv` (tests/bench/gqa_prefill.py): NVIDIA H200, driver 580.0, "
         "2026-11-23, commit `0123456789`" in body),
        ("no CSV: the block says how to record it",
         empty is not None and "not recorded yet" in empty
         and "run_all.sh LOGDIR build gqa tables" in empty and "|" not in empty),
    ]


def main():
    body, checks = table_checks()
    failed = 0
    for what, ok in script_checks() + checks:
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
        failed += not ok
    if failed:
        print(f"--- the rendered block:\n{body}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
