#!/usr/bin/env python3
"""kvcache_tables.py's block in stage 09's README, without a GPU.

A synthetic kvcache.csv goes through `tables.py --results DIR --out OUT`, and
the block between <!-- results:kvcache --> markers of
stages/09_split_kv/README.md is checked: a table per type, each layout's time
as a ratio to the contiguous cache's, a failed check shown in place of its
ratio and left out of the range line, the provenance line; then with no CSV,
where it must say how to record it. Prints a line per check and exits 1 if
any failed. The numbers are made up: only the rendering is under test."""
import csv
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
GPU = {"gpu": "NVIDIA H200", "driver": "580.0", "date": "2026-11-28", "commit": "0123456789abcdef"}
LAYOUTS = {"contiguous": 1.0, "paged64": 1.1, "paged256": 1.05, "contiguous+append": 1.5,
           "paged256+append": 2.0}
# The long point runs near the copy ceiling, where the pages cost less.
LONG_PAGED = {"paged64": 1.02, "paged256": 1.01}
# Per Nk: the contiguous time in ms (bf16; fp32 twice) and its bandwidth.
POINTS = {4096: (0.02, 3000.0), 32768: (0.12, 4200.0)}


def rows():
    out = []
    for dtype in ("bf16", "fp32"):
        for nk, (base_ms, gbs) in POINTS.items():
            for layout, factor in LAYOUTS.items():
                failed = dtype == "fp32" and nk == 32768 and layout == "paged64"
                if nk == 32768:
                    factor = LONG_PAGED.get(layout, factor)
                ms = base_ms * factor * (2 if dtype == "fp32" else 1)
                out.append(dict(dtype=dtype, B=1, H=32, H_kv=8, Nq=1, Nk=nk, d=128, layout=layout,
                                page_keys=0, append=0, check="FAIL" if failed else "ok",
                                **{"max err O": "0.001", "median ms": ms, "p20 ms": ms,
                                   "p80 ms": ms, "GB/s": gbs, "note": ""}, **GPU))
    return out


def render(results):
    with tempfile.TemporaryDirectory(prefix="kvcache_tables_out_") as out:
        subprocess.run([sys.executable, os.path.join(HERE, "tables.py"), "--results", results,
                        "--out", out], check=True, capture_output=True, text=True)
        with open(os.path.join(out, "stages", "09_split_kv", "README.md")) as f:
            m = re.search(r"<!-- results:kvcache:begin -->\n(.*?)<!-- results:kvcache:end -->",
                          f.read(), re.S)
    return m.group(1) if m else None


def main():
    with tempfile.TemporaryDirectory(prefix="kvcache_tables_csv_") as folder:
        data = rows()
        with open(os.path.join(folder, "kvcache.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(data[0]))
            w.writeheader()
            w.writerows(data)
        body = render(folder) or ""
    with tempfile.TemporaryDirectory(prefix="kvcache_tables_none_") as none:
        empty = render(none)
    checks = [
        ("a table per type", "**bf16** (H = 32, d = 128, Nq = 1;" in body and "**fp32**" in body),
        ("the header names every layout",
         "| H_kv | B | Nk | contiguous µs | GB/s | paged64 | paged256 | contiguous+append | "
         "paged256+append |" in body),
        ("a row: contiguous µs, GB/s, then each layout ÷ contiguous",
         "| 8 | 1 | 4,096 | 20.0 | 3,000 | ×1.10 | ×1.05 | ×1.50 | ×2.00 |" in body),
        ("a failed check in place of its ratio",
         "| 8 | 1 | 32,768 | 240.0 | 4,200 | FAIL | ×1.01 | ×1.50 | ×2.00 |" in body),
        ("the range line leaves the failed run out",
         "Range over the points: paged64 ×1.10 to ×1.10; paged256 ×1.01 to ×1.05;" in body),
        ("the regime line: the paged layouts near the ceiling and below, the append's µs",
         "near the copy ceiling (contiguous at 4,000 GB/s or more): ×1.01 to ×1.02; below it: "
         "×1.05 to ×1.10. The append adds 10.0 µs to 10.0 µs to decodes under 50 µs "
         "(×1.50 to ×1.50), ×1.50 to ×1.50 from 100 µs." in body),
        ("the regime line leaves the failed run out",
         "or more): ×1.01 to ×1.01; below it: ×1.05 to ×1.10. The append adds 20.0 µs" in body),
        ("the provenance line", "`docs/results/kvcache.csv` (tests/bench/kvcache.py): NVIDIA H200, "
         "driver 580.0, 2026-11-28, commit `0123456789`" in body),
        ("no CSV: the block says how to record it",
         empty is not None and "not recorded yet" in empty and "kvcache_gpu.sh" in empty
         and "|" not in empty),
    ]
    failed = 0
    for what, ok in checks:
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
        failed += not ok
    if failed:
        print(f"--- the rendered block:\n{body}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
