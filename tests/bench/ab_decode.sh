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
cd "$(dirname "$0")/../.." || exit 1
out=${OUT:-ab-logs}
mkdir -p "$out"
export PATH="$PATH:/usr/local/cuda/bin" PYTHONUNBUFFERED=1
if [ ! -f build/build.ninja ]; then
  cmake --preset default -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES:-90}" \
    -DFLASHSTEP_WERROR=ON >"$out/ab_configure.log" 2>&1 || { tail -5 "$out/ab_configure.log"; exit 1; }
fi
cmake --build build -j "$(nproc)" >"$out/ab_build.log" 2>&1 \
  || { grep -E "error|FAILED" "$out/ab_build.log" | head -20; exit 1; }
build/tests/test_gpu --stage=09 >"$out/ab_test09.log" 2>&1
test_rc=$?
grep -E "test cases|assertions" "$out/ab_test09.log" | tail -2
[ $# -gt 0 ] || set -- --dtype bf16 fp32 --B 1 8 --H-kv 1 8 --Nq 1 --Nk 32768 131072 524288
peers=(--no-peers)
[ "${AB_PEERS:-0}" = 1 ] && peers=()
python3 tests/bench/decode.py --flashstep build/stages/cli/flashstep --out "$out/ab_decode.csv" \
  "${peers[@]}" "$@" 2>"$out/ab_decode.log"
decode_rc=$?
python3 tests/bench/ab_decode_table.py "$out/ab_decode.csv" docs/results/decode.csv
[ $test_rc = 0 ] && [ $decode_rc = 0 ]
