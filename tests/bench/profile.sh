#!/usr/bin/env bash
# Nsight Compute profiles that explain stage 06's speed against its peer:
# stage 05, stage 06 split-Q and PyTorch SDPA's memory-efficient fp32 kernel
# (TF32 off) on one paper-settings problem per head dimension, with the
# sections that say where the cycles go (throughput, warp stalls, occupancy,
# instruction mix). One text report per (kernel, d) in OUTDIR.
# With "backward" last: stage 05's backward kernel against SDPA's
# memory-efficient fp32 backward kernel instead.
#   bash tests/bench/profile.sh BUILD_DIR OUTDIR [N] [backward]
set -uo pipefail
build=${1:?usage: tests/bench/profile.sh BUILD_DIR OUTDIR [N] [backward]}
out=${2:?usage: tests/bench/profile.sh BUILD_DIR OUTDIR [N] [backward]}
N=${3:-4096}
mode=${4:-forward}
mkdir -p "$out"
sections=(--section SpeedOfLight --section Occupancy --section LaunchStats
          --section WarpStateStats --section SchedulerStats --section InstructionStats
          --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis)
if [ "$mode" = backward ]; then
  for d in 64 128; do
    B=$((16384 / N)); H=$((2048 / d))
    ncu --clock-control none -k regex:backward_kernel -c 1 "${sections[@]}" \
      "$build/stages/cli/flashstep" --stage 05 --backward --B "$B" --H "$H" --N "$N" --d "$d" \
      --iters 0 --no-check > "$out/profile_05_backward_d${d}.txt" 2>&1
    echo "profile: 05 backward d=$d: exit $?"
    ncu --clock-control none -k regex:cutlassB -c 1 "${sections[@]}" python3 -c "
import torch
from torch.nn.attention import sdpa_kernel, SDPBackend
torch.backends.cuda.matmul.allow_tf32 = False
q, k, v = (torch.randn($B, $H, $N, $d, device='cuda').add_(0.5).requires_grad_() for _ in range(3))
with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    o.backward(torch.randn_like(o))
torch.cuda.synchronize()" > "$out/profile_sdpa_efficient_fp32_backward_d${d}.txt" 2>&1
    echo "profile: sdpa_efficient_fp32 backward d=$d: exit $?"
  done
  exit 0
fi
for d in 64 128; do
  B=$((16384 / N)); H=$((2048 / d))
  for stage in 05_sequence_parallel 06_warp_split_q; do
    ncu --clock-control none -c 1 "${sections[@]}" "$build/stages/cli/flashstep" \
      --stage "$stage" --B "$B" --H "$H" --N "$N" --d "$d" --iters 0 --no-check \
      > "$out/profile_${stage}_d${d}.txt" 2>&1
    echo "profile: $stage d=$d: exit $?"
  done
  ncu --clock-control none -k regex:fmha -c 1 "${sections[@]}" python3 -c "
import torch
from torch.nn.attention import sdpa_kernel, SDPBackend
torch.backends.cuda.matmul.allow_tf32 = False
q, k, v = (torch.randn($B, $H, $N, $d, device='cuda') + 0.5 for _ in range(3))
with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
    torch.nn.functional.scaled_dot_product_attention(q, k, v)
torch.cuda.synchronize()" > "$out/profile_sdpa_efficient_fp32_d${d}.txt" 2>&1
  echo "profile: sdpa_efficient_fp32 d=$d: exit $?"
done
