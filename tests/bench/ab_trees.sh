#!/usr/bin/env bash
# An A/B of several variants on a GPU machine, in one call: this tree ("base")
# and one tree per patch (this tree with NAME's patch applied), each built for
# one stage only and timed in turn, ROUNDS times (default 2), on the same
# problems; then one table of the best median of each tree and each variant
# ÷ base. ab_pair.sh is the two-tree form (a patch reversed); this one times a
# helper's commits side by side, each its own patch against the same base.
#
# The lent machine gets the working tree without .git, so the patches are made
# beforehand where git is, one per variant, each against this tree:
#   git diff HEAD COMMIT_1 -- stages/ > b1.patch; git diff HEAD COMMIT_2 -- stages/ > b2.patch
#   bash tests/bench/ab_trees.sh STAGE_FOLDER forward|backward|decode b1=b1.patch b2=b2.patch [-- flags...]
# e.g. bash tests/bench/ab_trees.sh 09_split_kv decode b1=b1.patch b2=b2.patch -- --Nk 1024 --H-kv 1
#
# The kinds time what ab_pair.sh's do (ab_common.sh, ab_script). Every
# point is checked against the fp64 reference in the first round, as the
# scripts always do (the table's last column); later rounds only time
# (ab_cli). Builds run one after the other on all cores (a stage 07 tree
# took about 30 s on the H200 machine's 16); a first round of stage 07's
# backward at N 4096 and 16384, d 128, causal and not took 108 s a tree;
# plan the points so that trees x rounds fit the call, and
# keep a name's characters to letters, digits, _ and -. The CSVs
# and the build logs go, as one archive, to $OUT/ab_trees.tar.gz (or
# ./ab-trees-logs), refreshed after each round.
# With GPU_TESTS=1 each tree also builds test_gpu, and after the table every
# tree runs `test_gpu --stage=NN` (the folder's number), its doctest summary
# lines printed under the tree's name and its log in the archive: a variant
# is then timed and tested in one call (a stage's test_gpu build and run
# take longer than its CLI's: plan the call's time for it).
set -uo pipefail
usage="usage: bash tests/bench/ab_trees.sh STAGE_FOLDER forward|backward|decode NAME=PATCH... [-- flags...]"
folder=${1:?$usage}
kind=${2:?$usage}
shift 2
cd "$(dirname "$0")/../.." || exit 1
root=$PWD
who=ab_trees
source tests/bench/ab_common.sh
ab_script "$folder" "$kind"
case "${GPU_TESTS:-0}" in
  0 | 1) ;;
  *) echo "ab_trees: GPU_TESTS is 0 or 1, not '$GPU_TESTS'" >&2; exit 2 ;;
esac
names=() patches=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  [[ "$1" == *=?* ]] || { echo "ab_trees: a variant is NAME=PATCH, not '$1'" >&2; exit 2; }
  name=${1%%=*} patch=${1#*=}
  [[ "$name" =~ ^[A-Za-z0-9_-]+$ ]] \
    || { echo "ab_trees: a variant's name is letters, digits, _ or -, not '$name'" >&2; exit 2; }
  [ "$name" != base ] || { echo "ab_trees: 'base' names this tree; call the variant otherwise" >&2; exit 2; }
  case "$patch" in /*) ;; *) patch="$root/$patch" ;; esac
  [ -f "$patch" ] || { echo "ab_trees: no patch file $patch (variant $name)" >&2; exit 2; }
  names+=("$name") patches+=("$patch")
  shift
done
[ ${#names[@]} -gt 0 ] || { echo "ab_trees: no variant given; $usage" >&2; exit 2; }
[ $# -gt 0 ] && shift  # the --
export PATH="$PATH:/usr/local/cuda/bin" PYTHONUNBUFFERED=1
out=${OUT:-ab-trees-logs}
mkdir -p "$out"
logs=$(mktemp -d)
trees=$(mktemp -d)
for i in "${!names[@]}"; do
  tree="$trees/${names[$i]}"
  mkdir -p "$tree"
  ab_copy_tree "$tree" || exit 1
  (cd "$tree" && patch -s -p1 <"${patches[$i]}") \
    || { echo "ab_trees: ${patches[$i]} does not apply onto this tree" >&2; exit 2; }
done
tree_of() { if [ "$1" = base ]; then echo "$root"; else echo "$trees/$1"; fi; }
for side in base "${names[@]}"; do  # the stage alone, the CLI only
  tree=$(tree_of "$side")
  echo "ab_trees: building $side"
  ab_build "$tree" build-trees "$folder" "$side" "$(nproc)" \
    || { echo "ab_trees: the $side build failed:"; grep -E "error|FAILED" "$logs/build_$side.log" | head -10
         tar czf "$out/ab_trees.tar.gz" -C "$logs" .; exit 1; }
done
rounds=${ROUNDS:-2}
for round in $(seq "$rounds"); do
  for side in base "${names[@]}"; do
    tree=$(tree_of "$side")
    ab_run "$side" "$round" "$tree/build-trees/stages/cli/flashstep" "$@"
  done
  tar czf "$out/ab_trees.tar.gz" -C "$logs" .  # each round kept, should a time limit stop the next
done
python3 tests/bench/ab_pair_table.py "$logs" base "${names[@]}"
status=$?
if [ "${GPU_TESTS:-0}" = 1 ]; then  # after the timing, so that no test runs beside it
  for side in base "${names[@]}"; do
    tree=$(tree_of "$side")
    "$tree/build-trees/tests/test_gpu" --stage="${folder%%_*}" >"$logs/test_gpu_$side.log" 2>&1 \
      || status=1
    echo "ab_trees: test_gpu --stage=${folder%%_*}, $side:"
    grep -E "^\[doctest\] (test cases|assertions)" "$logs/test_gpu_$side.log" \
      || { echo "  no summary (its log: test_gpu_$side.log)"; status=1; }
  done
fi
tar czf "$out/ab_trees.tar.gz" -C "$logs" .
rm -rf "$trees"
exit $status
