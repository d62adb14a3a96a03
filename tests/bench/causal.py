#!/usr/bin/env python3
"""Records FlashAttention-2's causal ablation (flashstep_causal) with the GPU, driver, date and commit.

flashstep_causal (tests/bench/causal.cpp) runs the fp32 tiled stages (03,
04, 05, 06 split-Q and split-K) on the paper's settings (B = 16384/N,
H = 2048/d, N in {512 ... 16384}, d in {64, 128}) in each causal mode of
common/tile_mask.h: fast (skip the tiles above the diagonal, test the mask
only in the tiles that cross it), no_skip (skipping off), mask_every
(diagonal-only masking off), causal, and the non-causal problem in fast and
mask_every; it checks every result against the fp64 reference on sampled rows
and times it as the CLI does. This script adds what every CSV in docs/results/
names and writes the CSV (tables.py renders it into the stage READMEs and
README.md); progress goes to stderr.

    python3 tests/bench/causal.py --out docs/results/causal.csv \\
        [--causal build/tests/bench/flashstep_causal] [-- --d 64 --N 4096]
"""
import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sweep import record_tool  # noqa: E402

DEFAULT_TOOL = Path(__file__).resolve().parents[2] / "build/tests/bench/flashstep_causal"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="CSV to write")
    ap.add_argument("--causal", type=Path, default=DEFAULT_TOOL, metavar="PATH",
                    help=f"flashstep_causal binary (default: {DEFAULT_TOOL})")
    ap.add_argument("--commit", default=os.environ.get("FLASHSTEP_COMMIT", "unknown"))
    ap.add_argument("args", nargs="*", help="passed to flashstep_causal (after --)")
    args = ap.parse_args()
    record_tool("causal", args.causal, args.args, args.out, args.commit)


if __name__ == "__main__":
    main()
