#!/usr/bin/env bash
# Stage 08 (08_hopper) beside PyTorch SDPA's cuDNN kernel under Nsight Compute,
# bf16, d = 128, non-causal, at N = 2048 (where cuDNN leads by 3 %) and 16384
# (level): duration, grid and block, registers, shared memory, occupancy, and
# the tensor pipe's active share (the hmma counter sees wgmma: ablation.py).
# One profiled launch each, clocks as they are. Run from the repository root
# on the lent H200 with stage 08 built in build-g:
#   bash docs/results/tuning_08/cudnn_profile.sh build-g OUTDIR
set -uo pipefail
build=${1:?usage: cudnn_profile.sh BUILD_DIR OUTDIR}
out=${2:?usage: cudnn_profile.sh BUILD_DIR OUTDIR}
mkdir -p "$out"
metrics=gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread
metrics+=,launch__shared_mem_per_block_dynamic,launch__occupancy_limit_shared_mem
metrics+=,sm__warps_active.avg.pct_of_peak_sustained_active
metrics+=,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
metrics+=,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum
for N in 2048 16384; do
  B=$((16384 / N)) H=16
  ncu --clock-control none -k regex:hopper_ws_kernel -c 1 --metrics "$metrics" \
    "$build/stages/cli/flashstep" --stage 08_hopper --dtype bf16 --B "$B" --H "$H" --N "$N" \
    --d 128 --iters 0 --no-check > "$out/ncu_08_hopper_N$N.txt" 2>&1
  echo "08_hopper N=$N: exit $?"
  ncu --clock-control none -k 'regex:(?i)(sdpa|fmha|flash|attn)' -c 1 --metrics "$metrics" \
    python3 -c "
import torch
from torch.nn.attention import sdpa_kernel, SDPBackend
q, k, v = (torch.randn($B, $H, $N, 128, device='cuda', dtype=torch.bfloat16) for _ in range(3))
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    torch.nn.functional.scaled_dot_product_attention(q, k, v)
torch.cuda.synchronize()" > "$out/ncu_cudnn_N$N.txt" 2>&1
  echo "cuDNN N=$N: exit $?"
done
for f in "$out"/ncu_*.txt; do
  echo "== $(basename "$f")"
  grep -E "^\s+[a-z_]+__[a-z_.]+|^  [A-Za-z_].*\(|Section" "$f" | sed 's/  */ /g' | head -16
done
