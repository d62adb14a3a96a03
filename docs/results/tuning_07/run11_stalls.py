#!/usr/bin/env python3
"""Round 11 (tuning_07/README.md): warp-stall samples per SASS opcode, from
`ncu --page source --csv --print-source sass` exports of one kernel launch
(ncu --clock-control none, section SourceCounters); run11_stalls.txt is its
output for the d = 64 dkdv_kernel before and after round 11 and for
FlashAttention-2's backward kernel (N = 4096, B = 4, H = 32, bf16).

    python3 run11_stalls.py EXPORT.csv [EXPORT.csv ...]
"""
import collections
import csv
import re
import sys

# ncu's per-instruction stall columns, printed as shares of all samples.
STALLS = ["stall_barrier", "stall_long_sb", "stall_math", "stall_mio", "stall_short_sb",
          "stall_wait", "stall_dispatch", "stall_not_selected", "stall_selected", "stall_lg",
          "stall_branch_resolving"]
TOP_OPCODES = 14     # opcodes listed per export, most samples first
SHOWN_SHARE = 0.01   # a stall column is printed for an opcode from this share of all samples


def count(text):
    """ncu's number ('1,234' or empty) as an int."""
    return int((text or "0").replace(",", ""))


def opcode(source):
    """The SASS opcode of an instruction, its predicate (@P0, @!UP1) dropped."""
    return re.sub(r"^@!?U?P\w+\s+", "", source.strip()).split(" ")[0]


def summarize(path):
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    rows = list(csv.DictReader(lines[1:]))  # line 0 names the kernel
    if not rows or "Warp Stall Sampling (All Samples)" not in rows[0]:
        sys.exit(f"run11_stalls: {path} is not an ncu source-page CSV export")
    total = collections.Counter()
    by_op = collections.defaultdict(collections.Counter)
    samples = 0
    for r in rows:
        s = count(r["Warp Stall Sampling (All Samples)"])
        samples += s
        op = by_op[opcode(r["Source"])]
        op["all"] += s
        op["inst"] += count(r["Instructions Executed"])
        for c in STALLS:
            total[c] += count(r.get(c))
            op[c] += count(r.get(c))
    if samples == 0:
        sys.exit(f"run11_stalls: {path} has no stall samples")
    print(f"== {path} samples {samples}")
    print(" ".join(f"{c[6:]}={total[c] / samples * 100:.1f}%" for c in STALLS))
    for name, c in sorted(by_op.items(), key=lambda kv: -kv[1]["all"])[:TOP_OPCODES]:
        shown = " ".join(f"{k[6:]}={c[k] / samples * 100:.1f}" for k in STALLS
                         if c[k] / samples > SHOWN_SHARE)
        print(f"{name:22s} samp={c['all'] / samples * 100:5.1f}% inst={c['inst'] / 1e6:7.1f}M {shown}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    for arg in sys.argv[1:]:
        summarize(arg)
