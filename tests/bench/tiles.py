#!/usr/bin/env python3
"""Records stage 07's tile-shape sweep (flashstep_tile_sweep) with the GPU, driver, date and commit.

flashstep_tile_sweep (tests/bench/tile_sweep.cu) runs stage 07's kernel at
several tile shapes (Br x Bc, warps) per head dimension d in {64, 128, 256},
bf16, on the paper's settings (B = 16384/N, H = 2048/d) at N in {1024, 4096,
16384}, causal and not; it checks every result against the fp64 reference on
sampled rows and times it as the CLI does. Its "stage shape" column marks the
shape stage 07 ships with (tensor_core_tiles.h). This script adds what every
CSV in docs/results/ names and writes the CSV; progress goes to stderr.

    python3 tests/bench/tiles.py --out docs/results/tiles.csv \
        [--tile-sweep build/tests/bench/flashstep_tile_sweep] [-- --d 64 --N 4096]
"""
import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sweep import record_tool  # noqa: E402

DEFAULT_TILE_SWEEP = Path(__file__).resolve().parents[2] / "build/tests/bench/flashstep_tile_sweep"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="CSV to write")
    ap.add_argument("--tile-sweep", type=Path, default=DEFAULT_TILE_SWEEP, metavar="PATH",
                    help=f"flashstep_tile_sweep binary (default: {DEFAULT_TILE_SWEEP})")
    ap.add_argument("--commit", default=os.environ.get("FLASHSTEP_COMMIT", "unknown"))
    ap.add_argument("args", nargs="*", help="passed to flashstep_tile_sweep (after --)")
    args = ap.parse_args()
    record_tool("tiles", args.tile_sweep, args.args, args.out, args.commit)


if __name__ == "__main__":
    main()
