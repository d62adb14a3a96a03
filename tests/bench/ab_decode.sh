#!/usr/bin/env bash
# A/B for stage 09 on a GPU machine, in one call: build, stage 09's GPU
# tests, a few decode points (decode.py: every result of ours checked), and a
# table of this build's times beside those recorded in docs/results/decode.csv
# for the same points (the "before"; same GPU type, another run) and the
# fastest SDPA backend recorded there.
#
#   bash tests/bench/ab_decode.sh [decode.py point flags...]
#   bash tests/bench/ab_decode.sh --dtype bf16 --B 1 8 --H-kv 1 8 --Nq 1 --Nk 32768 524288
#
# Without flags: bf16 and fp32, B = 1 and 8, H_kv = 1 and 8, Nq = 1,
# Nk = 32k, 131k and 512k. No SDPA run (decode.csv has it); AB_PEERS=1 runs
# it too. CSVs and logs go to $OUT (or ./ab-logs).
set -uo pipefail
source "$(dirname "$0")/ab_build.sh" 09
[ $# -gt 0 ] || set -- --dtype bf16 fp32 --B 1 8 --H-kv 1 8 --Nq 1 --Nk 32768 131072 524288
peers=(--no-peers)
[ "${AB_PEERS:-0}" = 1 ] && peers=()
python3 tests/bench/decode.py --flashstep build/stages/cli/flashstep --out "$out/ab_decode.csv" \
  "${peers[@]}" "$@" 2>"$out/ab_decode.log"
decode_rc=$?
python3 tests/bench/ab_decode_table.py "$out/ab_decode.csv" docs/results/decode.csv
[ $test_rc = 0 ] && [ $decode_rc = 0 ]
