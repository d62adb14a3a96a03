#!/usr/bin/env bash
# Stage 09's KV cache on a GPU machine, in one call (about 5 minutes on the
# lent H200): build stage 09 alone with its GPU tests and flashstep_kvcache;
# test_gpu --stage=09 (the shared test body, the contiguous cache, and the
# paged cache with new tokens appended); compute-sanitizer's memcheck on the
# paged cases; then kvcache.py's sweep. Logs and kvcache.csv go to $OUT (or
# ./kvcache-logs); a short summary is printed last.
#
#   FLASHSTEP_COMMIT=<commit> bash tests/bench/kvcache_gpu.sh [flashstep_kvcache flags...]
#
# Then, on the development machine: copy kvcache.csv to docs/results/ and run
# python3 tests/bench/tables.py.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
out=${OUT:-kvcache-logs}
mkdir -p "$out"
export PATH="$PATH:/usr/local/cuda/bin" PYTHONUNBUFFERED=1
export FLASHSTEP_COMMIT=${FLASHSTEP_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
build=build-kvcache
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DFLASHSTEP_STAGES_ONLY=09_split_kv -DFLASHSTEP_WERROR=ON > "$out/configure.log" 2>&1 \
  || { tail -20 "$out/configure.log"; exit 1; }
cmake --build "$build" --target test_gpu flashstep_kvcache -j "$(nproc)" > "$out/build.log" 2>&1 \
  || { grep -E "error|FAILED" "$out/build.log" | head -20; exit 1; }
"$build/tests/test_gpu" --stage=09 > "$out/test_gpu.log" 2>&1
test_rc=$?
compute-sanitizer --tool memcheck --error-exitcode 1 "$build/tests/test_gpu" --stage=09 \
  -tc="*paged*" > "$out/memcheck.log" 2>&1
memcheck_rc=$?
python3 tests/bench/kvcache.py --kvcache "$build/tests/bench/flashstep_kvcache" \
  --out "$out/kvcache.csv" -- "$@" 2> "$out/kvcache.log"
sweep_rc=$?
echo "== test_gpu --stage=09 (rc=$test_rc)"
grep -E "test cases|assertions" "$out/test_gpu.log"
echo "== memcheck, paged cases (rc=$memcheck_rc)"
grep -E "ERROR SUMMARY|test cases" "$out/memcheck.log"
echo "== kvcache.py (rc=$sweep_rc)"
tail -1 "$out/kvcache.log"
[ -s "$out/kvcache.csv" ] && cut -d, -f1,2,4,6,8,11,13,16 "$out/kvcache.csv"
[ $test_rc = 0 ] && [ $memcheck_rc = 0 ] && [ $sweep_rc = 0 ]
