#!/usr/bin/env bash
# The whole GPU measurement in one command, on a machine with a CUDA device:
# build, then record every CSV in docs/results/ and regenerate what is drawn
# from them.
#
#   bash tests/bench/run_all.sh LOGDIR [STEP ...]
#
# Steps, in order (all of them when none is named):
#   build     cmake --preset default, CUDA architectures from $CUDA_ARCHITECTURES (default 90);
#             the CLI and the bench tools (fma_peak, mma_peak, tile_sweep, causal)
#   device    device.py         -> device.csv   (flashstep info: SM count, clocks, memory, CUDA versions)
#   sweep     sweep.py --dtype fp32 -> forward.csv (the FlashAttention-2 paper's sweep, stages 01-06)
#   sweep16   sweep.py --dtype bf16 --stage 02,03,07, then --dtype fp16 --stage 07_tensor_core
#             --append -> forward16.csv (the same sweep in 16 bits: stage 07's ladder, and
#             stages 02 and 03 as the paper's standard attention and FlashAttention-1)
#   long      sweep.py --long --dtype fp32 -> long.csv (B=1, H=4, N=65536)
#   peers     peers.py          -> peers.csv    (PyTorch SDPA, fp32 and 16-bit; skipped without
#             torch + CUDA)
#   traffic   traffic.py        -> traffic.csv  (ncu, every stage in its own type; skipped without
#             ncu, kept old if no counters)
#   backward  backward.py       -> backward.csv, backward_memory.csv, backward_determinism.csv
#             (stages 02 and 05 with SDPA's fp32 backwards when torch is there), then
#             traffic.py --backward -> backward_traffic.csv (ncu, N = 4096)
#   backward16 backward16.py    -> backward16.csv (stage 07's bf16 backwards, atomic and
#             deterministic dQ, with SDPA's flash, cuDNN and math bf16 backwards when torch is
#             there; backward and forward + backward)
#   ceilings  ceilings.py       -> ceilings.csv (copy bandwidth, fp32 GEMM and FMA peak; bf16
#             GEMM and mma.sync peak; skipped without torch)
#   tiles     tiles.py          -> tiles.csv    (stage 07 at other tile shapes, d = 64/128/256)
#   causal    causal.py         -> causal.csv   (stages 03-06 with tile skipping, then
#             diagonal-only masking, switched off in turn; d = 64/128, N = 512..16k)
#   splitq    split_q_profile.py -> split_q_profile.csv (ncu on stage 05 and 06 split-Q at
#             N = 4096, d = 64: why split-Q is slower there; skipped without ncu)
#   ablation  ablation.py       -> ablation.csv (ncu on each step of stage 07's ladder and on
#             FlashAttention-2's kernel; skipped without ncu, kept old if no counters)
#   sweep08   sweep.py --dtype bf16 --stage 07_tensor_core,08, then --dtype fp16 --stage
#             08_hopper --append -> forward08.csv (stage 08's ladder beside stage 07; needs a
#             Hopper GPU, elsewhere every stage 08 row says unavailable; the rows are added
#             to those already recorded, so SWEEP_ARGS="--d 64", then "--d 128", split it
#             into calls)
#   ablation08 ablation.py --hopper -> ablation08.csv (ncu on 07_tensor_core and each step of
#             stage 08's ladder, with the wgmma pipe's activity; skipped without ncu)
#   ablation16 ablation.py --backward -> ablation16.csv (ncu on each kernel of stage 07's two
#             bf16 backwards and of FlashAttention-2's, with the atomics' L2 reductions and the
#             spills' local traffic; N = 4096, d = 64/128; skipped without ncu, kept old if no
#             counters)
#   decode    decode.py         -> decode.csv   (stage 09 and its one-block contrast on decoding
#             problems, H = 32 with H_kv 32/8/1, Nq 1 and 4, Nk 1k..512k, B 1..64, d = 128,
#             beside PyTorch SDPA with enable_gqa when torch + CUDA are there; DECODE_ARGS
#             picks points, e.g. "--Nq 1")
#   gqa       gqa_prefill.py    -> gqa_prefill.csv (prefill, Nq = Nk, at H_kv = H, H/4 and 1 on
#             the stages with grouped heads: 04-06 and 09 in fp32, 07_tensor_core in bf16; the
#             paper's shapes at N = 1k/4k/16k, d = 64/128, causal and not; GQA_ARGS picks
#             points, e.g. "--N 16384 --d 128"; the rows are added to those already recorded)
#   ring      ring.py           -> ring.csv     (stage 10 on every visible GPU, needs 2 or more:
#             weak and strong scaling, the longest N, the overlap switched off; RING_ARGS
#             picks parts, e.g. "--parts weak"; the rows are added to those already recorded)
#   tables    tables.py         -> the README tables
#   plots     plots.py          -> docs/results/plots/ (skipped without matplotlib)
#
# Each step logs to LOGDIR/NN_step.log and prints one progress line; a CSV
# replaces the one in docs/results/ only when its script wrote it. At the end
# LOGDIR/results.tar.gz holds docs/results/*.csv and the plots, and
# LOGDIR/logs.tar.gz the logs: on a lent GPU, copy both to $OUT; here,
# `tar xzf results.tar.gz` in the repository root, then tables.py and plots.py. The exit status is
# non-zero when a step failed; the other steps still run.
#
# On the H200 the whole run takes well over ten minutes (the long point alone
# about five). Where one command may run ten minutes at most, split it into
# calls; each starts with build (about a minute on a fresh machine, nothing on
# a warm one). The times are estimates from the recorded CSVs (GPU time, plus
# the fp64 checks and input draws on the host, plus ncu's replays), not
# measurements of the calls:
#   bash tests/bench/run_all.sh /tmp/a build device sweep peers ceilings   # ~6 min
#   bash tests/bench/run_all.sh /tmp/b build sweep16 tiles                 # ~6-7 min
#   bash tests/bench/run_all.sh /tmp/c build ablation long                 # ~8 min
#   bash tests/bench/run_all.sh /tmp/d build traffic                       # ~5-8 min
#   bash tests/bench/run_all.sh /tmp/e build backward                      # see its log
#   bash tests/bench/run_all.sh /tmp/g build backward16                    # not timed yet
#   bash tests/bench/run_all.sh /tmp/f build causal splitq                 # ~6 min
#   DECODE_ARGS="--Nq 1 --dtype bf16" bash tests/bench/run_all.sh /tmp/h build decode  # ~5 min
#   (then --Nq 4 --dtype bf16; --dtype fp32 --Nq 1 (or 4) with --H-kv 1, then 8 32: ~1-2 min
#   each; each adds its rows)
#   SWEEP_ARGS="--d 64" bash tests/bench/run_all.sh /tmp/i build sweep08   # not timed yet
#   (then SWEEP_ARGS="--d 128"; each adds its rows to forward08.csv), then build ablation08
#   bash tests/bench/run_all.sh /tmp/j build gqa tables    # ~4 min
#   bash tests/bench/run_all.sh /tmp/k build ablation16                    # ~1 min
# then tables and plots (no GPU needed: here, after unpacking the results).
# When only stage 07 changed: /tmp/b, then `build peers ceilings ablation`
# (~5 min; peers and ceilings rerun their fp32 rows too, in the same run).
#
# Environment: CUDA_ARCHITECTURES (90), BUILD_DIR (build), PYTHON (python3),
# FLASHSTEP_COMMIT (default: git rev-parse HEAD; the scripts record it; on a lent
#   device, whose copy of the repository can carry the HEAD of an older call, pass
#   the commit from your own checkout: FLASHSTEP_COMMIT=<git rev-parse HEAD here>),
# SWEEP_ARGS (extra flags for sweep.py, both sweep steps, and peers.py, e.g. "--N 1024 --d 64"),
# TRAFFIC_ARGS (extra flags for traffic.py, e.g. "--N 8192 --d 64"),
# TILES_ARGS (flags for flashstep_tile_sweep, e.g. "--d 128 --N 4096"),
# CAUSAL_ARGS (flags for flashstep_causal, e.g. "--d 64 --N 4096"),
# ABLATION_ARGS (extra flags for ablation.py, e.g. "--d 64"),
# RING_ARGS (flags for ring.py, e.g. "--parts strong long contrast"),
# DECODE_ARGS (flags for decode.py, e.g. "--Nq 1 --dtype fp32": the decode sweep in several calls),
# GQA_ARGS (extra flags for gqa_prefill.py, e.g. "--N 1024 --d 64").
set -uo pipefail
all_steps=(build device sweep sweep16 long peers traffic backward backward16 ceilings tiles causal
           splitq ablation sweep08 ablation08 ablation16 decode gqa ring tables plots)
