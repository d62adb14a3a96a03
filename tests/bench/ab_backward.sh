#!/usr/bin/env bash
# A/B for stage 07's bf16 backward on a GPU machine, in one call: build,
# stage 07's GPU tests, the backward at a few of the paper's problems beside
# SDPA's flash, cuDNN and math backwards (backward16.py: every result of
# ours checked), then ncu on each backward kernel (ablation.py --backward),
# and the two tables printed last. ab.sh does the same for a forward.
#
#   bash tests/bench/ab_backward.sh [backward16.py problem flags...]
#   bash tests/bench/ab_backward.sh --N 1024 4096 --d 128 --causal no
#
# Without flags: N = 1024, 4096 and 16384, d = 64 and 128, causal and not.
# AB_NCU=0 leaves out the ncu part. CSVs and logs go to $OUT (or ./ab-logs).
# The build is kept in build/ between calls of a warm machine.
set -uo pipefail
source "$(dirname "$0")/ab_build.sh" 07
[ $# -gt 0 ] || set -- --N 1024 4096 16384 --d 64 128 --causal both
python3 tests/bench/backward16.py --flashstep build/stages/cli/flashstep \
  --out "$out/ab_backward.csv" "$@" 2>"$out/ab_backward.log"
bwd_rc=$?
if [ "${AB_NCU:-1}" = 1 ]; then
  python3 tests/bench/ablation.py --backward --flashstep build/stages/cli/flashstep \
    --out "$out/ab_ablation16.csv" --python python3 >"$out/ab_ablation16.log" 2>&1
fi
python3 - "$out/ab_backward.csv" "$out/ab_ablation16.csv" <<'EOF'
import csv, os, sys
short = {"07_tensor_core": "07 atomic", "07_tensor_core_deterministic": "07 determ.",
         "sdpa_flash_bf16": "FA2", "sdpa_cudnn_bf16": "cuDNN", "sdpa_math_bf16": "math"}
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["pass"] == "bwd"] \
    if os.path.exists(sys.argv[1]) else []
if not rows:
    sys.exit(f"ab_backward: no backward rows in {sys.argv[1]} (its log: ab_backward.log)")
problems = sorted({(int(r["d"]), int(r["causal"]), int(r["Nq"])) for r in rows})
stages = list(dict.fromkeys(r["stage"] for r in rows))
cell = {(r["stage"], (int(r["d"]), int(r["causal"]), int(r["Nq"]))):
        r["TFLOP/s"] + ("" if r["check"] in ("ok", "reported", "unchecked") else " " + r["check"])
        for r in rows}
print("backward TFLOP/s (2.5 x 4*B*H*N^2*d, halved if causal; B = 16384/N, H = 2048/d)")
print(" ".join(["problem".ljust(14)] + [short.get(s, s)[:11].rjust(11) for s in stages]))
for p in problems:
    name = f"d{p[0]}{' c' if p[1] else ''} N{p[2]}"
    print(" ".join([name.ljust(14)] + [cell.get((s, p), "-").rjust(11) for s in stages]))
if os.path.exists(sys.argv[2]):
    print("ncu, N = 4096: kernel, ms, registers, L2 reduction sectors, local sectors loaded, tensor %")
    for r in csv.DictReader(open(sys.argv[2])):
        if r["duration_ns"] and float(r["duration_ns"]) > 1e6:
            print(f"  d{r['d']} {short.get(r['stage'], r['stage'])[:11]:11} {r['kernel'][:28]:28} "
                  f"{float(r['duration_ns']) / 1e6:6.2f} {r['registers']:>4} {r['l2_red_sectors']:>10} "
                  f"{r['local_ld_sectors']:>10} {r['tensor_active_pct']:>6}")
EOF
[ $test_rc = 0 ] && [ $bwd_rc = 0 ]
