#!/usr/bin/env bash
# Stage 08 (Hopper, sm_90a) on a GPU machine in one call of under ten
# minutes: build the CLI and the GPU tests; the shared GPU test body on every
# stage 08 entry (bf16, and fp16 for 08_hopper; the ragged grid, causal and
# not, poisoned outputs, large logits); what the compiler emitted (registers,
# stack, HGMMA, TMA, setmaxnreg and local-memory instructions); a short timing
# of the ladder beside stage 07; last, the four compute-sanitizer tools on
# small ragged cases of step 1 and of the stage (d = 40: the threads' copies;
# d = 128: TMA, warp specialization, ping-pong, overlap), cut off after
# SANITIZE_SECONDS (default 240). Logs go to $OUT (or ./gpu-logs-hopper);
# each part prints a summary. On a GPU that is not Hopper the tests say
# skipped and the runs "unavailable".
#   bash tests/gpu_check_hopper.sh [extra cmake args]
set -uo pipefail
out=${OUT:-gpu-logs-hopper}
mkdir -p "$out"
build=${BUILD_DIR:-build-gpu}
export PATH="$PATH:/usr/local/cuda/bin"
t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader \
  | tee "$out/gpu.txt"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DFLASHSTEP_WERROR=ON "$@" > "$out/configure.log" 2>&1 \
  || { tail -20 "$out/configure.log"; exit 1; }
cmake --build "$build" --target flashstep test_gpu > "$out/build.log" 2>&1 \
  || { grep -E "error|FAILED" "$out/build.log" | head -20; exit 1; }
grep -c "C7519\|C7508\|C7510" "$out/build.log" | sed 's/^/ptxas wgmma or setmaxnreg notes in the build: /'
echo "== built in $((SECONDS - t0)) s"

echo "== GPU tests, stage 08 (every entry in each of its types)"
timeout 300 "$build/tests/test_gpu" --stage=08 > "$out/test_gpu_08.log" 2>&1
echo "rc=$? (77: skipped)"
grep -E "unavailable|skipped|test cases|assertions|ERROR|CHECK|Stage|stage 08" "$out/test_gpu_08.log" \
  | head -30

echo "== SASS of stage 08 (per kernel: registers, stack; per object: instruction counts)"
obj_dir="$build/stages/08_hopper/CMakeFiles/stage_08_hopper.dir"
for obj in "$obj_dir"/step*.cu.o; do
  echo "-- $(basename "$obj")"
  cuobjdump -res-usage "$obj" 2>&1 | grep -A1 "Function" | grep -v "^--" | paste - - \
    | sed -E 's/.*Function ([^:]*):.*REG:([0-9]+) STACK:([0-9]+).*LOCAL:([0-9]+).*/\1 REG=\2 STACK=\3 LOCAL=\4/' \
    | c++filt | sed -E 's/flashstep::hopper:://g; s/\(Params.*\)//' | grep -v __half
  cuobjdump -sass "$obj" | grep -oE "HGMMA\.[A-Za-z0-9x.]+|HMMA[A-Z0-9.]*|UTMALDG[A-Z0-9.]*|USETMAXREG[A-Z.]*|WARPGROUP\.DEPBAR[^;]*|\bLDL\b|\bSTL\b" \
    | sort | uniq -c
done > "$out/sass_08.txt" 2>&1
cat "$out/sass_08.txt"

echo "== timing: stage 07 beside stage 08's ladder, bf16, B=4 H=16 N=4096"
for d in 64 128; do
  for causal in "" "--causal"; do
    # shellcheck disable=SC2086
    timeout 120 "$build/stages/cli/flashstep" --stage 07_tensor_core,08 --dtype bf16 \
      --B 4 --H 16 --N 4096 --d "$d" $causal --iters 10 \
      >> "$out/timing.txt" 2>> "$out/timing.err"
  done
done
cat "$out/timing.txt"
grep -E "unavailable|FAIL|error" "$out/timing.err" | head

echo "== compute-sanitizer, 08_step1_wgmma_sync and 08_hopper ($((SECONDS - t0)) s so far)"
timeout "${SANITIZE_SECONDS:-240}" bash tests/sanitize.sh "$build" 08_step1_wgmma_sync,08_hopper \
  memcheck racecheck initcheck synccheck > "$out/sanitize_08.log" 2>&1
echo "rc=$? (124: cut off; see $out/sanitize_08.log for the runs done)"
tail -4 "$out/sanitize_08.log"
echo "== done in $((SECONDS - t0)) s"
