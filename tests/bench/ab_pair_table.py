#!/usr/bin/env python3
"""ab_pair.sh's and ab_trees.sh's table: the CSVs of their rounds (new_1.csv,
old_1.csv, new_2.csv, ...: sweep.py, backward16.py or decode.py rows) in one
folder, out one line per entry and problem: the best median of each side over
the rounds, each side ÷ the reference side, and the checks any side reported.
Backward rows are the backward pass alone. Exits 1 when a side has no rows or
a point failed its check.

    python3 tests/bench/ab_pair_table.py LOG_FOLDER                  (new ÷ old)
    python3 tests/bench/ab_pair_table.py LOG_FOLDER REFERENCE SIDE... (ab_trees.sh)"""
import csv
import glob
import os
import re
import sys

# The columns that name a problem, in the order the table prints them; each
# script writes those it has.
KEY = ["stage", "dtype", "B", "H", "H_kv", "Nq", "Nk", "d", "causal"]
PASSED = ("ok", "unchecked", "reported", "")


def side_rows(folder, side):
    rows = []
    # SIDE_<round>.csv only: SIDE_*.csv would also take another side whose
    # name starts with this one's (b1's glob took b1_frag_1.csv).
    rounds = glob.glob(os.path.join(folder, f"{side}_*.csv"))
    for path in sorted(p for p in rounds if re.fullmatch(rf"{re.escape(side)}_\d+\.csv", os.path.basename(p))):
        with open(path, newline="") as f:
            rows += [r for r in csv.DictReader(f) if r.get("pass", "bwd") == "bwd"]
    return [r for r in rows if r.get("median ms")]


def key_of(r):
    return tuple(r[k] for k in KEY if k in r)


def main(folder, reference="old", others=("new",)):
    names = [*others, reference]
    sides = {s: side_rows(folder, s) for s in names}
    empty = [s for s in names if not sides[s]]
    if empty:
        print(f"ab_pair_table: no timed rows for {' and '.join(empty)} in {folder}")
        return 1
    best, checks = {}, {}
    for side, rows in sides.items():
        for r in rows:
            k = key_of(r)
            ms = float(r["median ms"])
            best.setdefault(k, {})[side] = min(ms, best.get(k, {}).get(side, ms))
            checks.setdefault(k, set()).add(r.get("check", ""))
    columns = [k for k in KEY if k in sides[names[0]][0]]
    print(" ".join(columns) + " | " + " | ".join(f"{s} ms" for s in names) + " | "
          + " | ".join(f"{s} ÷ {reference}" for s in others) + " | checks")
    failed = False
    for k in sorted(best, key=lambda k: tuple((0, int(x)) if x.isdigit() else (1, x) for x in k)):
        ms = [best[k].get(s) for s in names]
        base = best[k].get(reference)
        ratios = [f"×{m / base:.3f}" if m and base else "–" for m in ms[:-1]]
        bad = sorted(c for c in checks[k] if c not in PASSED)
        failed |= bool(bad)
        print(f"{' '.join(k)} | " + " | ".join(str(m) if m else "–" for m in ms) + " | "
              + " | ".join(ratios) + " | " + (", ".join(bad) if bad else "ok"))
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) == 2:
        sys.exit(main(sys.argv[1]))
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
