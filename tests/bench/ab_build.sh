# The first half of ab_backward.sh and ab_decode.sh, sourced by both: from
# the repository root, the whole build in build/ (configured once with
# warnings as errors and kept between calls of a warm machine), then one
# stage's GPU tests, their summary lines printed. Sets out (the log folder:
# $OUT, or ./ab-logs) and test_rc.
#
#   source tests/bench/ab_build.sh STAGE_NUMBER
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
out=${OUT:-ab-logs}
mkdir -p "$out"
export PATH="$PATH:/usr/local/cuda/bin" PYTHONUNBUFFERED=1
if [ ! -f build/build.ninja ]; then
  cmake --preset default -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES:-90}" \
    -DFLASHSTEP_WERROR=ON >"$out/ab_configure.log" 2>&1 || { tail -5 "$out/ab_configure.log"; exit 1; }
fi
cmake --build build -j "$(nproc)" >"$out/ab_build.log" 2>&1 \
  || { grep -E "error|FAILED" "$out/ab_build.log" | head -20; exit 1; }
build/tests/test_gpu --stage="$1" >"$out/ab_test$1.log" 2>&1
test_rc=$?
grep -E "test cases|assertions|skipped" "$out/ab_test$1.log" | tail -2
