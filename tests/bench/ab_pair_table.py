#!/usr/bin/env python3
"""ab_pair.sh's table: the CSVs of its rounds (new_1.csv, old_1.csv, new_2.csv,
...: sweep.py, backward16.py or decode.py rows) in one folder, out one line per
entry and problem: the best median of each side over the rounds, new ÷ old,
and the checks either side reported. Backward rows are the backward pass
alone. Exits 1 when a side has no rows or a point failed its check.

    python3 tests/bench/ab_pair_table.py LOG_FOLDER"""
import csv
import glob
import os
import sys

# The columns that name a problem, in the order the table prints them; each
# script writes those it has.
KEY = ["stage", "dtype", "B", "H", "H_kv", "Nq", "Nk", "d", "causal"]
PASSED = ("ok", "unchecked", "reported", "")


def side_rows(folder, side):
    rows = []
    for path in sorted(glob.glob(os.path.join(folder, f"{side}_*.csv"))):
        with open(path, newline="") as f:
            rows += [r for r in csv.DictReader(f) if r.get("pass", "bwd") == "bwd"]
    return [r for r in rows if r.get("median ms")]


def key_of(r):
    return tuple(r[k] for k in KEY if k in r)


def main(folder):
    sides = {s: side_rows(folder, s) for s in ("new", "old")}
    empty = [s for s, rows in sides.items() if not rows]
    if empty:
        print(f"ab_pair: no timed rows for {' and '.join(empty)} in {folder}")
        return 1
    best, checks = {}, {}
    for side, rows in sides.items():
        for r in rows:
            k = key_of(r)
            ms = float(r["median ms"])
            best.setdefault(k, {})[side] = min(ms, best.get(k, {}).get(side, ms))
            checks.setdefault(k, set()).add(r.get("check", ""))
    names = [k for k in KEY if k in sides["new"][0]]
    print(" ".join(names) + " | new ms | old ms | new ÷ old | checks")
    failed = False
    for k in sorted(best, key=lambda k: tuple((0, int(x)) if x.isdigit() else (1, x) for x in k)):
        new, old = best[k].get("new"), best[k].get("old")
        ratio = f"×{new / old:.3f}" if new and old else "–"
        bad = sorted(c for c in checks[k] if c not in PASSED)
        failed |= bool(bad)
        print(f"{' '.join(k)} | {new if new else '–'} | {old if old else '–'} | {ratio} | "
              + (", ".join(bad) if bad else "ok"))
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
