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
<!-- results:backward:begin/end --> wherever it appears. The fp32
peers become extra rows of the forward tables, the bf16 peers a table of their
own. Tables are never typed by hand: edit the CSVs by re-running the
benchmarks, then this.

    python3 tests/bench/tables.py [--check]   # --check: fail if a README would change
"""
import argparse
import csv
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RESULTS = os.path.join(ROOT, "docs", "results")

# peers.py's stage names, as the tables label them: fp32 rows join the stages'
# tables; bf16 rows get their own, for reference only.
FP32_PEERS = {"sdpa_efficient_fp32": "PyTorch SDPA mem-efficient fp32",
              "sdpa_math_fp32": "PyTorch SDPA math fp32"}
BF16_PEERS = {"sdpa_flash_bf16": "PyTorch SDPA flash bf16",
              "sdpa_cudnn_bf16": "PyTorch SDPA cuDNN bf16"}


def read(name):
    path = os.path.join(RESULTS, name)
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def gb(x):
    return f"{int(x) / 1e9:.2f}"


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


def peer_cell(hit):
    """A peer's TFLOP/s, or why it has none (OOM: out of memory; –: no kernel)."""
    if not hit:
        return "–"
    if not hit[0]["TFLOP/s"]:
        return "OOM" if hit[0]["note"] == "out of memory" else "–"
    mark = "" if hit[0]["check"] == "ok" else f" ({hit[0]['check']})"
    return f"{float(hit[0]['TFLOP/s']):.2f}{mark}"


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


def bf16_table(peers):
    sel = [r for r in peers if r["stage"] in BF16_PEERS]
    if not sel:
        return ""
    ns = sorted({int(r["Nq"]) for r in sel})
    lines = ["**For reference, bf16** (PyTorch SDPA in bfloat16: half the bytes and tensor "
             "cores, so not comparable with the fp32 rows above; TFLOP/s as above)", "",
             "| peer | d | causal | " + " | ".join(f"N={n}" for n in ns) + " |",
             "| --- | ---: | --- |" + " ---: |" * len(ns)]
    for peer, label in BF16_PEERS.items():
        for d in sorted({int(r["d"]) for r in sel}):
            for causal in ("0", "1"):
                mine = [r for r in sel if r["stage"] == peer and int(r["d"]) == d
                        and r["causal"] == causal]
                if not mine:
                    continue
                cells = [peer_cell([r for r in mine if int(r["Nq"]) == n]) for n in ns]
                lines.append(f"| {label} | {d} | {'yes' if causal == '1' else 'no'} | "
                             + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def peers_provenance(peers):
    r = peers[0]
    return (f"_PyTorch SDPA rows recorded in `docs/results/peers.csv` (tests/bench/peers.py): "
            f"{r.get('gpu') or 'GPU not recorded'}, driver {r['driver']}, {r['date']}, "
            f"commit `{r['commit'][:10]}`, PyTorch {r['torch']}; fp32 with TF32 off; "
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


def glance_table(rows, N=4096, d=64):
    """One reference problem, every stage: modelled HBM bytes beside the time."""
    sel = [r for r in rows if int(r["Nq"]) == N and int(r["d"]) == d and r["causal"] == "0"]
    if not sel:
        return ""
    lines = [f"At N = {N}, d = {d}, B = {sel[0]['B']}, H = {sel[0]['H']}, non-causal:", "",
             "| stage | HBM bytes (model) | median ms | TFLOP/s |",
             "| --- | ---: | ---: | ---: |"]
    for r in sel:
        hbm = int(r["HBM read"]) + int(r["HBM write"])
        lines.append(f"| {r['stage']} | {hbm / 1e9:.1f} GB | {float(r['median ms']):.3g} | "
                     f"{float(r['TFLOP/s']):.1f} |")
    return "\n".join(lines) + "\n\n" + provenance(rows, "forward.csv") + "\n"


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


def replace_between(text, tag, body):
    pattern = re.compile(rf"(<!-- {tag}:begin -->\n).*?(<!-- {tag}:end -->)", re.S)
    if not pattern.search(text):
        return text
    return pattern.sub(lambda m: m.group(1) + body + m.group(2), text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if a README is out of date")
    args = ap.parse_args()
    fwd, traffic, peers = read("forward.csv"), read("traffic.csv"), read("peers.csv")
    stages = list(dict.fromkeys(r["stage"] for r in fwd))
    edits = {}

    readme = os.path.join(ROOT, "README.md")
    body_fwd = ""
    if fwd:
        tables = [forward_table(fwd, stages, d, c, peers) for d in (64, 128)
                  for c in (False, True)]
        bf16 = bf16_table(peers)
        if bf16:
            tables.append(bf16)
        body_fwd = "\n".join(tables) + "\n" + provenance(fwd, "forward.csv") + "\n"
        if peers:
            body_fwd += "\n" + peers_provenance(peers) + "\n"
            if peers[0].get("gpu") != fwd[0].get("gpu"):
                print(f"tables: warning: peers.csv is from {peers[0].get('gpu')!r}, "
                      f"forward.csv from {fwd[0].get('gpu')!r}; compare only runs on one GPU",
                      file=sys.stderr)
    body_traffic = (traffic_table(traffic) + "\n" + provenance(traffic, "traffic.csv") + "\n"
                    if traffic else "")
    body_backward = backward_body()
    edits[readme] = [("results:forward", body_fwd), ("results:traffic", body_traffic),
                     ("results:long", long_table(read("long.csv"))),
                     ("results:glance", glance_table(fwd)),
                     ("results:backward", body_backward)]

    for folder in sorted(os.listdir(os.path.join(ROOT, "stages"))):
        path = os.path.join(ROOT, "stages", folder, "README.md")
        if not os.path.exists(path):
            continue
        mine = [s for s in stages if s.startswith(folder[:3])]
        parts = []
        for s in mine:
            parts.append(f"**{s}**\n\n" + time_table(fwd, s))
        t = traffic_table(traffic, mine)
        if t:
            parts.append(t)
        if parts:
            parts.append(provenance(fwd or traffic, "forward.csv" if fwd else "traffic.csv"))
        # A stage README may also carry the whole sweep with the peers
        # (stage 06 does: its target is the fp32 peer).
        edits[path] = [("results", "\n".join(parts) + ("\n" if parts else "")),
                       ("results:forward", body_fwd), ("results:backward", body_backward)]

    stale = []
    for path, subs in edits.items():
        with open(path) as f:
            old = f.read()
        new = old
        for tag, body in subs:
            new = replace_between(new, tag, body)
        if new != old:
            stale.append(os.path.relpath(path, ROOT))
            if not args.check:
                with open(path, "w") as f:
                    f.write(new)
    if args.check and stale:
        sys.exit("tables: out of date (run python3 tests/bench/tables.py): " + ", ".join(stale))
    print(("tables: rewrote " + ", ".join(stale)) if stale else "tables: up to date")


if __name__ == "__main__":
    main()
