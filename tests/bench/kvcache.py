#!/usr/bin/env python3
"""Records stage 09's KV-cache layouts (flashstep_kvcache) with the GPU, driver, date and commit.

flashstep_kvcache (tests/bench/kvcache.cpp) runs stage 09's decode (Nq = 1,
H = 32, d = 128, bf16 and fp32) through split_kv::forward_kvcache with a
contiguous cache, a paged one (pages of 64 and 256 keys in a shuffled
order), and with the new token appended in the same call; it checks each
against the fp64 reference on sampled rows and times it as the CLI does.
This script adds what every CSV in docs/results/ names and writes the CSV
(tables.py renders it into stages/09_split_kv/README.md); progress goes to
stderr.

    python3 tests/bench/kvcache.py --out docs/results/kvcache.csv \\
        [--kvcache build/tests/bench/flashstep_kvcache] [-- --Nk 32768 --B 1]
"""
import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sweep import record_tool  # noqa: E402

DEFAULT_TOOL = Path(__file__).resolve().parents[2] / "build/tests/bench/flashstep_kvcache"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="CSV to write")
    ap.add_argument("--kvcache", type=Path, default=DEFAULT_TOOL, metavar="PATH",
                    help=f"flashstep_kvcache binary (default: {DEFAULT_TOOL})")
    ap.add_argument("--commit", default=os.environ.get("FLASHSTEP_COMMIT", "unknown"))
    ap.add_argument("args", nargs="*", help="passed to flashstep_kvcache (after --)")
    args = ap.parse_args()
    record_tool("kvcache", args.kvcache, args.args, args.out, args.commit)


if __name__ == "__main__":
    main()
