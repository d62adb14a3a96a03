#!/usr/bin/env python3
"""Writes the results tables into the READMEs from the recorded CSVs.

Provenance lines add the SM count and CUDA versions from docs/results/device.csv
(device.py) when it describes the same GPU. Reads docs/results/forward.csv (sweep.py), docs/results/traffic.csv
(traffic.py) and, when it exists, docs/results/peers.csv (peers.py: PyTorch
SDPA on the same problems) and rewrites, between marker lines, the tables in
README.md (<!-- results:forward:begin/end -->, <!-- results:traffic:begin/end -->)
and in each stages/NN_slug/README.md (<!-- results:begin/end -->). The
backward's CSVs (backward.py: backward.csv, backward_memory.csv,
backward_determinism.csv; traffic.py --backward: backward_traffic.csv) fill
<!-- results:backward:begin/end --> wherever it appears; the course track's
docs/results/course.csv (course_bench.py) fills <!-- results:course:begin/end -->
in docs/assignments/07_pytorch_triton.md (course_tables.py), and stage 09's
docs/results/decode.csv (decode.py) fills <!-- results:decode:begin/end --> in
README.md and stages/09_split_kv/README.md (decode_tables.py), and
docs/results/gqa_prefill.csv (gqa_prefill.py: prefill with H_kv = H, H/4, 1)
fills <!-- results:gqa:begin/end --> in stages/09_split_kv/README.md (gqa_tables.py);
docs/results/kvcache.csv (kvcache.py: the KV cache contiguous, paged and appended
to) fills <!-- results:kvcache:begin/end --> there too (kvcache_tables.py);
docs/results/ring.csv (ring.py) fills <!-- results:ring:begin/end --> in
README.md and stages/10_ring/README.md (ring_tables.py). The fp32
peers become extra rows of the forward tables. docs/results/causal.csv
(causal.py: stages 03-06 with tile skipping and diagonal-only masking switched
off in turn) fills <!-- results:causal:begin/end --> in README.md and in the
READMEs of stages 03-06; until it is recorded, those say so. And
docs/results/split_q_profile.csv (split_q_profile.py: ncu on stage 05 and 06
split-Q) fills <!-- results:split_q_profile:begin/end --> in stage 06's README.

Stage 07 (tensor cores, 16 bits) has CSVs of its own: forward16.csv (sweep.py
--dtype bf16 / fp16: stage 07's ladder and stages 02, 03 in 16 bits),
ceilings.csv's bf16 rows (ceilings.py), ablation.csv (ablation.py: ncu on
each step of the ladder) and tiles.csv (tiles.py: the tile-shape sweep). They
fill <!-- results:tensor_core:begin/end --> (07 against the 16-bit peers,
README.md), and in stages/07_tensor_core/README.md <!-- results:begin/end -->
(the whole 16-bit sweep with the peers), <!-- results:ablation:begin/end -->
and <!-- results:tiles:begin/end -->, and backward16.csv (backward16.py: its
bf16 backwards with SDPA's) <!-- results:backward16:begin/end -->, and
ablation16.csv (ablation.py --backward: ncu on each kernel of those backwards
and of FlashAttention-2's) <!-- results:ablation16:begin/end -->; a section
whose CSV is not recorded yet says so.

Stage 08 (Hopper) has forward08.csv (run_all.sh step sweep08: sweep.py --stage
07_tensor_core,08 in bf16, the stage in fp16) and ablation08.csv (ablation.py
--hopper). They fill, in stages/08_hopper/README.md, <!-- results:begin/end -->
(every step of the ladder beside stage 07 and the bf16 peers, 08_hopper's factor
over 07, cuDNN and FlashAttention-2, its share of the bf16 ceilings, issue 14's
goal) and <!-- results:ablation:begin/end --> (as stage 07's), and in README.md
<!-- results:hopper:begin/end --> (07 and 08_hopper alone); until recorded, they say so.
The fp32 tables show fp32 rows only (a row without a dtype is fp32).
Tables are never typed by hand: edit the CSVs by re-running the benchmarks,
then this.

    python3 tests/bench/tables.py [--check]   # --check: fail if a README would change
    python3 tests/bench/tables.py --results DIR --out OUT   # other CSVs; READMEs to OUT/
"""
import argparse
import csv
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# Where the CSVs are read from (--results changes it).
RESULTS = os.path.join(ROOT, "docs", "results")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ablation import HOPPER_STEPS, PEER as ABLATION_PEER, STEPS  # noqa: E402

# peers.py's stage names, as the tables label them: fp32 rows join the stages'
# tables; 16-bit rows join stage 07's.
FP32_PEERS = {"sdpa_efficient_fp32": "PyTorch SDPA mem-efficient fp32",
              "sdpa_math_fp32": "PyTorch SDPA math fp32"}
PEERS16 = {"sdpa_flash_bf16": "PyTorch SDPA flash bf16 (FlashAttention-2)",
           "sdpa_cudnn_bf16": "PyTorch SDPA cuDNN bf16",
           "sdpa_math_bf16": "PyTorch SDPA math bf16 (standard attention)",
           "sdpa_flash_fp16": "PyTorch SDPA flash fp16 (FlashAttention-2)",
           "sdpa_cudnn_fp16": "PyTorch SDPA cuDNN fp16"}
FA2_PEER = "sdpa_flash_bf16"   # FlashAttention-2's own kernel, what stage 07 rebuilds
TENSOR_CORE = "07_tensor_core"  # the stage (the last step of its ladder), and its folder
# What each step of the ladder adds (tensor_core_tiles.h, Step), and the ncu
# counter of ablation.csv that shows it: (column, what it counts).
STEP_ADDS = {
    "07_step1_plain_mma": "mma.sync; fragments by 32-bit shared loads; P~ through shared memory",
    "07_step2_ldmatrix": "+ ldmatrix from a swizzled layout",
    "07_step3_cp_async": "+ cp.async: the next tiles load under the math",
    "07_step4_p_in_registers": "+ P~ stays in registers",
    "07_tensor_core": "+ tile shapes per head dimension",
}
STEP_COUNTER = {
    "07_step1_plain_mma": ("instructions", "warp instructions"),
    "07_step2_ldmatrix": ("smem_ld_conflicts", "bank conflicts, shared loads"),
    "07_step3_cp_async": ("stall_long_scoreboard", "long-scoreboard stall, cycles per instruction"),
    "07_step4_p_in_registers": ("smem_st_wavefronts", "shared-store wavefronts"),
    "07_tensor_core": ("tensor_active_pct", "tensor pipe active, %"),
}
# The stages causal.py measures (causal.cpp's entries): the fp32 tiled forwards.
CAUSAL_STAGES = ("03_fa1_kv_outer", "04_fa2_q_outer", "05_sequence_parallel",
                 "06_warp_split_q", "06_warp_split_k")
# The problem ablation.py profiles and the ablation table shows: N, non-causal.
ABLATION_N = 4096
TFLOP_RULE = "TFLOP/s, 4·B·H·N²·d, halved if causal; B = 16384/N, H = 2048/d"


def read(name):
    path = os.path.join(RESULTS, name)
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def dtype_of(row):
    """A row's element type: its dtype column; a peer's, the end of its name
    (sdpa_flash_bf16); rows recorded before the dtype column, fp32."""
    if row.get("dtype"):
        return row["dtype"]
    return peer_dtype(row["stage"]) if row["stage"] in PEERS16 else "fp32"


def fp32_only(rows):
    return [r for r in rows if dtype_of(r) == "fp32"]


def gb(x):
    return f"{int(x) / 1e9:.2f}"


def count(x):
    """A counter in thousands, millions or billions: 1.23 G."""
    v = float(x)
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {unit}"
    return f"{v:.3g}"


def device_facts(gpu):
    """' (132 SMs, CUDA 13.0)' from device.csv (device.py) when it describes this GPU."""
    hit = [d for d in read("device.csv") if d["gpu"] == gpu]
    if not hit:
        return ""
    d = hit[0]
    return f" ({d['sm_count']} SMs, CUDA runtime {d['cuda_runtime']}, driver API {d['cuda_driver']})"


def provenance(rows, name):
    r = rows[0]
    return (f"_Recorded in `docs/results/{name}`: {r.get('gpu') or 'GPU not recorded'}"
            f"{device_facts(r.get('gpu'))}, driver {r['driver']}, "
            f"{r['date']}, commit `{r['commit'][:10]}`._")


def peer_cell(hit, digits=2):
    """A peer's TFLOP/s, or why it has none (OOM: out of memory; –: no kernel)."""
    if not hit:
        return "–"
    if not hit[0]["TFLOP/s"]:
        return "OOM" if hit[0].get("note") == "out of memory" else "–"
    mark = "" if hit[0]["check"] == "ok" else f" ({hit[0]['check']})"
    return f"{float(hit[0]['TFLOP/s']):.{digits}f}{mark}"


def forward_table(rows, stages, d, causal, peers=()):
    ns = sorted({int(r["Nq"]) for r in rows})
    sel = [r for r in rows if int(r["d"]) == d and r["causal"] == str(int(causal))]
    if not sel:
        return ""
    lines = [f"**d = {d}, {'causal' if causal else 'non-causal'}** "
             "(TFLOP/s, 4·B·H·N²·d, halved if causal; B = 16384/N, H = 2048/d)", "",
             "| stage | " + " | ".join(f"N={n}" for n in ns) + " |",
             "| --- |" + " ---: |" * len(ns)]
    for stage in stages:
        cells = []
        for n in ns:
            hit = [r for r in sel if r["stage"] == stage and int(r["Nq"]) == n]
            if not hit or not hit[0]["TFLOP/s"]:
                cells.append("–")
            else:
                mark = "" if hit[0]["check"] == "ok" else f" ({hit[0]['check']})"
                cells.append(f"{float(hit[0]['TFLOP/s']):.2f}{mark}")
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    mine = [r for r in peers if int(r["d"]) == d and r["causal"] == str(int(causal))]
    for peer, label in FP32_PEERS.items():
        if any(r["stage"] == peer for r in mine):
            cells = [peer_cell([r for r in mine if r["stage"] == peer and int(r["Nq"]) == n])
                     for n in ns]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def peers_provenance(peers, what="fp32 with TF32 off; "):
    r = peers[0]
    return (f"_PyTorch SDPA rows recorded in `docs/results/peers.csv` (tests/bench/peers.py): "
            f"{r.get('gpu') or 'GPU not recorded'}, driver {r['driver']}, {r['date']}, "
            f"commit `{r['commit'][:10]}`, PyTorch {r['torch']}; {what}"
            "OOM: out of memory; –: no kernel for that problem (the CSV's note says why)._")


