#!/usr/bin/env bash
# Stage 10 on a machine of 2 or more GPUs (the lent nvidia-h200-x2), in two
# calls of under ten minutes each; logs and ring.csv go to $OUT (or ./ring-logs).
#
#   bash tests/bench/ring_gpu.sh 1   # build; gpu.10_ring and the ring's CPU checks
#                                    # (ctest); ring.py --parts weak          (~7 min)
#   bash tests/bench/ring_gpu.sh 2   # build (nothing to do on a warm machine);
#                                    # ring.py --parts strong long contrast   (~6 min)
#
# Then, on the development machine, with both calls' ring.csv:
#   python3 tests/bench/ring.py --merge 1/ring.csv 2/ring.csv --out docs/results/ring.csv
#   python3 tests/bench/tables.py && python3 tests/bench/plots.py
#
# NCCL: CMake looks in the CUDA toolkit and the system folders; where it finds
# none, this script tries the NCCL of python3's nvidia-nccl wheel (NCCL_ROOT).
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0), as the lent machines require.
set -uo pipefail
call=${1:?usage: bash tests/bench/ring_gpu.sh 1|2}
cd "$(dirname "$0")/../.." || exit 1
out=${OUT:-ring-logs}
mkdir -p "$out"
export PATH="$PATH:/usr/local/cuda/bin" PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export FLASHSTEP_COMMIT=${FLASHSTEP_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
build=build-ring
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee "$out/gpus.txt"
nvidia-smi topo -m > "$out/topology.txt" 2>&1

configure() {
  cmake -S . -B "$build" -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90 -DFLASHSTEP_WERROR=ON "$@" \
    > "$out/configure.log" 2>&1
}
configure || { tail -20 "$out/configure.log"; exit 1; }
if grep -q "no NCCL found" "$out/configure.log"; then
  root=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null)
  echo "ring_gpu: CMake found no NCCL; trying python3's wheel: ${root:-none}"
  [ -n "$root" ] && configure -DNCCL_ROOT="$root"
fi
grep "Stage 10" "$out/configure.log"
cmake --build "$build" --target flashstep_ring test_ring_gpu > "$out/build.log" 2>&1 \
  || { grep -E "error|FAILED" "$out/build.log" | head -20; exit 1; }
exe="$build/stages/10_ring/flashstep_ring"

case $call in
  1)
    ctest --test-dir "$build" -R "ring" --output-on-failure > "$out/ctest.log" 2>&1
    echo "== ctest (rc=$?)"
    grep -E "tests passed|tests failed|Failed|Skipped|Passed" "$out/ctest.log" | tail -8
    "$exe" --N 65536 --causal --format csv > "$out/smoke.csv" 2> "$out/smoke.err"
    echo "== smoke (rc=$?)"; cat "$out/smoke.csv"
    python3 tests/bench/ring.py --flashstep-ring "$exe" --parts weak --out "$out/ring.csv" \
      2> "$out/ring_weak.log"
    echo "== ring.py weak (rc=$?)"; tail -3 "$out/ring_weak.log"
    ;;
  2)
    python3 tests/bench/ring.py --flashstep-ring "$exe" --parts strong long contrast \
      --out "$out/ring.csv" 2> "$out/ring_strong.log"
    echo "== ring.py strong long contrast (rc=$?)"; tail -3 "$out/ring_strong.log"
    ;;
  *) echo "usage: bash tests/bench/ring_gpu.sh 1|2"; exit 2 ;;
esac
[ -s "$out/ring.csv" ] && cut -d, -f1-18 "$out/ring.csv"
