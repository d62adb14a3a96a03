#!/usr/bin/env bash
# A paired A/B on a GPU machine, in one call: this tree ("new") against the
# same tree with a patch reversed ("old"), both built for one stage only and
# timed in turn, ROUNDS times (default 2), on the same problems; then one
# table of the best median of each side and new ÷ old. Timings from two
# calls (two machines, two warm-ups) differ by a few percent on their own;
# in one call they differ by the change.
#
# The lent machine gets the working tree without .git, so the patch is made
# beforehand where git is:
#   git diff BASE HEAD -- stages/ > ab.patch        (BASE: the code to beat)
#   bash tests/bench/ab_pair.sh ab.patch STAGE_FOLDER forward  [sweep.py flags...]
#   bash tests/bench/ab_pair.sh ab.patch STAGE_FOLDER backward [backward16.py flags...]
#   bash tests/bench/ab_pair.sh ab.patch STAGE_FOLDER decode   [decode.py flags...]
# e.g. bash tests/bench/ab_pair.sh ab.patch 08_hopper forward --N 2048 16384 --d 64 128 --causal both
#
# forward times the stage's entries named by STAGES (a sweep.py --stage
# selector, default the folder's headline entry); backward and decode time
# every entry of the stage without SDPA. Every point is checked against the
# fp64 reference in the first round, as the scripts always do (the table's
# last column); later rounds only time (ab_cli). A backward A/B is slow:
# the first round of 4 points at N = 4096 and 16384 took 108 s a tree on
# the H200 machine, the checks at N = 4096 most of it; plan the
# rounds and points so that they fit the call. The
# CSVs and the build logs go, as one archive, to $OUT/ab_pair.tar.gz (or
# ./ab-pair-logs).
set -uo pipefail
patch_file=${1:?usage: bash tests/bench/ab_pair.sh PATCH STAGE_FOLDER forward|backward|decode [flags...]}
folder=${2:?usage: bash tests/bench/ab_pair.sh PATCH STAGE_FOLDER forward|backward|decode [flags...]}
kind=${3:?usage: bash tests/bench/ab_pair.sh PATCH STAGE_FOLDER forward|backward|decode [flags...]}
shift 3
cd "$(dirname "$0")/../.." || exit 1
root=$PWD
case "$patch_file" in /*) ;; *) patch_file="$root/$patch_file" ;; esac
[ -f "$patch_file" ] || { echo "ab_pair: no patch file $patch_file" >&2; exit 2; }
who=ab_pair
source tests/bench/ab_common.sh
ab_script "$folder" "$kind"
export PATH="$PATH:/usr/local/cuda/bin" PYTHONUNBUFFERED=1
out=${OUT:-ab-pair-logs}
mkdir -p "$out"
logs=$(mktemp -d)
old=$(mktemp -d)
ab_copy_tree "$old" || exit 1
(cd "$old" && patch -s -R -p1 <"$patch_file") \
  || { echo "ab_pair: $patch_file does not reverse onto this tree" >&2; exit 2; }
cores=$(( $(nproc) / 2 ))
ab_build "$root" build-pair "$folder" new "$cores" & ab_build "$old" build-pair "$folder" old "$cores" & wait
for side in new old; do
  tree=$root; [ $side = old ] && tree=$old
  [ -x "$tree/build-pair/stages/cli/flashstep" ] \
    || { echo "ab_pair: the $side build failed:"; grep -E "error|FAILED" "$logs/build_$side.log" | head -10
         tar czf "$out/ab_pair.tar.gz" -C "$logs" .; exit 1; }
done
rounds=${ROUNDS:-2}
for round in $(seq "$rounds"); do
  for side in new old; do
    tree=$root; [ $side = old ] && tree=$old
    ab_run "$side" "$round" "$tree/build-pair/stages/cli/flashstep" "$@"
  done
  tar czf "$out/ab_pair.tar.gz" -C "$logs" .  # each round kept, should a time limit stop the next
done
python3 tests/bench/ab_pair_table.py "$logs"
status=$?
tar czf "$out/ab_pair.tar.gz" -C "$logs" .
rm -rf "$old"
exit $status