def time_table(rows, stage):
    sel = [r for r in rows if r["stage"] == stage]
    if not sel:
        return ""
    ns = sorted({int(r["Nq"]) for r in sel})
    lines = ["Median ms (TFLOP/s), B = 16384/N, H = 2048/d:", "",
             "| d | causal | " + " | ".join(f"N={n}" for n in ns) + " |",
             "| --- | --- |" + " ---: |" * len(ns)]
    for d in sorted({int(r["d"]) for r in sel}):
        for causal in ("0", "1"):
            cells = []
            for n in ns:
                hit = [r for r in sel if int(r["d"]) == d and r["causal"] == causal
                       and int(r["Nq"]) == n]
                if hit and hit[0]["median ms"]:
                    cells.append(f"{float(hit[0]['median ms']):.3g} ({float(hit[0]['TFLOP/s']):.2f})")
                else:
                    cells.append("–")
            lines.append(f"| {d} | {'yes' if causal == '1' else 'no'} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def traffic_table(rows, stages=None):
    sel = [r for r in rows if stages is None or r["stage"] in stages]
    if not sel:
        return ""
    lines = ["HBM traffic in GB under ncu (`--clock-control none`): model = bytes the algorithm "
             "requests; DRAM = `dram__bytes_{read,write}.sum`; requested = "
             "`l1tex__t_bytes_pipe_lsu_mem_global_op_{ld,st}.sum`.", "",
             "Occupancy = achieved occupancy (`sm__warps_active`), SM active = share of the "
             "kernel's time the SMs were busy (`sm__cycles_active`, idle SMs pull it down).", "",
             "| stage | N | d | model read | DRAM read | requested read | model write "
             "| DRAM write | requested write | DRAM / model | occupancy % | SM active % |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in sel:
        if not r["dram_read"]:
            lines.append(f"| {r['stage']} | {r['N']} | {r['d']} | {gb(r['model_read'])} | "
                         f"counters unavailable: {r['note']} | | | | | | | |")
            continue
        model = int(r["model_read"]) + int(r["model_write"])
        dram = int(r["dram_read"]) + int(r["dram_write"])
        lines.append(
            f"| {r['stage']} | {r['N']} | {r['d']} | {gb(r['model_read'])} | {gb(r['dram_read'])} | "
            f"{gb(r['requested_read'])} | {gb(r['model_write'])} | {gb(r['dram_write'])} | "
            f"{gb(r['requested_write'])} | {dram / model:.2f} | {r.get('occupancy_pct', '')} | "
            f"{r.get('sm_active_pct', '')} |")
    return "\n".join(lines) + "\n"


def glance_table(rows, rows16=(), rows08=(), N=4096, d=64):
    """One reference problem, every stage in its own type (fp32 for 01-06, from
    forward.csv; stages 07 and 08 in bf16, from forward16.csv and forward08.csv):
    modelled HBM bytes beside the time."""
    def at(r):
        return int(r["Nq"]) == N and int(r["d"]) == d and r["causal"] == "0"
    sel = [r for r in rows if at(r)]
    sel16 = [r for r in rows16 if at(r) and r["stage"] == TENSOR_CORE and dtype_of(r) == "bf16"]
    sel08 = [r for r in rows08 if at(r) and r["stage"] == HOPPER and dtype_of(r) == "bf16"]
    if not sel:
        return ""
    lines = [f"At N = {N}, d = {d}, B = {sel[0]['B']}, H = {sel[0]['H']}, non-causal:", "",
             "| stage | dtype | HBM bytes (model) | median ms | TFLOP/s |",
             "| --- | --- | ---: | ---: | ---: |"]
    for r in sel + sel16 + sel08:
        hbm = int(r["HBM read"]) + int(r["HBM write"])
        ms = f"{float(r['median ms']):.3g}" if r["median ms"] else "–"
        tflops = f"{float(r['TFLOP/s']):.1f}" if r["TFLOP/s"] else "–"
        lines.append(f"| {r['stage']} | {dtype_of(r)} | {hbm / 1e9:.1f} GB | {ms} | {tflops} |")
    out = "\n".join(lines) + "\n\n" + provenance(rows, "forward.csv") + "\n"
    if sel16:
        out += "\n" + provenance(rows16, "forward16.csv") + "\n"
    if sel08:
        out += "\n" + provenance(rows08, "forward08.csv") + "\n"
    return out


def long_table(rows):
    """The long-sequence, small-batch point (sweep.py --long), every stage."""
    if not rows:
        return ""
    r0 = rows[0]
    lines = [f"**B = {r0['B']}, H = {r0['H']}, N = {r0['Nq']}** (median ms and TFLOP/s; "
             "4·B·H·N²·d, halved if causal)", "",
             "| stage | d = 64 | d = 64 causal | d = 128 | d = 128 causal |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for stage in dict.fromkeys(r["stage"] for r in rows):
        cells = []
        for d, causal in (("64", "0"), ("64", "1"), ("128", "0"), ("128", "1")):
            hit = [r for r in rows if r["stage"] == stage and r["d"] == d and r["causal"] == causal]
            if hit and hit[0]["median ms"]:
                ms = float(hit[0]["median ms"])
                ms_text = f"{ms:,.0f}" if ms >= 100 else f"{ms:.3g}"
                cells.append(f"{ms_text} ms ({float(hit[0]['TFLOP/s']):.2f})")
            else:
                cells.append("–")
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n" + provenance(rows, "long.csv") + "\n"


BACKWARD_LABELS = {"02_safe_softmax": "02_safe_softmax (standard, P in HBM)",
                   "05_sequence_parallel": "05_sequence_parallel (FlashAttention-2, Algorithm 2)",
                   **FP32_PEERS}


def backward_tables(rows):
    """TFLOP/s of every backward against N, one table per (d, causal)."""
    ns = sorted({int(r["Nq"]) for r in rows})
    out = []
    for d in sorted({int(r["d"]) for r in rows}):
        for causal in ("0", "1"):
            sel = [r for r in rows if int(r["d"]) == d and r["causal"] == causal]
            if not sel:
                continue
            lines = [f"**Backward, d = {d}, {'causal' if causal == '1' else 'non-causal'}** "
                     "(TFLOP/s, 2.5 × 4·B·H·N²·d, halved if causal; B = 16384/N, H = 2048/d)", "",
                     "| backward | " + " | ".join(f"N={n}" for n in ns) + " |",
                     "| --- |" + " ---: |" * len(ns)]
            for stage, label in BACKWARD_LABELS.items():
                mine = [r for r in sel if r["stage"] == stage]
                if mine:
                    cells = [peer_cell([r for r in mine if int(r["Nq"]) == n]) for n in ns]
                    lines.append(f"| {label} | " + " | ".join(cells) + " |")
            ratio = []
            for n in ns:
                ours = [r for r in sel if r["stage"] == "05_sequence_parallel" and int(r["Nq"]) == n]
                peer = [r for r in sel if r["stage"] == "sdpa_efficient_fp32" and int(r["Nq"]) == n]
                ok = ours and peer and ours[0]["TFLOP/s"] and peer[0]["TFLOP/s"]
                ratio.append(f"{float(ours[0]['TFLOP/s']) / float(peer[0]['TFLOP/s']):.0%}" if ok else "–")
            if any(c != "–" for c in ratio):
                lines.append("| 05 ÷ SDPA mem-efficient | " + " | ".join(ratio) + " |")
            out.append("\n".join(lines) + "\n")
    return "\n".join(out)


def backward_traffic_model_table(rows):
    """The two backwards' modelled HBM bytes against N: Theta(N^2) against Theta(N^2 d^2 / M)."""
    sel = [r for r in rows if r["causal"] == "0" and r["HBM read"]
           and r["stage"] in ("02_safe_softmax", "05_sequence_parallel")]
    if not sel:
        return ""
    ns = sorted({int(r["Nq"]) for r in sel})
    lines = ["**Modelled HBM bytes** of the backward (read + write, GB; non-causal; B = 16384/N, "
             "H = 2048/d): the standard backward moves N × N matrices, FlashAttention-2's re-reads "
             "Q and dO once per K/V block.", "",
             "| backward | d | " + " | ".join(f"N={n}" for n in ns) + " |",
             "| --- | ---: |" + " ---: |" * len(ns)]
    for d in sorted({int(r["d"]) for r in sel}):
        for stage in ("02_safe_softmax", "05_sequence_parallel"):
            cells = []
            for n in ns:
                hit = [r for r in sel if r["stage"] == stage and int(r["d"]) == d and int(r["Nq"]) == n]
                cells.append(f"{(int(hit[0]['HBM read']) + int(hit[0]['HBM write'])) / 1e9:.1f}"
                             if hit else "–")
            lines.append(f"| {BACKWARD_LABELS[stage]} | {d} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def memory_table(rows):
    """Each backward's device memory at N = 16384 and the largest N it can run."""
    if not rows:
        return ""
    lines = [f"**Memory** (forward + backward: inputs, outputs, gradients, workspaces) at "
             f"N = {rows[0]['N']}, B = 1, H = 2048/d, and the largest N at B = 1 on this GPU's "
             f"{int(rows[0]['gpu memory']) / 1e9:.0f} GB:", "",
             "| backward | d | memory at N = 16384 | largest N | how |",
             "| --- | ---: | ---: | ---: | --- |"]
    for r in rows:
        lines.append(f"| {BACKWARD_LABELS.get(r['stage'], r['stage'])} | {r['d']} | "
                     f"{int(r['memory']) / 1e9:.1f} GB | {int(r['largest N']):,} | "
                     f"{r['how']}; {r['largest N how']} |")
    return "\n".join(lines) + "\n"


def determinism_table(rows):
    """dQ's run-to-run variation (the atomics) and dK, dV's bit-identity."""
    if not rows:
        return ""
    lines = [f"**Run to run** ({rows[0]['runs']} runs on the same inputs, each compared with "
             "the first, element by element):", "",
             "| backward | problem | dQ elements that differ | largest dQ difference "
             "| largest dQ | dK, dV bit-identical |",
             "| --- | --- | ---: | ---: | ---: | --- |"]
    for r in rows:
        share = int(r["dQ differing"]) / int(r["dQ elements"])
        same = "yes" if r["dK identical"] == "1" and r["dV identical"] == "1" else "no"
        lines.append(f"| {r['stage']} | B={r['B']} H={r['H']} N={r['Nq']} d={r['d']}"
                     f"{' causal' if r['causal'] == '1' else ''} | {share:.0%} | "
                     f"{float(r['dQ max abs diff']):.2g} | {float(r['dQ max abs']):.2g} | {same} |")
    return "\n".join(lines) + "\n"


def backward_body():
    """Everything the backward's CSVs say, for <!-- results:backward -->."""
    rows, memory = read("backward.csv"), read("backward_memory.csv")
    det, traffic = read("backward_determinism.csv"), read("backward_traffic.csv")
    if not rows:
        return ""
    parts = [backward_tables(rows), provenance(rows, "backward.csv")
             + " _PyTorch " + rows[-1]["torch"] + ", fp32 with TF32 off; peers' gradients checked "
             "on head 0 against fp64 where one head's N × N fits the budget (N ≤ 4096)._\n"]
    parts.append(backward_traffic_model_table(rows))
    if memory:
        parts += [memory_table(memory), provenance(memory, "backward_memory.csv") + "\n"]
    if det:
        parts += [determinism_table(det), provenance(det, "backward_determinism.csv") + "\n"]
    if traffic:
        parts += [traffic_table(traffic), provenance(traffic, "backward_traffic.csv") + "\n"]
    return "\n".join(parts)


# ------------------------------------------------------------------ stage 07, 16 bits

def pick(rows, stage, dtype, d, causal, n):
    """The rows of one stage (or peer) in one type on one problem of the sweep."""
    return [r for r in rows if r["stage"] == stage and dtype_of(r) == dtype and int(r["d"]) == d
            and r["causal"] == causal and int(r["Nq"]) == n]


def peer_dtype(peer):
    """peers.py's names end in the type: sdpa_flash_bf16 -> bf16."""
    return peer.rsplit("_", 1)[-1]


def same_gpu(a, b):
    """Whether two CSVs' rows name the same GPU: a ratio of runs on two GPUs means nothing."""
    return bool(a) and bool(b) and a[0].get("gpu") == b[0].get("gpu")


def other_gpu_note(a, a_name, b, b_name):
    return (f"_No ratios: {a_name} is from {a[0].get('gpu') or 'an unrecorded GPU'}, {b_name} "
            f"from {b[0].get('gpu') or 'an unrecorded GPU'}._\n")


def ratio_cells(ours, theirs, ns):
    """ours / theirs per N in %, '–' where either is missing."""
    cells = []
    for n in ns:
        a, b = ours.get(n), theirs.get(n)
        cells.append(f"{a / b:.0%}" if a and b else "–")
    return cells


def tflops_by_n(rows, stage, dtype, d, causal):
    """{N: TFLOP/s} of one stage or peer on one (d, causal); N without a time left out."""
    return {int(r["Nq"]): float(r["TFLOP/s"]) for r in rows
            if r["stage"] == stage and dtype_of(r) == dtype and int(r["d"]) == d
            and r["causal"] == causal and r["TFLOP/s"]}


def table16(title, ns, lines):
    """A TFLOP/s table against N: lines are (label, cells)."""
    out = [title, "", "| | " + " | ".join(f"N={n}" for n in ns) + " |",
           "| --- |" + " ---: |" * len(ns)]
    out += [f"| {label} | " + " | ".join(cells) + " |" for label, cells in lines]
    return "\n".join(out) + "\n"


def ceiling_values(ceilings):
    """{name: TFLOP/s} of ceilings.csv's bf16 tensor ceilings."""
    got = {r["ceiling"]: float(r["value"]) for r in ceilings if r["value"]}
    return {name: got[name] for name in ("mma_bf16", "gemm_bf16") if name in got}


CEILING_LABELS = {"mma_bf16": "mma.sync bf16 peak", "gemm_bf16": "cuBLAS bf16 GEMM 8192³"}


def not_recorded(what, steps):
    return (f"_{what}: not recorded yet; on a GPU, `bash tests/bench/run_all.sh LOGDIR {steps}` "
            "records it (tests/bench/run_all.sh says how to split the steps into calls of ten "
            "minutes)._\n")


def tensor_core_body(rows16, peers, ceilings):
    """README.md's <!-- results:tensor_core -->: stage 07 in bf16 against FlashAttention-2
    (SDPA flash) and cuDNN, each N, with 07's share of FlashAttention-2 and of the
    measured bf16 ceilings."""
    ours = [r for r in rows16 if r["stage"] == TENSOR_CORE and dtype_of(r) == "bf16"]
    theirs = [r for r in peers if r["stage"] in ("sdpa_flash_bf16", "sdpa_cudnn_bf16")]
    if not ours and not theirs:
        return not_recorded("Stage 07 and its 16-bit peers", "build sweep16 peers ceilings")
    ns = sorted({int(r["Nq"]) for r in ours + theirs})
    ceil = ceiling_values(ceilings) if same_gpu(ours, ceilings) else {}
    parts = [] if ours else [not_recorded("Stage 07", "build sweep16")]
    if ours and theirs and not same_gpu(ours, theirs):
        parts.append(other_gpu_note(ours, "forward16.csv", theirs, "peers.csv"))
    if ours and ceilings and not same_gpu(ours, ceilings):
        parts.append(other_gpu_note(ours, "forward16.csv", ceilings, "ceilings.csv"))
    for d in (64, 128):
        for causal in ("0", "1"):
            mine = tflops_by_n(ours, TENSOR_CORE, "bf16", d, causal)
            fa2 = tflops_by_n(theirs, FA2_PEER, "bf16", d, causal)
            lines = [(f"{TENSOR_CORE} bf16",
                      [peer_cell(pick(ours, TENSOR_CORE, "bf16", d, causal, n), 1) for n in ns])
                     ] if ours else []
            for peer in ("sdpa_flash_bf16", "sdpa_cudnn_bf16"):
                if any(r["stage"] == peer for r in theirs):
                    lines.append((PEERS16[peer], [peer_cell(pick(theirs, peer, "bf16", d, causal, n), 1)
                                                  for n in ns]))
            if mine and fa2 and same_gpu(ours, theirs):
                lines.append(("07 ÷ FlashAttention-2", ratio_cells(mine, fa2, ns)))
            for name, value in ceil.items():
                lines.append((f"07 ÷ {CEILING_LABELS[name]} ({value:.0f} TFLOP/s, measured)",
                              ratio_cells(mine, {n: value for n in ns}, ns)))
            if not mine and not any(r["causal"] == causal and int(r["d"]) == d for r in theirs):
                continue
            parts.append(table16(f"**bf16, d = {d}, {'causal' if causal == '1' else 'non-causal'}** "
                                 f"({TFLOP_RULE})", ns, lines))
    notes = []
    if ours:
        notes.append(provenance(ours, "forward16.csv"))
    if theirs:
        notes.append(peers_provenance(theirs, ""))
    if ceil:
        notes.append(provenance([r for r in ceilings if r["ceiling"] in ceil], "ceilings.csv")
                     + " _mma.sync bf16 peak: flashstep_mma_peak (independent "
                     "mma.sync.m16n8k16 chains on every SM), what stage 07's instruction can "
                     "reach; cuBLAS bf16 GEMM: what the chip reaches with Hopper's wgmma._")
    body = "\n".join(parts) + "\n" + "\n\n".join(notes) + "\n"
    if ours:
        body += ("\n![bf16 forward TFLOP/s against N: standard attention, FlashAttention-1 style, "
                 "stage 07 and PyTorch's kernels](docs/results/plots/bf16_tflops_vs_n.png)\n")
    return body


# Rows of stage 07's full 16-bit sweep, in order: (stage, dtype, label).
SWEEP16_ROWS = [*((s, "bf16", f"{s} bf16") for s in STEPS),
                (TENSOR_CORE, "fp16", f"{TENSOR_CORE} fp16"),
                ("02_safe_softmax", "bf16", "02_safe_softmax bf16 (standard attention)"),
                ("03_fa1_kv_outer", "bf16", "03_fa1_kv_outer bf16 (FlashAttention-1's loop order)")]


def sweep16_body(rows16, peers, traffic):
    """stages/07_tensor_core/README.md's <!-- results -->: the whole 16-bit sweep, every
    stage-07 entry and 16-bit stage beside every 16-bit peer, then 07's ncu traffic."""
    theirs = [r for r in peers if r["stage"] in PEERS16]
    if not rows16:
        return not_recorded("The 16-bit sweep", "build sweep16 peers")
    ns = sorted({int(r["Nq"]) for r in rows16})
    parts = []
    for d in (64, 128):
        for causal in ("0", "1"):
            lines = []
            for stage, dtype, label in SWEEP16_ROWS:
                if any(r["stage"] == stage and dtype_of(r) == dtype for r in rows16):
                    lines.append((label, [peer_cell(pick(rows16, stage, dtype, d, causal, n), 1)
                                          for n in ns]))
            for peer, label in PEERS16.items():
                if any(r["stage"] == peer for r in theirs):
                    lines.append((label, [peer_cell(pick(theirs, peer, peer_dtype(peer), d, causal, n), 1)
                                          for n in ns]))
            for dtype in ("bf16", "fp16"):
                mine = tflops_by_n(rows16, TENSOR_CORE, dtype, d, causal)
                fa2 = tflops_by_n(theirs, f"sdpa_flash_{dtype}", dtype, d, causal)
                if mine and fa2 and same_gpu(rows16, theirs):
                    lines.append((f"07 {dtype} ÷ FlashAttention-2 {dtype}", ratio_cells(mine, fa2, ns)))
            if lines and any(int(r["d"]) == d and r["causal"] == causal for r in rows16):
                parts.append(table16(f"**d = {d}, {'causal' if causal == '1' else 'non-causal'}** "
                                     f"({TFLOP_RULE})", ns, lines))
    parts.append(provenance(rows16, "forward16.csv") + "\n")
    if theirs:
        parts.append(peers_provenance(theirs, "") + "\n")
        if not same_gpu(rows16, theirs):
            parts.append(other_gpu_note(rows16, "forward16.csv", theirs, "peers.csv"))
    mine = [r for r in traffic if r["stage"].startswith("07")]
    if mine:
        parts += [traffic_table(mine, [r["stage"] for r in mine]), provenance(mine, "traffic.csv") + "\n"]
    return "\n".join(parts)


def has_ablation(rows16, steps=STEPS):
    """Whether forward16.csv (forward08.csv) holds the ladder at the ablation problem:
    what the ablation table and plots.py's ablation.png need."""
    return any(r["stage"] in steps and int(r["Nq"]) == ABLATION_N and r["causal"] == "0"
               and dtype_of(r) == "bf16" and r["TFLOP/s"] for r in rows16)


# What an ablation table is made of: stage 07's ladder here, stage 08's below.
# steps, adds, counter: the ladder and, per step, what it adds and the ncu
# column that should show it; sweep, csv: the CSVs of its TFLOP/s and its ncu
# counters; record: run_all.sh's steps for each; peer: (peers.csv's stage, label,
# what it is, the step compared with it); plot: the PNG under the table.
LADDER07 = {"steps": STEPS, "adds": STEP_ADDS, "counter": STEP_COUNTER,
            "sweep": "forward16.csv", "csv": "ablation.csv",
            "record": ("build sweep16 ablation", "build ablation"),
            "peer": (FA2_PEER, "FlashAttention-2 (PyTorch SDPA flash bf16)",
                     "the kernel stage 07 rebuilds", TENSOR_CORE),
            "plot": "ablation.png"}


def ablation_body(rows16, ablation, peers, ladder_spec=LADDER07):
    """stages/07_tensor_core/README.md's <!-- results:ablation -->: each step's TFLOP/s at
    N = 4096 (forward16.csv), its gain over the step before, the ncu counter that shows
    why (ablation.csv), and every counter of every step beside FlashAttention-2's kernel.
    With LADDER08, the same for stage 08 (forward08.csv, ablation08.csv) beside cuDNN."""
    spec = ladder_spec
    steps, step_adds, step_counter = spec["steps"], spec["adds"], spec["counter"]
    peer, peer_label, peer_what, compared = spec["peer"]
    if not has_ablation(rows16, steps):
        return not_recorded("The ablation", spec["record"][0])
    ladder = [r for r in rows16 if r["stage"] in steps and dtype_of(r) == "bf16"
              and int(r["Nq"]) == ABLATION_N and r["causal"] == "0"]
    ds = sorted({int(r["d"]) for r in ladder})

    def tflops(rows, stage, d):
        hit = pick(rows, stage, "bf16", d, "0", ABLATION_N)
        return float(hit[0]["TFLOP/s"]) if hit and hit[0]["TFLOP/s"] else None

    def counter(stage, d, column):
        hit = [r for r in ablation if r["stage"] == stage and int(r["d"]) == d and r.get(column)]
        return float(hit[0][column]) if hit else None

    def show(column, v):
        if v is None:
            return "–"
        if column.endswith("_pct") or column.startswith("stall_"):
            return f"{v:.1f}"
        return count(v)

    b = ladder[0]
    head = ["step", "adds"]
    for d in ds:
        head += [f"d = {d} TFLOP/s", "gain"]
    if ablation:
        head += ["ncu counter"] + [f"d = {d}: before → after" for d in ds]
    lines = [f"**The ladder** at N = {ABLATION_N}, B = {b['B']}, H = 2048/d, non-causal, bf16: "
             f"TFLOP/s from the sweep ({spec['sweep']}; 4·B·H·N²·d / median time), the gain over "
             "the step before"
             + (", and the Nsight Compute counter the step's idea should move "
                f"({spec['csv']}, one profiled run, `--clock-control none`)" if ablation else "")
             + ".", "",
             "| " + " | ".join(head) + " |",
             "| --- | --- |" + " ---: | ---: |" * len(ds)
             + (" --- |" + " ---: |" * len(ds) if ablation else "")]
    prev = None
    for stage in steps:
        cells = [stage, step_adds[stage]]
        for d in ds:
            now = tflops(rows16, stage, d)
            before = tflops(rows16, prev, d) if prev else None
            cells += [f"{now:.1f}" if now else "–",
                      f"×{now / before:.2f}" if now and before else "–"]
        column, label = step_counter[stage]
        if ablation:
            cells.append(label)
            for d in ds:
                after = counter(stage, d, column)
                before = counter(prev, d, column) if prev else None
                cells.append(show(column, after) if prev is None
                             else f"{show(column, before)} → {show(column, after)}")
        lines.append("| " + " | ".join(cells) + " |")
        prev = stage
    fa2 = [r for r in peers if r["stage"] == peer]
    if fa2:
        cells = [peer_label, peer_what]
        for d in ds:
            theirs = tflops(fa2, peer, d)
            mine = tflops(rows16, compared, d)
            cells += [f"{theirs:.1f}" if theirs else "–",
                      f"{compared[:2]} at {mine / theirs:.0%}"
                      if mine and theirs and same_gpu(rows16, fa2) else "–"]
        if ablation:
            column, label = step_counter[compared]
            cells += [label] + [show(column, counter(ABLATION_PEER, d, column)) for d in ds]
        lines.append("| " + " | ".join(cells) + " |")
    parts = ["\n".join(lines) + "\n", provenance(rows16, spec["sweep"])
             + (" " + peers_provenance(fa2, "") if fa2 else "") + "\n"]
    if ablation:
        parts.append(ablation_counters(ablation, spec["csv"]))
        parts.append(provenance(ablation, spec["csv"])
                     + (f" _FlashAttention-2's `{next(r['kernel'] for r in ablation if r['stage'] == ABLATION_PEER) or 'flash_fwd'}` "
                        f"kernel through PyTorch {next(r['torch'] for r in ablation if r['stage'] == ABLATION_PEER)}._"
                        if any(r["stage"] == ABLATION_PEER for r in ablation) else "") + "\n")
    else:
        parts.append(not_recorded("The ncu counters of the ladder", spec["record"][1]))
    if spec["plot"]:
        parts.append("![Each step's TFLOP/s and where its warps stall]"
                     f"(../../docs/results/plots/{spec['plot']})\n")
    return "\n".join(parts)


# ablation.csv's columns in the counters table: (column, header).
ABLATION_COLUMNS = [("duration_ns", "ms (ncu)"), ("instructions", "warp instr."),
                    ("smem_ld_conflicts", "bank confl. ld"), ("smem_st_conflicts", "bank confl. st"),
                    ("smem_ld_wavefronts", "smem wavefr. ld"), ("smem_st_wavefronts", "smem wavefr. st"),
                    ("tensor_active_pct", "tensor active %"), ("registers", "regs"),
                    ("occupancy_pct", "occupancy %")]
STALL_LABELS = {"stall_barrier": "barrier", "stall_long_scoreboard": "long sb",
                "stall_short_scoreboard": "short sb", "stall_wait": "wait",
                "stall_math_pipe_throttle": "math throttle", "stall_mio_throttle": "mio throttle",
                "stall_lg_throttle": "lg throttle"}


def wgmma_counter_note(ablation):
    """Why the hmma counter stands for wgmma in ablation08.csv: the step that issues
    only wgmma reads nonzero on it. Empty for stage 07's ablation.csv."""
    wgmma_only = [float(r["tensor_active_pct"]) for r in ablation
                  if r["stage"] == "08_step1_wgmma_sync" and r.get("tensor_active_pct")]
    if not wgmma_only:
        return ""
    return (", which counts wgmma's work too, against wgmma's own peak: 08_step1 issues only "
            f"wgmma and reads {min(wgmma_only):.1f}–{max(wgmma_only):.1f}%")


def ablation_counters(ablation, name="ablation.csv"):
    """Every counter of ablation.csv (ablation08.csv), a table per d: the ladder and
    FlashAttention-2 (stage 08's ladder and stage 07)."""
    columns = ABLATION_COLUMNS
    out = [f"**Every counter** ({name}): shared-memory bank conflicts and wavefronts "
           "(`l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{ld,st}`, "
           "`l1tex__data_pipe_lsu_wavefronts_mem_shared_op_{ld,st}`), tensor pipe active "
           "(`sm__pipe_tensor_op_hmma_cycles_active`"
           + wgmma_counter_note(ablation)
           + "), and the warp stalls: cycles a warp waits "
           "for that reason per instruction issued "
           "(`smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio`).", ""]
    for d in sorted({int(r["d"]) for r in ablation}):
        rows = [r for r in ablation if int(r["d"]) == d]
        stalls = [c for c in STALL_LABELS if any(c in r for r in rows)]
        head = ["d = " + str(d)] + [h for _, h in columns] + \
               [f"stall: {STALL_LABELS[c]}" for c in stalls]
        out += ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
        for r in rows:
            label = "FlashAttention-2 (SDPA flash bf16)" if r["stage"] == ABLATION_PEER else r["stage"]
            if not r.get("duration_ns"):
                out.append(f"| {label} | counters unavailable: {r['note']} |"
                           + " |" * (len(head) - 2))
                continue
            cells = []
            for c, _ in columns:
                v = r.get(c, "")
                if not v:
                    cells.append("–")
                elif c == "duration_ns":
                    cells.append(f"{float(v) / 1e6:.3g}")
                elif c.endswith("_pct"):
                    cells.append(f"{float(v):.1f}")
                elif c == "registers":
                    cells.append(f"{float(v):.0f}")
                else:
                    cells.append(count(v))
            cells += [f"{float(r[c]):.2f}" if r.get(c) else "–" for c in stalls]
            out.append(f"| {label} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def tiles_body(tiles):
    """stages/07_tensor_core/README.md's <!-- results:tiles -->: TFLOP/s of every tile
    shape tiles.py timed, per head dimension, beside its registers, shared memory and
    resident blocks; stage 07's own shape marked, the best of each column in bold."""
    if not tiles:
        return not_recorded("The tile sweep", "build tiles")
    ns = sorted({int(r["N"]) for r in tiles})
    causals = [c for c in ("0", "1") if any(r["causal"] == c for r in tiles)]
    cols = [(n, c) for c in causals for n in ns]
    r0 = tiles[0]
    lines = [f"**Tile shapes** ({r0['dtype']}; TFLOP/s, 4·B·H·N²·d, halved if causal; "
             "B = 16384/N, H = 2048/d): Br × Bc is rows of Q per thread block × keys per K/V "
             "tile, w the warps per block; registers per thread and resident blocks per SM as "
             "the driver reports them. ★ marks stage 07's shape (tensor_core_tiles.h), bold the "
             "fastest shape of each column.", "",
             "| d | shape | regs | smem KiB | blocks/SM | "
             + " | ".join(f"N={n}{' causal' if c == '1' else ''}" for n, c in cols) + " |",
             "| ---: | --- | ---: | ---: | ---: |" + " ---: |" * len(cols)]
    for d in sorted({int(r["d"]) for r in tiles}):
        mine = [r for r in tiles if int(r["d"]) == d]
        shapes = list(dict.fromkeys((r["Br"], r["Bc"], r["warps"]) for r in mine))
        best = {}
        for n, c in cols:
            vals = [float(r["TFLOP/s"]) for r in mine
                    if int(r["N"]) == n and r["causal"] == c and r["TFLOP/s"] and r["check"] == "ok"]
            best[n, c] = max(vals) if vals else None
        for br, bc, w in shapes:
            rows = [r for r in mine if (r["Br"], r["Bc"], r["warps"]) == (br, bc, w)]
            star = " ★" if rows[0]["stage shape"] == "1" else ""
            cells = []
            for n, c in cols:
                hit = [r for r in rows if int(r["N"]) == n and r["causal"] == c]
                if not hit or not hit[0]["TFLOP/s"]:
                    cells.append(hit[0]["check"] if hit else "–")
                    continue
                v = float(hit[0]["TFLOP/s"])
                text = f"{v:.1f}" + ("" if hit[0]["check"] == "ok" else f" ({hit[0]['check']})")
                cells.append(f"**{text}**" if v == best[n, c] else text)
            lines.append(f"| {d} | {br}×{bc} w{w}{star} | {rows[0]['registers']} | "
                         f"{int(rows[0]['smem bytes']) / 1024:g} | {rows[0]['blocks per SM']} | "
                         + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n" + provenance(tiles, "tiles.csv") + "\n"


# ------------------------------------------------------------------ stage 08, Hopper

HOPPER = "08_hopper"  # the stage (the last step of its ladder), and its folder
CUDNN_PEER = "sdpa_cudnn_bf16"
# Issue 14's goal, bf16, from this N on: 08_hopper at least cuDNN's speed and
# 1.6 times stage 07's.
GOAL_N, GOAL_CUDNN, GOAL_07 = 2048, 1.0, 1.6
# What each step of stage 08's ladder adds (hopper_model.cpp, the stage's
# README), and the ablation08.csv counter that should show it.
STEP_ADDS08 = {
    TENSOR_CORE: "stage 07: mma.sync, ldmatrix, cp.async, P~ in registers",
    "08_step1_wgmma_sync": "wgmma for both products, each waited for at once; tiles copied "
                           "by the threads",
    "08_step2_tma_pipeline": "+ TMA copies on mbarriers, two K/V buffers",
    "08_step3_warp_specialized": "+ a producer warpgroup and two consumers (setmaxnreg)",
    "08_step4_ping_pong": "+ ping-pong, one turn per K/V tile: one consumer's softmax under "
                          "the others' wgmma",
    HOPPER: "+ each consumer's softmax under its own P~ V",
}
STEP_COUNTER08 = {
    TENSOR_CORE: ("tensor_active_pct", "tensor pipe active (mma.sync), %"),
    "08_step1_wgmma_sync": ("tensor_active_pct", "tensor pipe active, %"),
    "08_step2_tma_pipeline": ("instructions", "warp instructions"),
    "08_step3_warp_specialized": ("stall_barrier", "barrier stall, cycles per instruction"),
    "08_step4_ping_pong": ("tensor_active_pct", "tensor pipe active, %"),
    HOPPER: ("tensor_active_pct", "tensor pipe active, %"),
}
LADDER08 = {"steps": HOPPER_STEPS, "adds": STEP_ADDS08, "counter": STEP_COUNTER08,
            "sweep": "forward08.csv", "csv": "ablation08.csv",
            "record": ("build sweep08 ablation08", "build ablation08"),
            "peer": (CUDNN_PEER, "cuDNN (PyTorch SDPA cuDNN bf16)",
                     f"the target: ≥ {GOAL_CUDNN:.1f}x", HOPPER),
            "plot": None}


def times_cells(ours, theirs, ns):
    """ours / theirs per N as a factor (×1.62), '–' where either is missing."""
    return [f"×{ours[n] / theirs[n]:.2f}" if ours.get(n) and theirs.get(n) else "–" for n in ns]


def hopper_goal(rows08, theirs):
    """Issue 14's goal per (d, causal) at N ≥ GOAL_N: the lowest and highest 08_hopper ÷ cuDNN
    and 08_hopper ÷ 07_tensor_core, and whether the lowest of each meets it."""
    lines = [f"**The goal** (issue 14: bf16, N ≥ {GOAL_N}, 08_hopper ≥ {GOAL_CUDNN:.1f}x cuDNN "
             f"and ≥ {GOAL_07:.1f}x 07_tensor_core; lowest – highest over N):", "",
             "| d | causal | 08_hopper ÷ cuDNN | 08_hopper ÷ 07_tensor_core | goal |",
             "| ---: | --- | ---: | ---: | --- |"]
    for d in (64, 128):
        for causal in ("0", "1"):
            mine = tflops_by_n(rows08, HOPPER, "bf16", d, causal)
            if not mine:
                continue
            ns = [n for n in sorted(mine) if n >= GOAL_N]
            cudnn = tflops_by_n(theirs, CUDNN_PEER, "bf16", d, causal)
            base = tflops_by_n(rows08, TENSOR_CORE, "bf16", d, causal)
            cells, met = [], []
            for other, goal in ((cudnn, GOAL_CUDNN), (base, GOAL_07)):
                r = [mine[n] / other[n] for n in ns if other.get(n)]
                cells.append(f"×{min(r):.2f} – ×{max(r):.2f}" if r else "–")
                met.append(min(r) >= goal if r else None)
            verdict = ("–" if None in met else "met" if all(met) else
                       "not met: " + " and ".join(w for w, m in zip(("cuDNN", "07"), met) if not m))
            lines.append(f"| {d} | {'yes' if causal == '1' else 'no'} | {cells[0]} | {cells[1]} "
                         f"| {verdict} |")
    return "\n".join(lines) + "\n" if len(lines) > 4 else ""


def hopper_goal_block(rows08, peers):
    """docs/stage08.md's <!-- results:goal -->: issue 14's goal table alone, with where its
    numbers come from; until forward08.csv is recorded, says so."""
    if not rows08:
        return not_recorded("Stage 08's sweep beside stage 07 (forward08.csv)",
                            "build sweep08 tables plots")
    theirs = [r for r in peers if r["stage"] in (FA2_PEER, CUDNN_PEER)]
    if not same_gpu(rows08, theirs):
        return other_gpu_note(rows08, "forward08.csv", theirs, "peers.csv")
    return (hopper_goal(rows08, theirs) + "\n" + provenance(rows08, "forward08.csv") + " "
            + peers_provenance(theirs, "") + "\n")


def hopper_body(rows08, peers, ceilings, ladder=True):
    """<!-- results --> of stages/08_hopper/README.md (ladder: every step of stage 08 and its
    fp16) and <!-- results:hopper --> of README.md (07_tensor_core and 08_hopper alone):
    forward08.csv's TFLOP/s against N beside SDPA's FlashAttention-2 and cuDNN in bf16,
    08_hopper's factor over 07_tensor_core, cuDNN and FlashAttention-2, its share of the
    measured bf16 ceilings, and the goal; until forward08.csv is recorded, says so."""
    if not rows08:
        return not_recorded("Stage 08's sweep beside stage 07 (forward08.csv)",
                            "build sweep08 tables plots")
    theirs = [r for r in peers if r["stage"] in (FA2_PEER, CUDNN_PEER)]
    compare = same_gpu(rows08, theirs)
    ceil = ceiling_values(ceilings) if same_gpu(rows08, ceilings) else {}
    ns = sorted({int(r["Nq"]) for r in rows08})
    stages = HOPPER_STEPS if ladder else (TENSOR_CORE, HOPPER)
    parts = []
    if theirs and not compare:
        parts.append(other_gpu_note(rows08, "forward08.csv", theirs, "peers.csv"))
    if ceilings and not ceil:
        parts.append(other_gpu_note(rows08, "forward08.csv", ceilings, "ceilings.csv"))
    parts.append(hopper_goal(rows08, theirs if compare else []))
    for d in (64, 128):
        for causal in ("0", "1"):
            if not any(int(r["d"]) == d and r["causal"] == causal for r in rows08):
                continue
            lines = [(f"{s} bf16", [peer_cell(pick(rows08, s, "bf16", d, causal, n), 1) for n in ns])
                     for s in stages if any(r["stage"] == s for r in rows08)]
            if ladder and any(r["stage"] == HOPPER and dtype_of(r) == "fp16" for r in rows08):
                lines.append((f"{HOPPER} fp16",
                              [peer_cell(pick(rows08, HOPPER, "fp16", d, causal, n), 1) for n in ns]))
            for peer in (FA2_PEER, CUDNN_PEER):
                if any(r["stage"] == peer for r in theirs):
                    lines.append((PEERS16[peer], [peer_cell(pick(theirs, peer, "bf16", d, causal, n), 1)
                                                  for n in ns]))
            mine = tflops_by_n(rows08, HOPPER, "bf16", d, causal)
            lines.append(("08 ÷ 07", times_cells(mine, tflops_by_n(rows08, TENSOR_CORE, "bf16",
                                                                   d, causal), ns)))
            if compare:
                lines += [("08 ÷ cuDNN", times_cells(mine, tflops_by_n(theirs, CUDNN_PEER, "bf16",
                                                                       d, causal), ns)),
                          ("08 ÷ FlashAttention-2",
                           times_cells(mine, tflops_by_n(theirs, FA2_PEER, "bf16", d, causal), ns))]
            for name, value in ceil.items():
                lines.append((f"08 ÷ {CEILING_LABELS[name]} ({value:.0f} TFLOP/s, measured)",
                              ratio_cells(mine, {n: value for n in ns}, ns)))
            parts.append(table16(f"**bf16, d = {d}, {'causal' if causal == '1' else 'non-causal'}** "
                                 f"({TFLOP_RULE})", ns, lines))
    notes = [provenance(rows08, "forward08.csv")]
    if theirs:
        notes.append(peers_provenance(theirs, ""))
    if ceil:
        notes.append(provenance([r for r in ceilings if r["ceiling"] in ceil], "ceilings.csv")
                     + " _mma.sync bf16 peak: flashstep_mma_peak, stage 07's instruction; "
                     "cuBLAS bf16 GEMM: what the chip reaches with wgmma._")
    plot = "docs/results/plots/hopper_tflops_vs_n.png"
    return ("\n".join(parts) + "\n" + "\n\n".join(notes) + "\n\n"
            "![Stage 08's ladder beside stage 07, FlashAttention-2 and cuDNN: bf16 TFLOP/s "
            f"against N]({plot if not ladder else '../../' + plot})\n")


# ------------------------------------------------------------------ causal ablation

# causal.csv's modes (causal.cpp): what each switches off.
CAUSAL_MODES = {"fast": "skip + diagonal-only masking",
                "no_skip": "skipping off",
                "mask_every": "diagonal-only masking off"}


def causal_ms(rows, stage, d, causal, mode, n):
    hit = [r for r in rows if r["stage"] == stage and int(r["d"]) == d and r["causal"] == causal
           and r["mode"] == mode and int(r["N"]) == n and r["median ms"]]
    return float(hit[0]["median ms"]) if hit else None


def causal_speedups(rows, stages, ns, title):
    """Per stage and d, for each N: time without one half of the lesson over
    time with both, and non-causal time over causal (the paper's comparison)."""
    lines = [title, "", "| stage | d | speed-up of | " + " | ".join(f"N={n}" for n in ns) + " |",
             "| --- | ---: | --- |" + " ---: |" * len(ns)]
    what = [("skipping", "1", "no_skip", "1"),
            ("diagonal-only masking", "1", "mask_every", "1"),
            ("causal over non-causal", "0", "fast", "1"),
            ("diagonal-only masking, non-causal", "0", "mask_every", "0")]
    for stage in stages:
        for d in sorted({int(r["d"]) for r in rows}):
            for label, causal_off, mode_off, causal_on in what:
                cells = []
                for n in ns:
                    off = causal_ms(rows, stage, d, causal_off, mode_off, n)
                    on = causal_ms(rows, stage, d, causal_on, "fast", n)
                    cells.append(f"×{off / on:.2f}" if off and on else "–")
                if any(c != "–" for c in cells):
                    lines.append(f"| {stage} | {d} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def causal_tflops(rows, stage, ns):
    """One stage's TFLOP/s in every mode, causal and not, against N."""
    lines = [f"**{stage}** (TFLOP/s, 4·B·H·N²·d, halved if causal, in every mode: a mode's "
             "FLOPs are the useful ones)", "",
             "| d | causal | mode | " + " | ".join(f"N={n}" for n in ns) + " |",
             "| ---: | --- | --- |" + " ---: |" * len(ns)]
    for d in sorted({int(r["d"]) for r in rows}):
        for causal in ("0", "1"):
            for mode, label in CAUSAL_MODES.items():
                sel = [r for r in rows if r["stage"] == stage and int(r["d"]) == d
                       and r["causal"] == causal and r["mode"] == mode]
                if not sel:
                    continue
                cells = []
                for n in ns:
                    hit = [r for r in sel if int(r["N"]) == n]
                    cells.append(peer_cell(hit))
                lines.append(f"| {d} | {'yes' if causal == '1' else 'no'} | {mode} ({label}) | "
                             + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


CAUSAL_RULE = ("speed-up = median time with that half of FlashAttention-2's lesson switched off "
               "(CausalMode, common/tile_mask.h) ÷ median time with both on; causal over "
               "non-causal = the non-causal problem's time ÷ the causal one's, the comparison "
               "behind the paper's 1.7–1.8x; B = 16384/N, H = 2048/d, fp32")


def causal_body(rows, stages=None):
    """<!-- results:causal -->: the ablation of causal.csv (causal.py), for the stages
    given (a stage README: its own, with TFLOP/s per mode) or all (README.md)."""
    if not rows:
        return not_recorded("The causal ablation (tile skipping and diagonal-only masking, "
                            "each switched off in turn)", "build causal")
    mine = list(dict.fromkeys(r["stage"] for r in rows
                              if stages is None or r["stage"] in stages))
    if not mine:
        return not_recorded("This stage's causal ablation", "build causal")
    ns = sorted({int(r["N"]) for r in rows})
    parts = [causal_speedups(rows, mine, ns, f"**Causal masking, measured** ({CAUSAL_RULE}):")]
    if stages is not None:
        parts += [causal_tflops(rows, s, ns) for s in mine]
    bad = [r for r in rows if r["stage"] in mine and r["check"] != "ok"]
    if bad:
        parts.append(f"_{len(bad)} run(s) not ok against the fp64 reference: see causal.csv's "
                     "check and note columns._\n")
    plot = "docs/results/plots/causal.png" if stages is None else "../../docs/results/plots/causal.png"
    return ("\n".join(parts) + "\n" + provenance(rows, "causal.csv") + "\n\n"
            f"![Time with skipping or diagonal-only masking off over time with both on]({plot})\n")


# ------------------------------------------------------------------ 05 against 06 split-Q

# split_q_profile.csv's columns in stage 06's table: (column, label, how to show it).
SPLIT_Q_ROWS = [
    ("duration_ns", "time under ncu, ms", "ms"), ("registers", "registers per thread", "int"),
    ("smem_per_block", "shared memory per block, KiB", "kib"),
    ("blocks_limit_registers", "blocks per SM allowed by registers", "int"),
    ("blocks_limit_smem", "blocks per SM allowed by shared memory", "int"),
    ("occupancy_theoretical_pct", "theoretical occupancy, %", "f1"),
    ("occupancy_pct", "achieved occupancy, %", "f1"),
    ("warps_active_per_scheduler", "active warps per scheduler", "f2"),
    ("warps_eligible_per_scheduler", "eligible warps per scheduler", "f2"),
    ("issue_active_pct", "issue slots busy, %", "f1"),
    ("no_issue_pct", "cycles with no issue, %", "f1"), ("ipc", "IPC (warp instr. per cycle)", "f2"),
    ("instructions", "warp instructions", "count"),
    ("ffma_thread_inst", "FFMA (thread instructions)", "count"),
    ("shared_ld_inst", "shared loads (warp instructions)", "count"),
    ("fma_pipe_pct", "FMA pipe busy, %", "f1"),
    ("smem_ld_wavefronts", "shared-load wavefronts", "count"),
    ("smem_ld_conflicts", "bank conflicts, shared loads", "count"),
    ("smem_st_conflicts", "bank conflicts, shared stores", "count"),
    ("local_ld_bytes", "local (spill) bytes loaded", "count"),
] + [(f"stall_{s}", f"stall: {s.replace('_', ' ')}, cycles per issue", "f2")
     for s in ("barrier", "long_scoreboard", "short_scoreboard", "wait", "math_pipe_throttle",
               "mio_throttle", "not_selected", "dispatch_stall", "no_instruction",
               "branch_resolving", "lg_throttle")]


def show_counter(v, how):
    if v in ("", None):
        return "–"
    x = float(v)
    return {"ms": f"{x / 1e6:.3g}", "int": f"{x:.0f}", "kib": f"{x / 1024:.1f}",
            "f1": f"{x:.1f}", "f2": f"{x:.2f}", "count": count(x)}[how]


def split_q_profile_body(rows):
    """stages/06_warp_split/README.md's <!-- results:split_q_profile -->: stage 05 and
    split-Q side by side under ncu (split_q_profile.py), with split-Q over 05."""
    if not rows:
        return ("_Not profiled yet; on a GPU, `python3 tests/bench/split_q_profile.py "
                "--flashstep build/stages/cli/flashstep --out docs/results/split_q_profile.csv` "
                "records it, then `python3 tests/bench/tables.py`._\n")
    out = []
    for d in sorted({int(r["d"]) for r in rows}):
        mine = [r for r in rows if int(r["d"]) == d]
        a = next((r for r in mine if r["stage"] == "05_sequence_parallel"), None)
        b = next((r for r in mine if r["stage"] == "06_warp_split_q"), None)
        r0 = mine[0]
        lines = [f"**d = {d}**, N = {r0['N']}, B = {r0['B']}, H = {r0['H']}, non-causal, one run "
                 "each under `ncu --clock-control none`:", "",
                 "| counter | 05_sequence_parallel | 06_warp_split_q | 06 ÷ 05 |",
                 "| --- | ---: | ---: | ---: |"]
        for column, label, how in SPLIT_Q_ROWS:
            va, vb = (a or {}).get(column, ""), (b or {}).get(column, "")
            if not va and not vb:
                continue
            ratio = (f"{float(vb) / float(va):.2f}" if va and vb and float(va) != 0 else "–")
            lines.append(f"| {label} | {show_counter(va, how)} | {show_counter(vb, how)} | "
                         f"{ratio} |")
        notes = [f"{r['stage']}: {r['note']}" for r in mine if r.get("note")]
        if notes:
            lines += ["", "_" + "; ".join(notes) + "._"]
        out.append("\n".join(lines) + "\n")
    return "\n".join(out) + "\n" + provenance(rows, "split_q_profile.csv") + "\n"


# backward16.py's implementations, as stage 07's backward tables label them.
BACKWARD16 = {"07_tensor_core": "07_tensor_core (dQ by atomics)",
              "07_tensor_core_deterministic": "07_tensor_core_deterministic",
              "sdpa_flash_bf16": "PyTorch SDPA flash (FlashAttention-2)",
              "sdpa_cudnn_bf16": "PyTorch SDPA cuDNN",
              "sdpa_math_bf16": "PyTorch SDPA math (standard attention)"}


# Issue 13's goal: stage 07's bf16 backward at least FlashAttention-2's from this N on.
BACKWARD_GOAL_N, BACKWARD_GOAL = 1024, 1.0
BACKWARD_GOAL_STAGES = ("07_tensor_core", "07_tensor_core_deterministic")


def backward16_goal(rows):
    """Issue 13's goal per (d, causal): the lowest and highest ratio of each stage 07 backward
    to FlashAttention-2's over N >= BACKWARD_GOAL_N, and whether the faster one meets it."""
    def tflops(stage, d, causal):
        return {int(r["Nq"]): float(r["TFLOP/s"]) for r in rows
                if r["stage"] == stage and r["pass"] == "bwd" and int(r["d"]) == d
                and r["causal"] == causal and r["TFLOP/s"] and int(r["Nq"]) >= BACKWARD_GOAL_N}
    lines = [f"**The goal** (issue 13: bf16 backward, N ≥ {BACKWARD_GOAL_N}, ≥ "
             f"{BACKWARD_GOAL:.1f}x FlashAttention-2's; lowest – highest over N):", "",
             "| d | causal | " + " | ".join(f"{s} ÷ FlashAttention-2" for s in BACKWARD_GOAL_STAGES)
             + " | goal |", "| ---: | --- |" + " ---: |" * len(BACKWARD_GOAL_STAGES) + " --- |"]
    for d in (64, 128):
        for causal in ("0", "1"):
            fa2 = tflops("sdpa_flash_bf16", d, causal)
            cells, best = [], 0.0
            for stage in BACKWARD_GOAL_STAGES:
                mine = tflops(stage, d, causal)
                r = [mine[n] / fa2[n] for n in mine if fa2.get(n)]
                cells.append(f"×{min(r):.2f} – ×{max(r):.2f}" if r else "–")
                best = max(best, min(r)) if r else best
            if all(c == "–" for c in cells):
                continue
            verdict = "met" if best >= BACKWARD_GOAL else f"not met: ×{best:.2f} at best"
            lines.append(f"| {d} | {'yes' if causal == '1' else 'no'} | " + " | ".join(cells)
                         + f" | {verdict} |")
    return "\n".join(lines) + "\n" if len(lines) > 4 else ""


def backward16_summary(rows):
    """README.md's <!-- results:backward16_goal -->: issue 13's goal table alone, with its
    provenance; until backward16.csv is recorded, says so."""
    if not rows:
        return not_recorded("Stage 07's backward sweep (backward16.csv)", "build backward16")
    return backward16_goal(rows) + "\n" + provenance(rows, "backward16.csv") + "\n"


def backward16_body(rows):
    """stages/07_tensor_core/README.md's <!-- results:backward16 -->: TFLOP/s of stage 07's
    bf16 backwards and SDPA's against N, backward alone and forward + backward, with
    07_tensor_core's ratio to FlashAttention-2's; until backward16.csv is recorded, says so."""
    if not rows:
        return not_recorded("Stage 07's backward sweep (backward16.csv)", "build backward16")
    ns = sorted({int(r["Nq"]) for r in rows})
    parts = [backward16_goal(rows)]
    for name, what in (("bwd", "backward"), ("fwd+bwd", "forward + backward")):
        for d in (64, 128):
            for causal in ("0", "1"):
                mine = [r for r in rows if r["pass"] == name and int(r["d"]) == d
                        and r["causal"] == causal]
                if not mine:
                    continue
                by_stage = {s: {int(r["Nq"]): float(r["TFLOP/s"]) for r in mine
                                if r["stage"] == s and r["TFLOP/s"]} for s in BACKWARD16}
                lines = [(label, [f"{by_stage[s][n]:.0f}" if n in by_stage[s] else
                                  peer_cell([r for r in mine if r["stage"] == s
                                             and int(r["Nq"]) == n]) for n in ns])
                         for s, label in BACKWARD16.items()
                         if any(r["stage"] == s for r in mine)]
                if by_stage["07_tensor_core_deterministic"]:  # the cost of determinism
                    lines.append(("deterministic / atomic dQ",
                                  ratio_cells(by_stage["07_tensor_core_deterministic"],
                                              by_stage["07_tensor_core"], ns)))
                if by_stage["sdpa_flash_bf16"]:
                    lines += [(f"{s} / FlashAttention-2",
                               ratio_cells(by_stage[s], by_stage["sdpa_flash_bf16"], ns))
                              for s in BACKWARD_GOAL_STAGES if by_stage[s]]
                title = (f"**bf16 {what}, d = {d}{', causal' if causal == '1' else ''}** "
                         f"(TFLOP/s, {FLOP_FACTORS[name]} x 4·B·H·N²·d, halved if causal; "
                         "B = 16384/N, H = 2048/d)")
                parts.append(table16(title, ns, lines))
    torch_note = (f" _PyTorch {rows[0]['torch']}; SDPA's gradients are reported against fp64 on "
                  "head 0 (N ≤ 4096), not judged; forward + backward is the sum of the two "
                  "medians._" if rows[0].get("torch") else "")
    parts.append(provenance(rows, "backward16.csv") + torch_note + "\n")
    parts.append("![Stage 07's bf16 backwards beside SDPA's: TFLOP/s against N]"
                 "(../../docs/results/plots/backward16_tflops_vs_n.png)\n")
    return "\n".join(parts)


# ablation16.csv's counters in its tables, after the time and the share: the
# hypotheses' counters first (stages/07_tensor_core/README.md, "What the sweep
# says"), then ablation.csv's. Each (column, header, format, summed): a
# counter of events adds up over a backward's kernels; a rate or a per-thread
# figure does not, and its total cell stays empty.
ABLATION16_COLUMNS = [
    ("l2_red_sectors", "L2 red. sectors", "count", True),
    ("local_ld_sectors", "local ld sectors", "count", True),
    ("local_st_sectors", "local st sectors", "count", True),
    ("tensor_active_pct", "tensor active %", "f1", False),
    ("stall_long_scoreboard", "stall: long sb", "f2", False),
    ("registers", "regs", "int", False),
    ("occupancy_pct", "occupancy %", "f1", False),
    ("instructions", "warp instr.", "count", True),
    ("smem_ld_conflicts", "bank confl. ld", "count", True),
    ("smem_st_conflicts", "bank confl. st", "count", True),
    ("smem_ld_wavefronts", "smem wavefr. ld", "count", True),
    ("smem_st_wavefronts", "smem wavefr. st", "count", True),
    *[(c, f"stall: {label}", "f2", False) for c, label in STALL_LABELS.items()
      if c != "stall_long_scoreboard"],
]
ABLATION16_PEER = "sdpa_flash_bf16"  # ablation.py's name for FlashAttention-2's backward


def ablation16_body(rows):
    """stages/07_tensor_core/README.md's <!-- results:ablation16 -->: each kernel of stage
    07's two bf16 backwards and of FlashAttention-2's under ncu (ablation16.csv), a table
    per d: its time, its share of its backward's, the counters, a total row per backward;
    then each backward's total beside FlashAttention-2's. Until recorded, says so."""
    if not rows:
        return not_recorded("The backward's kernels under ncu (ablation16.csv)",
                             "build ablation16")
    # A counter no row has (this ncu did not know it: the notes say so) gets no column.
    columns = [c for c in ABLATION16_COLUMNS if any(r.get(c[0]) for r in rows)]
    r0 = rows[0]
    out = [f"**The backward, kernel by kernel** (ablation16.csv: one bf16 backward each under "
           f"`ncu --clock-control none`, N = {r0['N']}, B = {r0['B']}, H = 2048/d, non-causal): "
           "each kernel's time and share of its backward's, the L2 sectors of reductions "
           "(`lts__t_sectors_op_red`: the atomic adds into dQ's accumulator), the local-memory "
           "sectors loaded and stored (`l1tex__t_sectors_pipe_lsu_mem_local_op_{ld,st}`: the "
           "spills), then ablation.csv's counters. A backward's total row sums its kernels' "
           "times and event counts.", ""]
    for d in sorted({int(r["d"]) for r in rows}):
        mine = [r for r in rows if int(r["d"]) == d]
        head = [f"d = {d}", "kernel", "ms (ncu)", "share"] + [h for _, h, _, _ in columns]
        out += ["| " + " | ".join(head) + " |", "| --- | --- |" + " ---: |" * (len(head) - 2)]
        totals = {}
        for stage, label in BACKWARD16.items():
            kernels = [r for r in mine if r["stage"] == stage]
            timed = [r for r in kernels if r.get("duration_ns")]
            total = sum(float(r["duration_ns"]) for r in timed)
            for r in kernels:
                if not r.get("duration_ns"):
                    out.append(f"| {label} | {r['kernel'] or '–'} | counters unavailable: "
                               f"{r['note']} |" + " |" * (len(head) - 3))
                    continue
                share = f"{100 * float(r['duration_ns']) / total:.1f}%"
                cells = [show_counter(r["duration_ns"], "ms"), share] + [
                    show_counter(r.get(c, ""), how) for c, _, how, _ in columns]
                out.append(f"| {label} | {r['kernel'].rsplit('::', 1)[-1]} | "
                           + " | ".join(cells) + " |")
            if not timed:
                continue
            totals[stage] = total
            sums = [show_counter(sum(float(r[c]) for r in timed if r.get(c)), how)
                    if summed and any(r.get(c) for r in timed) else ""
                    for c, _, how, summed in columns]
            out.append(f"| {label} | **total** | **{show_counter(total, 'ms')}** | 100% | "
                       + " | ".join(sums) + " |")
        out.append("")
        fa2 = totals.get(ABLATION16_PEER)
        for stage, total in totals.items():
            if stage == ABLATION16_PEER:
                continue
            against = (f"; FlashAttention-2's {show_counter(fa2, 'ms')} ms: ×{fa2 / total:.2f} "
                       "its speed" if fa2 else "")
            out.append(f"- d = {d}, {BACKWARD16[stage]}: {show_counter(total, 'ms')} ms in all"
                       + against)
        out.append("")
    notes = sorted({f"{r['stage']}: {r['note']}" for r in rows
                    if r.get("note") and r.get("duration_ns")})
    if notes:
        out += ["_" + "; ".join(notes) + "._", ""]
    peer = [r for r in rows if r["stage"] == ABLATION16_PEER and r.get("torch")]
    out.append(provenance(rows, "ablation16.csv")
               + (f" _FlashAttention-2's backward through PyTorch {peer[0]['torch']}._"
                  if peer else "") + "\n")
    return "\n".join(out)


# backward16.py's FLOP factors: the backward counts 2.5 forwards, forward + backward 3.5.
FLOP_FACTORS = {"bwd": "2.5", "fwd+bwd": "3.5"}


def replace_between(text, tag, body):
    pattern = re.compile(rf"(<!-- {tag}:begin -->\n).*?(<!-- {tag}:end -->)", re.S)
    if not pattern.search(text):
        return text
    return pattern.sub(lambda m: m.group(1) + body + m.group(2), text)


def main():
    global RESULTS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if a README is out of date")
    ap.add_argument("--results", default=RESULTS,
                    help="folder of the CSVs (default: docs/results); e.g. synthetic ones")
    ap.add_argument("--out", help="write the rewritten READMEs under this folder (same paths) "
                                  "instead of in place")
    args = ap.parse_args()
    RESULTS = os.path.abspath(args.results)
    fwd, traffic, peers = fp32_only(read("forward.csv")), read("traffic.csv"), read("peers.csv")
    rows16, ceilings = read("forward16.csv"), read("ceilings.csv")
    stages = list(dict.fromkeys(r["stage"] for r in fwd))
    edits = {}

    readme = os.path.join(ROOT, "README.md")
    body_fwd = ""
    if fwd:
        tables = [forward_table(fwd, stages, d, c, peers) for d in (64, 128)
                  for c in (False, True)]
        body_fwd = "\n".join(tables) + "\n" + provenance(fwd, "forward.csv") + "\n"
        if peers:
            body_fwd += "\n" + peers_provenance(peers) + "\n"
            if peers[0].get("gpu") != fwd[0].get("gpu"):
                print(f"tables: warning: peers.csv is from {peers[0].get('gpu')!r}, "
                      f"forward.csv from {fwd[0].get('gpu')!r}; compare only runs on one GPU",
                      file=sys.stderr)
    traffic32 = fp32_only(traffic)
    body_traffic = (traffic_table(traffic32) + "\n" + provenance(traffic32, "traffic.csv") + "\n"
                    if traffic32 else "")
    body_backward = backward_body()
    body_tc = tensor_core_body(rows16, peers, ceilings)
    rows08 = read("forward08.csv")
    causal, split_q_profile = read("causal.csv"), read("split_q_profile.csv")
    edits[readme] = [("results:causal", causal_body(causal)),
                     ("results:forward", body_fwd), ("results:traffic", body_traffic),
                     ("results:long", long_table(fp32_only(read("long.csv")))),
                     ("results:glance", glance_table(fwd, rows16, rows08)),
                     ("results:backward", body_backward), ("results:tensor_core", body_tc),
                     ("results:hopper", hopper_body(rows08, peers, ceilings, ladder=False)),
                     ("results:backward16_goal", backward16_summary(read("backward16.csv")))]

    for folder in sorted(os.listdir(os.path.join(ROOT, "stages"))):
        path = os.path.join(ROOT, "stages", folder, "README.md")
        if not os.path.exists(path):
            continue
        if folder == HOPPER:
            # Stage 08 runs in 16 bits on Hopper: its sweep beside stage 07, and its ladder.
            edits[path] = [("results", hopper_body(rows08, peers, ceilings)),
                           ("results:ablation", ablation_body(rows08, read("ablation08.csv"),
                                                              peers, LADDER08))]
            continue
        if folder == TENSOR_CORE:
            # Stage 07 runs in 16 bits: its sweep, ladder and tile shapes.
            edits[path] = [("results", sweep16_body(rows16, peers, traffic)),
                           ("results:ablation", ablation_body(rows16, read("ablation.csv"), peers)),
                           ("results:tiles", tiles_body(read("tiles.csv"))),
                           ("results:backward16", backward16_body(read("backward16.csv"))),
                           ("results:ablation16", ablation16_body(read("ablation16.csv"))),
                           ("results:tensor_core", body_tc)]
            continue
        mine = [s for s in stages if s.startswith(folder[:3])]
        parts = []
        for s in mine:
            parts.append(f"**{s}**\n\n" + time_table(fwd, s))
        t = traffic_table(traffic32, mine)
        if t:
            parts.append(t)
        if parts:
            parts.append(provenance(fwd or traffic32, "forward.csv" if fwd else "traffic.csv"))
        # A stage README may also carry the whole sweep with the peers
        # (stage 06 does: its target is the fp32 peer).
        edits[path] = [("results", "\n".join(parts) + ("\n" if parts else "")),
                       ("results:forward", body_fwd), ("results:backward", body_backward),
                       ("results:causal", causal_body(causal, [s for s in CAUSAL_STAGES
                                                               if s.startswith(folder[:3])])),
                       ("results:split_q_profile", split_q_profile_body(split_q_profile))]

    # The docs pages: stage 08's goal table beside the paper's description, and
    # stage 07's backward against FlashAttention-2's beside Algorithm 2.
    edits[os.path.join(ROOT, "docs", "stage08.md")] = [
        ("results:goal", hopper_goal_block(rows08, peers))]
    edits[os.path.join(ROOT, "docs", "backward.md")] = [
        ("results:backward16_goal", backward16_summary(read("backward16.csv")))]

    # The course track's benchmark (course_bench.py) in its assignment page.
    from course_tables import course_edits
    edits.update(course_edits(ROOT, read))
    # Stage 10, ring attention (ring.py), in README.md and the stage's README.
    from ring_tables import ring_edits
    for path, subs in ring_edits(ROOT, read).items():
        edits.setdefault(path, []).extend(subs)

    # Stage 09, decoding (decode.py), in README.md and the stage's README.
    from decode_tables import decode_edits
    for path, subs in decode_edits(ROOT, read).items():
        edits.setdefault(path, []).extend(subs)
    # Prefill with grouped heads (gqa_prefill.py), in stage 09's README.
    from gqa_tables import gqa_edits
    for path, subs in gqa_edits(ROOT, read).items():
        edits.setdefault(path, []).extend(subs)
    # The KV cache's layouts (kvcache.py), in stage 09's README.
    from kvcache_tables import kvcache_edits
    for path, subs in kvcache_edits(ROOT, read).items():
        edits.setdefault(path, []).extend(subs)

    stale = []
    for path, subs in edits.items():
        with open(path) as f:
            old = f.read()
        new = old
        for tag, body in subs:
            new = replace_between(new, tag, body)
        rel = os.path.relpath(path, ROOT)
        if args.out:  # every README, changed or not, so that OUT holds the whole set
            os.makedirs(os.path.dirname(os.path.join(args.out, rel)), exist_ok=True)
            with open(os.path.join(args.out, rel), "w") as f:
                f.write(new)
        if new != old:
            stale.append(rel)
            if not args.check and not args.out:
                with open(path, "w") as f:
                    f.write(new)
    if args.check and stale:
        sys.exit("tables: out of date (run python3 tests/bench/tables.py): " + ", ".join(stale))
    if args.out:
        print(f"tables: wrote the READMEs to {args.out}" + (f"; these differ from the repository's: "
              + ", ".join(stale) if stale else ""))
        return
    print(("tables: rewrote " + ", ".join(stale)) if stale else "tables: up to date")


if __name__ == "__main__":
    main()
