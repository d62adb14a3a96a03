#!/usr/bin/env python3
"""Records the GPU's facts (`flashstep info`) with the date and commit.

Every CSV in docs/results/ names its GPU, driver and SM clock limit; this one
adds what nvidia-smi does not give: the SM count, the memory clock, L2 and
memory sizes, and the CUDA driver and runtime versions.

    python3 tests/bench/device.py --flashstep build/stages/cli/flashstep --out docs/results/device.csv
"""
import argparse
import csv
import datetime
import io
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sweep import write_csv  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flashstep", required=True, help="path to the flashstep binary")
    ap.add_argument("--out", required=True, help="CSV to write")
    ap.add_argument("--commit", default=os.environ.get("FLASHSTEP_COMMIT", "unknown"))
    args = ap.parse_args()
    proc = subprocess.run([args.flashstep, "info", "--format", "csv"], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"device: {proc.stderr.strip() or 'flashstep info failed'}")
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    for r in rows:
        r.update(date=datetime.date.today().isoformat(), commit=args.commit)
    write_csv(args.out, rows)
    print(f"device: {rows[0]['gpu']}, {rows[0]['sm_count']} SMs, CUDA runtime "
          f"{rows[0]['cuda_runtime']} -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
