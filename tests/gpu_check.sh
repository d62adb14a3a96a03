#!/usr/bin/env bash
# On a GPU machine: configure, build, run every test (CPU and GPU), then the
# default flashstep table. Full logs go to $OUT (or ./gpu-logs); a short
# summary is printed last.
#   bash tests/gpu_check.sh [extra cmake args]
set -uo pipefail
out=${OUT:-gpu-logs}
mkdir -p "$out"
build=build-gpu
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader \
  | tee "$out/gpu.txt"
cmake -S . -B "$build" -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90 -DFLASHSTEP_WERROR=ON "$@" \
  > "$out/configure.log" 2>&1 || { tail -20 "$out/configure.log"; exit 1; }
cmake --build "$build" > "$out/build.log" 2>&1 || { grep -E "error|FAILED" "$out/build.log" | head -20; exit 1; }
ctest --test-dir "$build" --output-on-failure > "$out/ctest.log" 2>&1
ctest_rc=$?
"$build/stages/cli/flashstep" > "$out/flashstep.txt" 2> "$out/flashstep.err"
fs_rc=$?
echo "== ctest (rc=$ctest_rc)"
grep -E "tests passed|tests failed|Failed|Skipped" "$out/ctest.log" | tail -12
echo "== flashstep (rc=$fs_rc)"
cat "$out/flashstep.txt"