log=${1:?usage: bash tests/bench/run_all.sh LOGDIR [${all_steps[*]}]}
shift
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=("${all_steps[@]}")

mkdir -p "$log" && log=$(cd "$log" && pwd) || exit 1
cd "$(dirname "$0")/../.." || exit 1
export PATH="$PATH:/usr/local/cuda/bin"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
build=${BUILD_DIR:-build}
archs=${CUDA_ARCHITECTURES:-90}
exe="$build/stages/cli/flashstep"
results=docs/results
read -r -a sweep_args <<<"${SWEEP_ARGS:-}"
read -r -a traffic_args <<<"${TRAFFIC_ARGS:-}"
read -r -a tiles_args <<<"${TILES_ARGS:-}"
read -r -a causal_args <<<"${CAUSAL_ARGS:-}"
read -r -a ablation_args <<<"${ABLATION_ARGS:-}"
read -r -a ring_args <<<"${RING_ARGS:-}"
read -r -a decode_args <<<"${DECODE_ARGS:-}"
read -r -a gqa_args <<<"${GQA_ARGS:-}"
if [ -z "${FLASHSTEP_COMMIT:-}" ]; then
  FLASHSTEP_COMMIT=$(git rev-parse HEAD 2>/dev/null || echo unknown)
  if [ "$FLASHSTEP_COMMIT" != unknown ] && ! git diff --quiet HEAD -- 2>/dev/null; then
    echo "run_all: warning: the working tree differs from $FLASHSTEP_COMMIT; the CSVs will name that commit"
  fi
