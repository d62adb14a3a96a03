# Run 11 (tuning_09/README.md): the ncu profile behind run11_ncu.txt, as it ran on the H200 from the repository root (bash docs/results/tuning_09/run11_ncu.sh; $OUT a folder for the archive). Its in-script summary failed on the thousands separators of ncu's CSV; run11_ncu.txt was made from the raw CSVs it archived.
#!/usr/bin/env bash
# Session 11, call 2: ncu profile of stage 09's split and merge kernels at the points that miss issue 15's goal.
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin" PYTHONUNBUFFERED=1
t0=$SECONDS
cmake --preset default -DCMAKE_CUDA_ARCHITECTURES=90 -DFLASHSTEP_WERROR=ON \
  "-DFLASHSTEP_STAGES_ONLY=09_split_kv" >/tmp/configure.log 2>&1 || { tail -20 /tmp/configure.log; exit 1; }
cmake --build build -j16 --target flashstep >/tmp/build.log 2>&1 || { grep -E "error|FAILED" /tmp/build.log | head; exit 1; }
echo "build done $((SECONDS-t0)) s"
exe=build/stages/cli/flashstep
mkdir -p /tmp/p
points=(
 "bf16 1 8 1 32768" "bf16 1 1 1 524288" "bf16 1 1 64 32768" "bf16 1 1 1 32768" "bf16 4 1 8 32768"
 "fp32 1 1 8 32768" "fp32 1 8 1 32768" "fp32 4 8 1 32768"
)
sections="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section SchedulerStats --section SourceCounters"
i=0
for pt in "${points[@]}"; do
  read -r dt nq hkv b nk <<<"$pt"
  args="--stage 09_split_kv --dtype $dt --B $b --H 32 --H-kv $hkv --Nq $nq --Nk $nk --d 128"
  i=$((i+1))
  name=$(printf "p%02d_%s_nq%s_hkv%s_b%s_nk%s" $i $dt $nq $hkv $b $nk)
  $exe $args --no-check --iters 30 --format csv > /tmp/p/$name.time.csv 2>&1
  ncu --clock-control none -k regex:"split|merge" -c 2 $sections --import-source no $exe $args --no-check --iters 1 --warmup 0 > /tmp/p/$name.ncu.txt 2>&1
  ncu --clock-control none -k regex:"split|merge" -c 2 --csv --print-units base --page raw --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__registers_per_thread $exe $args --no-check --iters 1 --warmup 0 > /tmp/p/$name.raw.csv 2>&1
  ms=$(python3 -c "import csv,sys; r=list(csv.DictReader(open('/tmp/p/$name.time.csv'))); print(r[0].get('median ms','?'), r[0].get('check','?'))" 2>/dev/null)
  echo "$name median_ms $ms  t=$((SECONDS-t0))"
  python3 - /tmp/p/$name.raw.csv <<'PY'
import csv,sys
lines=open(sys.argv[1]).read().splitlines()
start=[i for i,l in enumerate(lines) if l.startswith('"ID"')]
if not start: print("  (no ncu rows)", lines[-3:]); sys.exit()
rows=list(csv.DictReader(lines[start[0]:]))
for r in rows[1:]:
    k=r['Kernel Name'].split('(')[0].split('<')[0][-22:]
    g=lambda m: r.get(m,'')
    print(f"  {k:22s} us={float(g('gpu__time_duration.sum'))/1000:.1f} dram%={g('dram__throughput.avg.pct_of_peak_sustained_elapsed')} MB={float(g('dram__bytes_read.sum') or 0)/1e6:.1f} grid={g('launch__grid_size')} regs={g('launch__registers_per_thread')} warps%={g('sm__warps_active.avg.pct_of_peak_sustained_active')} issue%={g('smsp__issue_active.avg.pct_of_peak_sustained_active')} hmma%={g('sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active')} fma%={g('sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active')}")
PY
done
tar czf $OUT/prof09.tar.gz -C /tmp p
echo "total $((SECONDS-t0)) s"
