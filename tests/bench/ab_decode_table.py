#!/usr/bin/env python3
"""The table ab_decode.sh prints: stage 09's times from a new decode.py run
beside the recorded ones (docs/results/decode.csv) for the same points, and
the fastest SDPA backend of the same type there.

    python3 tests/bench/ab_decode_table.py NEW.csv RECORDED.csv

A point missing from the record shows '-'; a check that is not ok is named
after the time."""
import csv
import os
import sys

POINT = ("dtype", "B", "H", "H_kv", "Nq", "Nk", "d", "causal")


def read(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def ms(row):
    return float(row["median ms"]) if row and row.get("median ms") else None


def table(new, recorded):
    """The lines of the table: one per (point, stage 09 entry) of the new run."""
    before = {(r["stage"],) + tuple(r[k] for k in POINT): r for r in recorded}
    sdpa = {}
    for r in recorded:
        key = tuple(r[k] for k in POINT)
        if r["stage"].startswith("sdpa") and ms(r) is not None:
            sdpa[key] = min(sdpa.get(key, ms(r)), ms(r))
    lines = [f"{'stage':13} {'type':5} {'B':>3} {'H_kv':>4} {'Nq':>3} {'Nk':>7} "
             f"{'new ms':>9} {'recorded':>9} {'new/rec':>7} {'of copy':>7} {'SDPA best':>9}"]
    for r in new:
        if not r["stage"].startswith("09") or ms(r) is None:
            continue
        point = tuple(r[k] for k in POINT)
        old = ms(before.get((r["stage"],) + point))
        check = "" if r["check"] in ("ok", "unchecked") else " " + r["check"]
        ratio = f"{ms(r) / old:.2f}" if old else "-"
        best = f"{sdpa[point]:.4g}" if point in sdpa else "-"
        lines.append(f"{r['stage']:13} {r['dtype']:5} {r['B']:>3} {r['H_kv']:>4} {r['Nq']:>3} "
                     f"{r['Nk']:>7} {ms(r):>9.4g} {old if old else '-':>9} {ratio:>7} "
                     f"{r['of copy']:>7} {best:>9}{check}")
    return lines


def main():
    if len(sys.argv) != 3:
        print("usage: ab_decode_table.py NEW.csv RECORDED.csv", file=sys.stderr)
        return 2
    new = read(sys.argv[1])
    if not new:
        print(f"ab_decode_table: no rows in {sys.argv[1]}", file=sys.stderr)
        return 1
    print("\n".join(table(new, read(sys.argv[2]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