fi
export FLASHSTEP_COMMIT

failed=()
n=0
t_all=$SECONDS
say() { echo "run_all: [$(date +%H:%M:%S)] $*"; }

# step NAME COMMAND...: runs COMMAND with its output in LOGDIR/NN_NAME.log.
step() {
  local name=$1; shift
  local file; file=$(printf '%s/%02d_%s.log' "$log" "$n" "$name")
  local t0=$SECONDS
  say "$name: $*"
  "$@" >"$file" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then
    say "$name: ok ($((SECONDS - t0)) s)"
  else
    say "$name: FAILED, exit $rc ($((SECONDS - t0)) s); last lines of $file:"
    tail -n 5 "$file" | sed 's/^/    /'
    failed+=("$name")
  fi
  return $rc
}

# has_counters CSV COLUMN: whether some row of an ncu CSV has COLUMN filled
# (the scripts write a row per run even when ncu reads no counters; such a
# file must not replace a measured one).
has_counters() {
  [ -s "$1" ] && "$py" -c '
import csv, sys
sys.exit(0 if any(r[sys.argv[2]] for r in csv.DictReader(open(sys.argv[1]))) else 1)' "$1" "$2"
}

# record NAME CSV: moves a freshly written CSV from LOGDIR into docs/results/.
record() {
  if [ -s "$log/$2" ]; then
    cp "$log/$2" "$results/$2" && say "$1: wrote $results/$2"
  else
    say "$1: no $2 written; $results/$2 left as it was"
  fi
}

have_torch() {
  "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1
}

