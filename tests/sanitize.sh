#!/usr/bin/env bash
# compute-sanitizer over every selected stage at three ragged shapes, causal and
# not: memcheck, racecheck, initcheck, synccheck. Each run launches the stage
# once (--iters 0), and its backward too when it has one (--backward). Prints one line per run and a summary; exits non-zero on
# any finding. Each stage runs in its native element type; SANITIZE_FLAGS adds
# flashstep flags to every run (e.g. SANITIZE_FLAGS="--dtype bf16").
#   bash tests/sanitize.sh BUILD_DIR [stage selector, default all] [tools...]
set -uo pipefail
build=${1:?usage: tests/sanitize.sh BUILD_DIR [stages] [tools...]}
stages=${2:-all}
shift $(( $# >= 2 ? 2 : 1 ))
tools=("$@")
[ ${#tools[@]} -gt 0 ] || tools=(memcheck racecheck initcheck synccheck)
exe="$build/stages/cli/flashstep"
read -r -a extra <<<"${SANITIZE_FLAGS:-}"
names=$("$exe" model --stage "$stages" "${extra[@]}" --format csv | tail -n +2 | cut -d, -f1)
with_backward=" $("$exe" model --backward "${extra[@]}" --format csv 2>/dev/null | tail -n +2 | cut -d, -f1 | tr '\n' ' ')"
# d = 128 twice: Nk = 97 is one partial K/V tile, Nk = 300 several (the tile
# loops of the Hopper stage only run with two or more).
shapes=("--B 1 --H 2 --Nq 113 --Nk 203 --d 40" "--B 2 --H 1 --Nq 239 --Nk 97 --d 128"
        "--B 1 --H 1 --Nq 150 --Nk 300 --d 128")
runs=0 bad=0
for stage in $names; do
  for shape in "${shapes[@]}"; do
    for causal in "" "--causal"; do
      backward=""
      [[ "$with_backward" == *" $stage "* ]] && backward="--backward"
      for tool in "${tools[@]}"; do
        # shellcheck disable=SC2086
        log=$(compute-sanitizer --tool "$tool" --error-exitcode 99 \
              "$exe" --stage "$stage" "${extra[@]}" $shape $causal $backward --iters 0 --no-check 2>&1)
        rc=$?
        runs=$((runs + 1))
        summary=$(grep -m1 "ERROR SUMMARY\|RACECHECK SUMMARY" <<<"$log")
        if [ $rc -ne 0 ]; then
          bad=$((bad + 1))
          echo "FINDING $tool $stage $shape $causal $backward (exit $rc): $summary"
          grep -m5 -E "Invalid|Race|Uninitialized|Barrier|error" <<<"$log" | sed 's/^/    /'
        else
          echo "clean   $tool $stage $shape $causal $backward: $summary"
        fi
      done
    done
  done
done
echo "sanitize: $runs runs, $bad with findings"
[ $bad -eq 0 ]
