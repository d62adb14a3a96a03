#!/usr/bin/env python3
"""Where stage 08's consumers wait (tuning_08 README, "Two Qi buffers"): from
`ncu --set full --import-source yes` of one hopper_ws_kernel launch, exported
with `ncu -i REP --page source --csv --print-source sass`. Prints every
barrier instruction (mbarrier try-wait, named barrier, wgmma wait, TMA) with
its executions and the warp-stall samples on it and on the branch after it
(a try-wait's stall lands on the branch that retries it), then the samples
summed by how often a line ran: per K/V tile of a consumer warp, per item of
a consumer warp, per producer copy. item_waits.txt is its output for bf16
d = 128 non-causal (B 8, H 16, N 2048) and d = 64 causal (B 8, H 32, N 2048),
and for stage 09's split kernel at MQA B 64, 1k keys (tuning_09, run 17).

    python3 item_waits.py EXPORT.csv [EXPORT.csv ...]
"""
import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
BARRIERS = ("TRYWAIT", "BAR.SYNC", "BAR.ARV", "DEPBAR", "UTMASTG", "UTMALDG")
SHARE = 1.0  # % of samples from which a run of lines is listed


def count(text):
    """ncu's number ('1,234', '-' or empty) as an int."""
    text = (text or "0").replace(",", "")
    return int(text) if text.isdigit() else 0


def first_kernel(path):
    """The kernel's name, and its SASS lines as (executed, samples, text)."""
    name, header, rows = None, None, []
    for r in csv.reader(open(path, newline="")):
        if r and r[0] == "Kernel Name":
            if rows:
                break
            name = r[1]
        elif header is None:
            header = {n: i for i, n in enumerate(r)}
        else:
            rows.append((count(r[header[EXECUTED]]), count(r[header[SAMPLES]]),
                         r[header["Source"]].strip()))
    return name, rows


def report(path):
    name, rows = first_kernel(path)
    total = sum(s for _, s, _ in rows) or 1
    pct = lambda s: f"{s * 100 / total:4.1f}%"
    print(f"## {path.split('/')[-1]}: {name[:120]}")
    print(f"{total} samples, {len(rows)} SASS lines")
    print("barrier instructions that ran (line, executions, samples on it, on the next line):")
    for i, (ex, s, text) in enumerate(rows):
        if ex and any(b in text for b in BARRIERS):
            after = rows[i + 1][1] if i + 1 < len(rows) else 0
            print(f"  {i:5d} {ex:>9} {pct(s)} {pct(after)}  {text[:72]}")
    by_count, runs = collections.Counter(), []
    for i, (ex, s, _) in enumerate(rows):
        by_count[ex] += s
        if runs and runs[-1][2] == ex:
            runs[-1][1], runs[-1][3] = i, runs[-1][3] + s
        else:
            runs.append([i, i, ex, s])
    print("samples by executions a line:")
    for ex, s in by_count.most_common(8):
        print(f"  {ex:>9}: {pct(s)}")
    print(f"runs of lines of one execution count with at least {SHARE}% of the samples:")
    for a, b, ex, s in runs:
        if s * 100 / total >= SHARE:
            print(f"  lines {a}-{b}, {ex} executions: {pct(s)}")
    print()


for p in sys.argv[1:]:
    report(p)
