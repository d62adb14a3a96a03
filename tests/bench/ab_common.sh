# shellcheck shell=bash
# What ab_pair.sh and ab_trees.sh share, sourced by both from the repository
# root: the check of the stage folder and the kind, the tree copy, the
# build of one stage's CLI and a side's run in a round. Each refusal is one line on stderr and exit 2,
# named after the caller ($who).

# ab_script FOLDER KIND: sets script (the timing script for KIND) and extra
# (its flags): forward times the entries STAGES names (a sweep.py --stage
# selector, default the folder's headline entry); backward and decode time
# every entry of the stage without SDPA.
ab_script() {
  [ -d "stages/$1" ] || { echo "$who: no stage folder stages/$1" >&2; exit 2; }
  case "$2" in
    forward) script=tests/bench/sweep.py; extra=(--stage "${STAGES:-${1%%_*}}") ;;
    backward) script=tests/bench/backward16.py; extra=(--no-peers) ;;
    decode) script=tests/bench/decode.py; extra=(--no-peers) ;;
    *) echo "$who: the kind is forward, backward or decode, not '$2'" >&2; exit 2 ;;
  esac
}

# ab_copy_tree DEST: this tree's sources, what a build reads, into DEST.
ab_copy_tree() {
  cp -r stages tests cmake docs notebooks CMakeLists.txt CMakePresets.json "$1"/
}

# ab_build TREE BUILD_DIR FOLDER NAME JOBS: stage FOLDER alone, the CLI only
# (and test_gpu with GPU_TESTS=1), in TREE/BUILD_DIR, on JOBS cores; the logs
# as $logs/{configure,build}_NAME.log.
ab_build() {
  local tests=OFF targets=(flashstep)
  if [ "${GPU_TESTS:-0}" = 1 ]; then tests=ON targets+=(test_gpu); fi
  (cd "$1" && cmake -S . -B "$2" -G Ninja -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES:-90}" \
     -DFLASHSTEP_STAGES_ONLY="$3" -DFLASHSTEP_BUILD_TESTS="$tests" -DFLASHSTEP_WERROR=ON \
     >"$logs/configure_$4.log" 2>&1 \
   && cmake --build "$2" --target "${targets[@]}" -j "$5" >"$logs/build_$4.log" 2>&1)
}

# ab_cli ROUND EXE: the CLI a round runs. The first round checks every point
# against the fp64 reference, as the timing scripts always do; later rounds
# only time (a wrapper that adds --no-check, in $logs): the check of a
# backward at N = 4096 took 40-50 s a point on the host, and the first GPU
# run of ab_trees.sh lost its second round to it.
ab_cli() {
  if [ "$1" -le 1 ]; then echo "$2"; return; fi
  local wrapper
  wrapper="$logs/unchecked_$(echo "$2" | md5sum | cut -c1-8)"
  printf '#!/bin/sh\nexec "%s" "$@" --no-check\n' "$2" >"$wrapper"
  chmod +x "$wrapper"
  echo "$wrapper"
}

# ab_run SIDE ROUND CLI [flags...]: the timing script ($script, $extra) on
# SIDE's CLI in ROUND of $rounds, its CSV and log as $logs/SIDE_ROUND.csv
# and .log; a failed run is one line, and the rounds go on.
ab_run() {
  local side=$1 round=$2 cli=$3
  shift 3
  echo "$who: round $round of $rounds, $side"
  python3 "$script" --flashstep "$(ab_cli "$round" "$cli")" \
    --out "$logs/${side}_$round.csv" "${extra[@]}" "$@" >"$logs/${side}_$round.log" 2>&1 \
    || echo "$who: the $side run of round $round failed (its log: ${side}_$round.log)"
}
