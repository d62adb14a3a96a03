#!/usr/bin/env bash
# A/B for one stage on a GPU machine, in one call: build only that stage,
# check and time it on some of the paper's problems (sweep.py: every result
# checked against the fp64 reference), time PyTorch's SDPA peers on the same
# problems in the same call (peers.py), and print them side by side.
#
#   bash tests/bench/ab.sh STAGE_FOLDER [sweep.py/peers.py problem flags...]
#   bash tests/bench/ab.sh 07_tensor_core --N 1024 4096 --d 128 --causal no
#
# The peers default to those of the stage's native element type (bf16: SDPA
# flash and cuDNN; fp32: SDPA mem-efficient and math); PEERS overrides them
# (a peers.py --peer list). CSVs and logs go to $OUT (or ./ab-logs); the table
# is printed last. The build is kept in build-ab/ between calls.
set -uo pipefail
folder=${1:?usage: bash tests/bench/ab.sh STAGE_FOLDER [--N ...] [--d ...] [--causal yes|no|both]}
shift
cd "$(dirname "$0")/../.." || exit 1
out=${OUT:-ab-logs}
mkdir -p "$out"
export PATH="$PATH:/usr/local/cuda/bin" PYTHONUNBUFFERED=1
build=build-ab
cmake -S . -B "$build" -G Ninja -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES:-90}" \
  -DFLASHSTEP_STAGES_ONLY="$folder" -DFLASHSTEP_BUILD_TESTS=OFF >"$out/ab_configure.log" 2>&1 \
  || { tail -5 "$out/ab_configure.log"; exit 1; }
cmake --build "$build" --target flashstep >"$out/ab_build.log" 2>&1 \
  || { grep -E "error|FAILED" "$out/ab_build.log" | head -20; exit 1; }
exe="$build/stages/cli/flashstep"
native=$("$exe" model --stage "${folder%%_*}" --format csv | awk -F, 'NR == 2 {print $2}')
default_peers=sdpa_efficient_fp32,sdpa_math_fp32
[ "$native" = fp32 ] || default_peers=sdpa_flash_bf16,sdpa_cudnn_bf16
python3 tests/bench/sweep.py --flashstep "$exe" --stage "${folder%%_*}" --out "$out/ab_stage.csv" "$@" \
  2>"$out/ab_sweep.log"
sweep_rc=$?
python3 tests/bench/peers.py --peer "${PEERS:-$default_peers}" --out "$out/ab_peers.csv" "$@" \
  2>"$out/ab_peers.log"
python3 - "$out/ab_stage.csv" "$out/ab_peers.csv" <<'EOF'
import csv, os, sys
rows = [r for p in sys.argv[1:] if os.path.exists(p) for r in csv.DictReader(open(p))]
key = lambda r: (int(r["d"]), int(r["causal"]), int(r["Nq"]))
problems = sorted({key(r) for r in rows})
stages = list(dict.fromkeys(r["stage"] for r in rows))
cell = {(r["stage"], key(r)): (r["TFLOP/s"] or "-") + ("" if r["check"] in ("ok", "") else " " + r["check"])
        for r in rows}
head = ["stage"] + [f"d{d}{' c' if c else ''} N{n}" for d, c, n in problems]
width = max(len(s) for s in stages + ["stage"])
print("TFLOP/s (4*B*H*N^2*d, halved if causal; B = 16384/N, H = 2048/d)")
print(" ".join([head[0].ljust(width)] + [h.rjust(13) for h in head[1:]]))
for s in stages:
    print(" ".join([s.ljust(width)] + [cell.get((s, p), "-").rjust(13) for p in problems]))
EOF
exit $sweep_rc
