#!/usr/bin/env python3
"""Run 15 (README.md): where a short decode's two kernels spend their time,
from `ncu --set full --import-source yes` reports exported with
`ncu -i REP --page source --csv --print-source sass` (one split_mma_kernel
launch, then one merge_kernel launch). For each kernel: the warp-stall
samples and the warp-level instructions executed per range of SASS lines,
and the stall reasons over the whole kernel. run15_source_phases.txt is its
output for bf16, H = 32, Nq = 1, Nk = 1024, d = 128 at H_kv 1 B 1, H_kv 1
B 8 and H_kv 8 B 1.

    python3 run15_source_phases.py EXPORT.csv [EXPORT.csv ...]
"""
import collections
import csv
import re
import sys

RANGE = 250          # SASS lines a printed range spans
TOP_REASONS = 6      # stall reasons printed a kernel, most samples first
SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def count(text):
    """ncu's number ('1,234', '-' or empty) as an int."""
    text = (text or "0").replace(",", "")
    return int(text) if text.isdigit() else 0


def kernels(path):
    """(name, header, rows) per kernel of the export, the first export of each."""
    blocks, name, header, rows = [], None, None, None
    for r in csv.reader(open(path, newline="")):
        if r and r[0] == "Kernel Name":
            name, header = r[1], None
            rows = [] if all(b[0] != name for b in blocks) else None
        elif rows is not None and header is None:
            header = r
            blocks.append((name, header, rows))
        elif rows is not None:
            rows.append(r)
    return blocks


def report(path):
    print(f"## {path.split('/')[-1]}")
    for name, header, rows in kernels(path):
        ix = {n: i for i, n in enumerate(header)}
        reasons = [n for n in header if n.startswith("stall_") and "Not Issued" not in n]
        samples = [count(r[ix[SAMPLES]]) for r in rows]
        executed = [count(r[ix[EXECUTED]]) for r in rows]
        total = sum(samples) or 1
        by_reason = collections.Counter()
        for r in rows:
            for n in reasons:
                by_reason[n] += count(r[ix[n]])
        short = re.search(r"(\w+_kernel<[^>]*>)", name).group(1)
        print(f"{short}: {sum(samples)} samples, {sum(executed)} warp instructions, "
              f"{len(rows)} SASS lines")
        print("  stall reasons: " + ", ".join(f"{n[6:]} {v * 100 / total:.0f}%"
                                              for n, v in by_reason.most_common(TOP_REASONS)))
        for a in range(0, len(rows), RANGE):
            s, e = sum(samples[a:a + RANGE]), sum(executed[a:a + RANGE])
            if s or e:
                print(f"  SASS {a:5d}-{a + RANGE - 1:5d}: {s * 100 / total:5.1f}% of samples, "
                      f"{e:8d} warp instructions")


for p in sys.argv[1:]:
    report(p)