say "commit $FLASHSTEP_COMMIT; steps: ${steps[*]}; logs in $log"
for s in "${steps[@]}"; do
  n=$((n + 1))
  case $s in
    build)
      step configure cmake --preset default -B "$build" -DCMAKE_CUDA_ARCHITECTURES="$archs" \
        && step build cmake --build "$build" --target flashstep flashstep_fma_peak \
          flashstep_mma_peak flashstep_tile_sweep flashstep_causal
      ;;
    sweep)
      step sweep "$py" tests/bench/sweep.py --flashstep "$exe" --dtype fp32 \
        --out "$log/forward.csv" "${sweep_args[@]}"
      record sweep forward.csv
      ;;
    sweep16)
      # Both types into one CSV: bf16 for everything that runs in it, then the
      # stage's fp16 beside it (the other stages' fp16 would add only time).
      step sweep16 "$py" tests/bench/sweep.py --flashstep "$exe" --dtype bf16 --stage 02,03,07 \
        --out "$log/forward16.csv" "${sweep_args[@]}"
      step sweep16_fp16 "$py" tests/bench/sweep.py --flashstep "$exe" --dtype fp16 \
        --stage 07_tensor_core --append --out "$log/forward16.csv" "${sweep_args[@]}"
      record sweep16 forward16.csv
      ;;
    long)
      step long "$py" tests/bench/sweep.py --flashstep "$exe" --long --dtype fp32 \
        --out "$log/long.csv"
      record long long.csv
      ;;
    peers)
      if have_torch; then
        step peers "$py" tests/bench/peers.py --out "$log/peers.csv" "${sweep_args[@]}"
        record peers peers.csv
      else
        say "peers: skipped, no PyTorch with CUDA for $py; $results/peers.csv left as it was"
      fi
      ;;
    traffic)
      if ! command -v ncu >/dev/null; then
        say "traffic: skipped, no ncu on PATH; $results/traffic.csv left as it was"
        continue
      fi
      step traffic "$py" tests/bench/traffic.py --flashstep "$exe" --out "$log/traffic.csv" \
        "${traffic_args[@]}"
      if has_counters "$log/traffic.csv" dram_read; then
        record traffic traffic.csv
      else
        say "traffic: skipped, ncu read no counters here (see $log/traffic.csv); $results/traffic.csv left as it was"
      fi
      ;;
    backward)
      peers_flag=()
      have_torch || peers_flag=(--no-peers)
      step backward "$py" tests/bench/backward.py --flashstep "$exe" --out "$log/backward.csv" \
        --memory-out "$log/backward_memory.csv" \
        --determinism-out "$log/backward_determinism.csv" --workdir "$log/npy" \
        "${sweep_args[@]}" "${peers_flag[@]}"
      rm -rf "$log/npy"
      for f in backward.csv backward_memory.csv backward_determinism.csv; do record backward "$f"; done
      if command -v ncu >/dev/null; then
        step backward_traffic "$py" tests/bench/traffic.py --flashstep "$exe" --backward \
          --N 4096 --out "$log/backward_traffic.csv"
        record backward_traffic backward_traffic.csv
      fi
      ;;
    backward16)
      peers_flag=()
      have_torch || peers_flag=(--no-peers)
      step backward16 "$py" tests/bench/backward16.py --flashstep "$exe" \
        --out "$log/backward16.csv" "${sweep_args[@]}" "${peers_flag[@]}"
      record backward16 backward16.csv
      ;;
    ceilings)
      if have_torch; then
        step ceilings "$py" tests/bench/ceilings.py --out "$log/ceilings.csv" \
          --fma-peak "$build/tests/bench/flashstep_fma_peak" \
          --mma-peak "$build/tests/bench/flashstep_mma_peak"
        record ceilings ceilings.csv
      else
        say "ceilings: skipped, no PyTorch with CUDA for $py; $results/ceilings.csv left as it was"
      fi
      ;;
    tiles)
      step tiles "$py" tests/bench/tiles.py --out "$log/tiles.csv" \
        --tile-sweep "$build/tests/bench/flashstep_tile_sweep" -- "${tiles_args[@]}"
      record tiles tiles.csv
      ;;
    causal)
      step causal "$py" tests/bench/causal.py --out "$log/causal.csv" \
        --causal "$build/tests/bench/flashstep_causal" -- "${causal_args[@]}"
      record causal causal.csv
      ;;
    splitq)
      if ! command -v ncu >/dev/null; then
        say "splitq: skipped, no ncu on PATH; $results/split_q_profile.csv left as it was"
        continue
      fi
      step splitq "$py" tests/bench/split_q_profile.py --flashstep "$exe" \
        --out "$log/split_q_profile.csv"
      if has_counters "$log/split_q_profile.csv" duration_ns; then
        record splitq split_q_profile.csv
      else
        say "splitq: skipped, ncu read no counters here (see $log/split_q_profile.csv); $results/split_q_profile.csv left as it was"
      fi
      ;;
    ablation)
      if ! command -v ncu >/dev/null; then
        say "ablation: skipped, no ncu on PATH; $results/ablation.csv left as it was"
        continue
      fi
      peer_flag=()
      have_torch || peer_flag=(--no-peer)
      step ablation "$py" tests/bench/ablation.py --flashstep "$exe" --out "$log/ablation.csv" \
        --python "$py" "${peer_flag[@]}" "${ablation_args[@]}"
      if has_counters "$log/ablation.csv" duration_ns; then
        record ablation ablation.csv
      else
        say "ablation: skipped, ncu read no counters here (see $log/ablation.csv); $results/ablation.csv left as it was"
      fi
      ;;
    sweep08)
      # Stage 08's ladder beside stage 07 on the paper's sweep, bf16, then
      # the stage in fp16: the comparison issue 14 asks for (>= 1.6x stage 07).
      # Rows add to those already recorded, so SWEEP_ARGS can split the sweep into calls.
      [ -s "$results/forward08.csv" ] && cp "$results/forward08.csv" "$log/forward08.csv"
      step sweep08 "$py" tests/bench/sweep.py --flashstep "$exe" --dtype bf16 \
        --stage 07_tensor_core,08 --append --out "$log/forward08.csv" "${sweep_args[@]}"
      step sweep08_fp16 "$py" tests/bench/sweep.py --flashstep "$exe" --dtype fp16 \
        --stage 08_hopper --append --out "$log/forward08.csv" "${sweep_args[@]}"
      record sweep08 forward08.csv
      ;;
    ablation08)
      if ! command -v ncu >/dev/null; then
        say "ablation08: skipped, no ncu on PATH; $results/ablation08.csv left as it was"
        continue
      fi
      step ablation08 "$py" tests/bench/ablation.py --hopper --flashstep "$exe" \
        --out "$log/ablation08.csv" "${ablation_args[@]}"
      if has_counters "$log/ablation08.csv" duration_ns; then
        record ablation08 ablation08.csv
      else
        say "ablation08: skipped, ncu read no counters here (see $log/ablation08.csv); $results/ablation08.csv left as it was"
      fi
      ;;
    ablation16)
      if ! command -v ncu >/dev/null; then
        say "ablation16: skipped, no ncu on PATH; $results/ablation16.csv left as it was"
        continue
      fi
      peer_flag=()
      have_torch || peer_flag=(--no-peer)
      step ablation16 "$py" tests/bench/ablation.py --backward --flashstep "$exe" \
        --out "$log/ablation16.csv" --python "$py" "${peer_flag[@]}" "${ablation_args[@]}"
      if has_counters "$log/ablation16.csv" duration_ns; then
        record ablation16 ablation16.csv
      else
        say "ablation16: skipped, ncu read no counters here (see $log/ablation16.csv); $results/ablation16.csv left as it was"
      fi
      ;;
    decode)
      peers_flag=()
      have_torch || peers_flag=(--no-peers)
      # Rows add to those already recorded, so DECODE_ARGS can split the sweep into calls.
      [ -s "$results/decode.csv" ] && cp "$results/decode.csv" "$log/decode.csv"
      step decode "$py" tests/bench/decode.py --flashstep "$exe" --append --out "$log/decode.csv" \
        "${peers_flag[@]}" "${decode_args[@]}"
      record decode decode.csv
      ;;
    gqa)
      # Rows add to those already recorded, so GQA_ARGS can split the sweep into calls.
      [ -s "$results/gqa_prefill.csv" ] && cp "$results/gqa_prefill.csv" "$log/gqa_prefill.csv"
      step gqa "$py" tests/bench/gqa_prefill.py --flashstep "$exe" --append \
        --out "$log/gqa_prefill.csv" "${gqa_args[@]}"
      record gqa gqa_prefill.csv
      ;;
    ring)
      if [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')" -lt 2 ]; then
        say "ring: skipped, fewer than 2 GPUs; $results/ring.csv left as it was"
        continue
      fi
      [ -s "$results/ring.csv" ] && cp "$results/ring.csv" "$log/ring.csv"
      step build_ring cmake --build "$build" --target flashstep_ring \
        && step ring "$py" tests/bench/ring.py --flashstep-ring "$build/stages/10_ring/flashstep_ring" \
          --append --out "$log/ring.csv" "${ring_args[@]}"
      record ring ring.csv
      ;;
    device)
      step device "$py" tests/bench/device.py --flashstep "$exe" --out "$log/device.csv"
      record device device.csv
      ;;
    tables)
      step tables "$py" tests/bench/tables.py
      ;;
    plots)
      if "$py" -c 'import matplotlib' >/dev/null 2>&1; then
        step plots "$py" tests/bench/plots.py
      else
        say "plots: skipped, no matplotlib for $py (Debian: python3-matplotlib)"
      fi
      ;;
    *)
      say "unknown step '$s' (${all_steps[*]})"
      failed+=("$s")
      ;;
  esac
done

# What was measured, in two files: the results (paths from the repository
# root) and the logs.
packed=("$results"/*.csv)
[ -d "$results/plots" ] && packed+=("$results/plots")
tar czf "$log/results.tar.gz" "${packed[@]}"
(cd "$log" && tar czf logs.tar.gz -- *.log)
say "done in $((SECONDS - t_all)) s; $log/results.tar.gz (CSVs, plots), $log/logs.tar.gz"
if [ ${#failed[@]} -gt 0 ]; then
  say "failed: ${failed[*]}"
  exit 1
fi
