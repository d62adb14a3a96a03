#!/usr/bin/env python3
"""Draws the results plots (PNG) from the recorded CSVs.

Reads docs/results/forward.csv (sweep.py), peers.csv (peers.py), traffic.csv
(traffic.py), ceilings.csv (ceilings.py), backward.csv and backward_memory.csv
(backward.py) and writes to docs/results/plots/:

  time_vs_n.png            median time against N, every stage and the fp32 SDPA peers
  tflops_vs_n.png          TFLOP/s against N, the same runs
  hbm_vs_n.png             modelled HBM bytes against N; ncu's DRAM and requested bytes
  roofline.png             the measured ceilings, each stage at one reference problem
  backward_tflops_vs_n.png the backward's TFLOP/s against N: stages 02, 05, fp32 SDPA
  backward_memory.png      forward + backward device memory against N at B = 1: what
                           stages 02 and 05 allocate (`flashstep model --backward`),
                           SDPA's measured peaks, each backward's largest N

and from forward16.csv (sweep.py --dtype bf16: stage 07 and stages 02, 03 in
16 bits), with the 16-bit peers and ablation.csv (ablation.py), once recorded:

  bf16_tflops_vs_n.png     the FlashAttention-2 paper's forward figure on this GPU, in
                           bf16: standard attention (stage 02, SDPA math),
                           FlashAttention-1's loop order (stage 03), FlashAttention-2
                           (stage 07, SDPA flash) and cuDNN, TFLOP/s per N
  ablation.png             each step of stage 07's ladder at N = 4096: TFLOP/s and its
                           gain, beside FlashAttention-2; under it, where the warps stall

and from causal.csv (causal.py), once recorded:

  causal.png               stages 03-06 with tile skipping, then diagonal-only masking,
                           switched off: time off ÷ time on against N, per d

and from decode.csv (decode.py: stage 09 and SDPA on decoding problems), once recorded:

  decode_bandwidth.png     achieved bandwidth as a share of the copy ceiling against Nk,
                           B = 1, per type, Nq and H_kv: split-KV, one block, the fastest
                           SDPA backend in that type

and from ring.csv (ring.py: stage 10 on several GPUs), once recorded:

  ring_scaling.png         weak scaling's efficiency against tokens per GPU, and strong
                           scaling's speed-up against GPUs, non-causal and causal with
                           contiguous and zig-zag chunks

The fp32 plots show fp32 rows only (a row without a dtype column is fp32).

and from forward08.csv (sweep.py --stage 07_tensor_core,08: stage 08's ladder beside
stage 07), with the bf16 peers, once recorded:

  hopper_tflops_vs_n.png   bf16 TFLOP/s against N: 07_tensor_core and each step of stage
                           08, SDPA's FlashAttention-2 and cuDNN

and from backward16.csv (backward16.py: stage 07's bf16 backwards beside SDPA's, in one run):

  backward16_tflops_vs_n.png  bf16 backward TFLOP/s against N: both dQ variants of stage 07,
                           SDPA's FlashAttention-2, cuDNN and math backwards

and plots.json, the fingerprint (sha256) of the CSVs and of this script the
PNGs were drawn from, and the stages' modelled memory that backward_memory.png
shows, with the hashes of the sources that model comes from. Like tables.py,
nothing here is typed by hand: rerun the benchmarks, then this. `--check`
needs no matplotlib and no build: it fails when a CSV, this script or one of
those model sources changed since the PNGs were drawn, when a PNG is missing,
or when a README (README.md, stages/*/README.md) shows a plot that is not
generated. PNG bytes are not compared (they differ between matplotlib versions).

    python3 tests/bench/plots.py [--check] [--flashstep build/stages/cli/flashstep]
    python3 tests/bench/plots.py --results DIR   # other CSVs; PNGs and plots.json to DIR/plots

Needs matplotlib (Debian: python3-matplotlib; `make deps` installs it), and for
the stages' lines in backward_memory.png the built CLI (without it they are left
out and the title says so).
"""
import argparse
import hashlib
import json
import math
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tables  # noqa: E402
from ablation import PEER as ABLATION_PEER, STEPS  # noqa: E402
from ablation import HOPPER_STEPS  # noqa: E402
from tables import (ABLATION_N, BACKWARD16, BACKWARD_LABELS, CUDNN_PEER, FA2_PEER,  # noqa: E402
                    FP32_PEERS,
                    PEERS16, ROOT, STALL_LABELS, TENSOR_CORE, dtype_of, fp32_only, has_ablation,
                    read, same_gpu)

# Where the CSVs are read and the plots written (--results changes both).
RESULTS = tables.RESULTS
PLOTS = os.path.join(RESULTS, "plots")
SIDECAR = os.path.join(PLOTS, "plots.json")
INPUTS = ("forward.csv", "peers.csv", "traffic.csv", "ceilings.csv", "backward.csv",
          "backward_memory.csv", "forward16.csv", "ablation.csv", "causal.csv", "ring.csv",
          "decode.csv", "forward08.csv", "backward16.csv")
FLASHSTEP = os.path.join(ROOT, "build", "stages", "cli", "flashstep")
# backward_memory.png: the stages whose allocation the CLI's model gives, the
# N it is drawn at (B = 1, H = 2048/d, as backward_memory.csv), and the sources
# that allocation comes from: each file whole, or (file, function) for the one
# function of a file that matters. --check compares their hashes.
MEMORY_STAGES = ("02_safe_softmax", "05_sequence_parallel")
MEMORY_NS = [2 ** k for k in range(9, 22)]  # 512 ... 2^21
MEMORY_SOURCES = ("stages/02_safe_softmax/safe_softmax_model.cpp",
                  "stages/05_sequence_parallel/sequence_parallel_model.cpp",
                  "stages/05_sequence_parallel/sequence_parallel_backward_model.cpp",
                  ("stages/common/device.cpp", "device_bytes_needed"))

# Fixed size and resolution, no timestamp or version in the file: the same
# CSVs and the same matplotlib give the same bytes.
DPI = 100
PNG_METADATA = {"Software": None}
# The roofline's reference problem: the README's "at a glance" table's.
REF_N, REF_D = 4096, 64
# Datasheet fp32 FMA peak (dense, non-tensor) in TFLOP/s, drawn dashed on the
# roofline for the GPUs listed; any other GPU gets its measured ceilings only.
DATASHEET_FP32_TFLOPS = {"NVIDIA H200": 67.0, "NVIDIA H100 80GB HBM3": 67.0}
FLOP_RULE = "FLOPs = 4·B·H·N²·d, halved if causal"
BACKWARD_FLOP_RULE = "FLOPs = 2.5 × 4·B·H·N²·d, halved if causal"
SWEEP_RULE = "B = 16384/N, H = 2048/d"

# One look per series, the same in every plot: colour by stage, and a marker
# and line style so that series lying on top of each other (04 and 05 share a
# traffic model) stay apart.
STAGE_STYLE = [("C0", "o", "-"), ("C1", "s", "--"), ("C2", "^", "-"), ("C3", "v", "--"),
               ("C4", "D", "-"), ("C5", "P", "-"), ("C6", "X", ":"), ("C7", "*", "-"),
               ("C8", "h", "--"), ("C9", "<", "-")]
PEER_STYLE = {"sdpa_efficient_fp32": ("black", None, "--"),
              "sdpa_math_fp32": ("0.55", None, ":")}


# ------------------------------------------------------------------ fingerprint

def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def fingerprint():
    """What the PNGs are drawn from: each present CSV's hash, rows and commit, and this script."""
    inputs = {}
    for name in INPUTS:
        path = os.path.join(RESULTS, name)
        if os.path.exists(path):
            rows = read(name)
            inputs[name] = {"sha256": sha256(path), "rows": len(rows),
                            "commit": rows[0].get("commit", "")[:10] if rows else ""}
    return {"inputs": inputs, "generator": {"tests/bench/plots.py": sha256(os.path.abspath(__file__))}}


def readme_plots():
    """docs/results/plots/*.png paths that README.md and the stages' READMEs show."""
    readmes = [os.path.join(ROOT, "README.md")]
    stages = os.path.join(ROOT, "stages")
    readmes += sorted(os.path.join(stages, f, "README.md") for f in os.listdir(stages)
                      if os.path.exists(os.path.join(stages, f, "README.md")))
    shown = set()
    for path in readmes:
        with open(path) as f:
            shown |= set(re.findall(r"docs/results/plots/([\w.-]+\.png)", f.read()))
    return sorted(shown)


def model_sources():
    """sha256 of each MEMORY_SOURCES entry (of the function's text alone where one is named)."""
    out = {}
    for src in MEMORY_SOURCES:
        path, func = (src, None) if isinstance(src, str) else src
        full = os.path.join(ROOT, path)
        if not os.path.exists(full):
            out[path] = "missing"
            continue
        with open(full, "rb") as f:
            text = f.read()
        key = path
        if func:
            key = f"{path}:{func}"
            # From the definition's first line to the first closing brace in column 0;
            # the whole file if the function is not found that way.
            m = re.search(rb"^[^\n]*\b" + func.encode() + rb"\([^;]*?\{.*?^\}", text, re.S | re.M)
            text = m.group(0) if m else text
        out[key] = hashlib.sha256(text).hexdigest()
    return out


def check():
    """Problems that make the PNGs stale or missing (empty when up to date)."""
    if not os.path.exists(SIDECAR):
        return [f"{os.path.relpath(SIDECAR, ROOT)} is missing"]
    with open(SIDECAR) as f:
        recorded = json.load(f)
    now = fingerprint()
    problems = []
    for name in sorted(set(recorded["inputs"]) | set(now["inputs"])):
        if recorded["inputs"].get(name, {}).get("sha256") != now["inputs"].get(name, {}).get("sha256"):
            problems.append(f"docs/results/{name} changed since the plots were drawn")
    if recorded["generator"] != now["generator"]:
        problems.append("tests/bench/plots.py changed since the plots were drawn")
    model = recorded.get("memory model")
    if model:  # drawn with the CLI's model: its sources must be the same
        current = model_sources()
        for src in sorted(set(model["sources"]) | set(current)):
            if model["sources"].get(src) != current.get(src):
                problems.append(f"{src} (the model of backward_memory.png) changed since the "
                                "plots were drawn")
    for png in recorded["outputs"]:
        if not os.path.exists(os.path.join(PLOTS, png)):
            problems.append(f"docs/results/plots/{png} is missing")
    for png in readme_plots():
        if png not in recorded["outputs"]:
            problems.append(f"a README shows docs/results/plots/{png}, which plots.py does not draw")
    return problems


# ------------------------------------------------------------------ data

def num(x):
    return float(x) if x not in ("", None) else None


def provenance(rows, name):
    r = rows[0]
    return f"{name}: {r.get('gpu') or 'GPU not recorded'}, {r['date']}, commit {r['commit'][:10]}"


def series(rows, stage, d, causal, key):
    """(N, value) pairs of one stage on one (d, causal), N ascending, empty cells left out."""
    pts = [(int(r["Nq"]), num(r[key])) for r in rows
           if r["stage"] == stage and int(r["d"]) == d and r["causal"] == str(int(causal))]
    return sorted((n, v) for n, v in pts if v is not None)


def stage_styles(stages):
    return {s: STAGE_STYLE[k % len(STAGE_STYLE)] for k, s in enumerate(stages)}


def stage_zorder(stages):
    """Broken lines over solid ones: where two stages coincide (01 and 02, 04 and 05), both show."""
    styles = stage_styles(stages)
    return {s: (2.5 if styles[s][2] != "-" else 2) + 0.01 * (len(stages) - k)
            for k, s in enumerate(stages)}


# ------------------------------------------------------------------ drawing

def log2_n_axis(ax, ns):
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns)
    ax.set_xticklabels([f"{n // 1024}k" if n >= 1024 else str(n) for n in ns])
    ax.set_xlabel("sequence length N")
    ax.grid(True, which="major", alpha=0.3)


def save(fig, name, out):
    path = os.path.join(out, name)
    fig.savefig(path, dpi=DPI, metadata=PNG_METADATA)
    import matplotlib.pyplot as plt
    plt.close(fig)
    print(f"plots: wrote {os.path.relpath(path, ROOT)}")


def sweep_figure(fwd, peers, key, ylabel, title, logy, style_order=None, labels=None,
                 src=None, source="forward.csv", ncol=5):
    """2 x 2 panels (d x causal) of `key` against N for every stage and fp32 peer.

    style_order: the stage list the colours come from (default fwd's own), so a
    stage looks the same in every plot; labels: legend names of stages; src: the
    provenance line. Points whose run was not checked against fp64 are drawn open.
    """
    import matplotlib.pyplot as plt
    stages = list(dict.fromkeys(r["stage"] for r in fwd))
    order = list(style_order or stages)
    order += [s for s in stages if s not in order]
    styles, zorder = stage_styles(order), stage_zorder(order)
    labels = labels or {}
    ns = sorted({int(r["Nq"]) for r in fwd})
    unchecked = {(r["stage"], int(r["d"]), r["causal"], int(r["Nq"])) for r in list(fwd) + list(peers)
                 if r.get("check", "ok") not in ("ok", "")}
    fig, axes = plt.subplots(2, 2, figsize=(13, 9.5), sharex=True)
    handles = {}
    for i, d in enumerate((64, 128)):
        for j, causal in enumerate((False, True)):
            ax = axes[i][j]
            for s in stages:
                pts = series(fwd, s, d, causal, key)
                if pts:
                    c, m, ls = styles[s]
                    open_ = [k for k, (n, _) in enumerate(pts)
                             if (s, d, str(int(causal)), n) in unchecked]
                    (h,) = ax.plot(*zip(*pts), color=c, marker=m, linestyle=ls,
                                   label=labels.get(s, s), zorder=zorder[s],
                                   markevery=[k for k in range(len(pts)) if k not in open_])
                    handles.setdefault(labels.get(s, s), h)
                    if open_:
                        ax.plot([pts[k][0] for k in open_], [pts[k][1] for k in open_],
                                linestyle="none", marker=m, color=c, markerfacecolor="white",
                                zorder=zorder[s] + 0.1)
            for p, label in FP32_PEERS.items():
                pts = series(peers, p, d, causal, key)
                if pts:
                    c, m, ls = PEER_STYLE[p]
                    (h,) = ax.plot(*zip(*pts), color=c, linestyle=ls, linewidth=2, label=label)
                    handles.setdefault(label, h)
            ax.set_title(f"d = {d}, {'causal' if causal else 'non-causal'}")
            log2_n_axis(ax, ns)
            if not ax.lines:
                ax.text(0.5, 0.5, f"not in {source}", transform=ax.transAxes,
                        ha="center", va="center", color="0.4")
                ax.set_yticks([])
                continue
            if logy:
                ax.set_yscale("log")
            else:
                ax.set_ylim(bottom=0)
            if j == 0:
                ax.set_ylabel(ylabel)
            ax.tick_params(labelbottom=True)
    if unchecked:
        first = min(n for *_, n in unchecked)
        peers_too = any(s in FP32_PEERS for s, *_ in unchecked)
        (h,) = ax.plot([], [], linestyle="none", marker="o", color="black", markerfacecolor="white")
        handles[f"open marker: not checked against fp64 (N ≥ {first}"
                + ("; SDPA's runs there neither)" if peers_too else ")")] = h
    if src is None:
        src = provenance(fwd, "forward.csv") + (f"; {provenance(peers, 'peers.csv')}" if peers else "")
    fig.suptitle(f"{title}\n{src}", fontsize=11)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=ncol, fontsize=9,
               frameon=False)
    rows = -(-len(handles) // ncol)
    fig.tight_layout(rect=(0, 0.035 + 0.0175 * rows, 1, 1))
    return fig


def hbm_figure(fwd, traffic):
    """Top: modelled HBM bytes against N (non-causal). Bottom: model, requested, DRAM at ncu's N."""
    import matplotlib.pyplot as plt
    stages = list(dict.fromkeys(r["stage"] for r in fwd))
    styles, zorder = stage_styles(stages), stage_zorder(stages)
    ns = sorted({int(r["Nq"]) for r in fwd})
    tr_ok = [r for r in fp32_only(traffic) if r["dram_read"] and r["stage"] in stages]
    fig, axes = plt.subplots(2 if tr_ok else 1, 2, figsize=(13, 10 if tr_ok else 5.5),
                             squeeze=False)
    handles = {}
    for j, d in enumerate((64, 128)):
        ax = axes[0][j]
        for s in stages:
            pts = [(int(r["Nq"]), (int(r["HBM read"]) + int(r["HBM write"])) / 1e9) for r in fwd
                   if r["stage"] == s and int(r["d"]) == d and r["causal"] == "0"]
            if pts:
                c, m, ls = styles[s]
                (h,) = ax.plot(*zip(*sorted(pts)), color=c, marker=m, linestyle=ls, label=s,
                               zorder=zorder[s])
                handles.setdefault(s, h)
        mine = [r for r in tr_ok if int(r["d"]) == d]
        for r in mine:
            c, m, ls = styles.get(r["stage"], ("k", "o", "-"))
            dram = (int(r["dram_read"]) + int(r["dram_write"])) / 1e9
            ax.scatter([int(r["N"])], [dram], s=110, facecolors="none", edgecolors=c,
                       linewidths=2, marker=m, zorder=3)
        if mine:  # one neutral legend entry for all stages' open markers
            (h,) = ax.plot([], [], linestyle="none", marker="o", markersize=10,
                           markerfacecolor="none", markeredgecolor="black", markeredgewidth=2)
            handles.setdefault(f"ncu DRAM read + write at N = {mine[0]['N']} "
                               "(open markers, stage colours)", h)
        ax.set_yscale("log")
        ax.set_title(f"d = {d}, non-causal: model (lines)"
                     + (", ncu DRAM (open markers)" if mine else ""), fontsize=11)
        log2_n_axis(ax, ns)
        if j == 0:
            ax.set_ylabel("HBM bytes, read + write (GB, log)")

        if not tr_ok:
            continue
        ax = axes[1][j]
        bars = [r for r in tr_ok if int(r["d"]) == d]
        width = 0.27
        kinds = [("model", "model_read", "model_write", "0.25", None),
                 ("ncu requested (L1 global ld+st)", "requested_read", "requested_write", "0.6", None),
                 ("ncu DRAM read + write", "dram_read", "dram_write", "white", "//")]
        for k, (label, rd, wr, colour, hatch) in enumerate(kinds):
            xs = [i + (k - 1) * width for i in range(len(bars))]
            ys = [(int(r[rd]) + int(r[wr])) / 1e9 for r in bars]
            h = ax.bar(xs, ys, width, color=colour, edgecolor="black", hatch=hatch, label=label)
            handles.setdefault(label, h)
        ax.set_xticks(range(len(bars)))
        ax.set_xticklabels([r["stage"] for r in bars], rotation=30, ha="right", fontsize=9)
        ax.set_yscale("log")
        ax.grid(True, axis="y", alpha=0.3)
        if bars:
            ax.set_title(f"d = {d}, N = {bars[0]['N']}, B = {bars[0]['B']}, H = {bars[0]['H']}: "
                         "what ncu counted")
        if j == 0:
            ax.set_ylabel("GB, read + write (log)")
    src = provenance(fwd, "forward.csv") + (f"; {provenance(traffic, 'traffic.csv')}"
                                            if tr_ok else "")
    if tr_ok:
        what = "modelled and measured with ncu"
    elif traffic:
        what = f"modelled (ncu read no counters: {traffic[0]['note'][:60]})"
    else:
        what = "modelled (no traffic.csv: run tests/bench/traffic.py)"
    fig.suptitle(f"HBM traffic of the forward pass, {what} (fp32; {SWEEP_RULE})\n{src}",
                 fontsize=11)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=5, fontsize=9,
               frameon=False)
    fig.tight_layout(rect=(0, 0.06 if tr_ok else 0.1, 1, 1))
    return fig


def roofline_figure(fwd, peers, ceilings):
    """Measured ceilings, and each stage at (FLOPs / modelled bytes, measured TFLOP/s)."""
    import matplotlib.pyplot as plt
    ceil = {r["ceiling"]: r for r in ceilings}
    bw = float(ceil["copy"]["value"]) if "copy" in ceil else None            # TB/s
    gemm = float(ceil["sgemm"]["value"]) if "sgemm" in ceil else None        # TFLOP/s
    fma = float(ceil["fma"]["value"]) if "fma" in ceil else None             # TFLOP/s
    gpu = ceilings[0].get("gpu", "")
    sheet = DATASHEET_FP32_TFLOPS.get(gpu)
    stages = list(dict.fromkeys(r["stage"] for r in fwd))
    styles = stage_styles(stages)
    ref = [r for r in fwd if int(r["Nq"]) == REF_N and int(r["d"]) == REF_D and r["causal"] == "0"]

    fig, ax = plt.subplots(figsize=(11, 7.5))
    x_lo, x_hi = 1.0, 300.0
    xs = [x_lo * (x_hi / x_lo) ** (k / 200) for k in range(201)]
    tops = [t for t in (fma, gemm, sheet) if t]
    # The compute roof: the measured fp32 FMA throughput where ceilings.csv has it,
    # else cuBLAS's fp32 GEMM; the other measured one (GEMM) then a thin line.
    roof = fma or gemm
    if bw:
        if fma:
            solid = f"measured: copy {bw:g} TB/s, fp32 FMA {fma:g} TFLOP/s"
        else:
            solid = f"measured: copy {bw:g} TB/s, cuBLAS fp32 GEMM {gemm:g} TFLOP/s" if gemm else ""
        for top, style, label in ((roof, "-", solid),
                                  (sheet, "--", f"datasheet fp32 FMA peak {sheet:g} TFLOP/s")):
            if top:
                ax.plot(xs, [min(bw * x, top) for x in xs], color="black", linestyle=style,
                        linewidth=2 if style == "-" else 1.2, label=label)
        if fma and gemm:
            ax.plot(xs, [min(bw * x, gemm) for x in xs], color="0.45", linestyle="-",
                    linewidth=1, label=f"measured: cuBLAS fp32 GEMM {gemm:g} TFLOP/s")
        if roof:
            ridge = roof / bw
            ax.axvline(ridge, color="black", alpha=0.25, linewidth=1)
            ax.annotate(f"ridge {ridge:.0f} FLOP/B", (ridge, 1.5 * max(tops)), xytext=(4, 0),
                        textcoords="offset points", fontsize=9, alpha=0.7)
    for r in ref:
        flops = 4.0 * int(r["B"]) * int(r["H"]) * int(r["Nq"]) * int(r["Nk"]) * int(r["d"])
        hbm = int(r["HBM read"]) + int(r["HBM write"])
        c, m, _ = styles[r["stage"]]
        ax.scatter([flops / hbm], [float(r["TFLOP/s"])], s=120, color=c, marker=m,
                   edgecolors="black", linewidths=0.6, zorder=3,
                   label=f"{r['stage']}: {flops / hbm:.1f} FLOP/B, {float(r['TFLOP/s']):.1f} TFLOP/s")
    for p, label in FP32_PEERS.items():
        hit = [r for r in peers if r["stage"] == p and int(r["Nq"]) == REF_N
               and int(r["d"]) == REF_D and r["causal"] == "0" and r["TFLOP/s"]]
        if hit:
            # Dash-dot and dotted, so as not to read as the dashed datasheet roof.
            c, _, ls = PEER_STYLE[p]
            ax.axhline(float(hit[0]["TFLOP/s"]), color=c, linestyle="-." if ls == "--" else ls,
                       linewidth=1,
                       label=f"{label}: {float(hit[0]['TFLOP/s']):.1f} TFLOP/s (its bytes not modelled)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(1, 2 * max(tops + [1]))
    ax.set_xlabel("arithmetic intensity: 4·B·H·N²·d FLOPs / modelled HBM bytes (read + write)")
    ax.set_ylabel("TFLOP/s (measured, 4·B·H·N²·d / median time)")
    ax.grid(True, which="both", alpha=0.2)
    ax.legend(loc="lower right", fontsize=8.5, framealpha=0.95)
    b = ref[0] if ref else {"B": "?", "H": "?"}
    ax.set_title(f"Roofline, fp32 forward at N = {REF_N}, d = {REF_D}, B = {b['B']}, H = {b['H']}, "
                 f"non-causal\n{provenance(fwd, 'forward.csv')}\n{provenance(ceilings, 'ceilings.csv')}",
                 fontsize=10.5)
    fig.tight_layout()
    return fig


def memory_model(flashstep, memory):
    """{d: {stage: [[N, bytes], ...]}}: `flashstep model --backward`'s device memory of
    MEMORY_STAGES at B = 1, H = 2048/d, for N in MEMORY_NS and each stage's largest N in
    backward_memory.csv; None without the binary."""
    if not (flashstep and os.access(flashstep, os.X_OK)):
        return None
    out = {}
    for d in sorted({int(r["d"]) for r in memory} or {64, 128}):
        extra = {int(r["largest N"]) for r in memory
                 if int(r["d"]) == d and r["stage"] in MEMORY_STAGES and r["largest N"]}
        got = out.setdefault(str(d), {s: {} for s in MEMORY_STAGES})
        for n in sorted(set(MEMORY_NS) | extra):
            cmd = [flashstep, "model", "--backward",
                   "--stage", ",".join(s[:2] for s in MEMORY_STAGES), "--B", "1",
                   "--H", str(2048 // d), "--N", str(n), "--d", str(d), "--format", "csv"]
            text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            lines = [ln for ln in text.splitlines() if ln.strip()]
            head = lines[0].split(",")
            for ln in lines[1:]:
                row = dict(zip(head, ln.split(",")))
                if row["stage"] in got:
                    got[row["stage"]][str(n)] = int(row["device memory"])
    out = {d: {s: sorted([int(n), b] for n, b in got.items()) for s, got in by.items()}
           for d, by in out.items()}
    # Sources newer than the binary: its numbers may be the old model's.
    newest = max((os.path.getmtime(os.path.join(ROOT, src if isinstance(src, str) else src[0]))
                  for src in MEMORY_SOURCES
                  if os.path.exists(os.path.join(ROOT, src if isinstance(src, str) else src[0]))),
                 default=0)
    if newest > os.path.getmtime(flashstep):
        print(f"plots: warning: {os.path.relpath(flashstep, ROOT)} is older than the model's "
              "sources; rebuild it (cmake --build build --target flashstep)", file=sys.stderr)
    for r in memory:  # the CSV's modelled rows were the same model at its N
        if r["how"].startswith("allocation (model)") and r["stage"] in MEMORY_STAGES:
            now = dict(out.get(r["d"], {}).get(r["stage"], [])).get(int(r["N"]))
            if now is not None and now != int(r["memory"]):
                print(f"plots: warning: backward_memory.csv has {r['stage']} d = {r['d']} at "
                      f"N = {r['N']}: {r['memory']} bytes, the model now {now}", file=sys.stderr)
    return out


def n_label(n):
    if n >= 2 ** 20:
        return f"{n // 2 ** 20}M"
    return f"{n // 1024}k" if n >= 1024 else str(n)


# Decades of GB on backward_memory.png's y axis, labelled in bytes' units.
BYTE_TICKS = {0.01: "10 MB", 0.1: "100 MB", 1: "1 GB", 10: "10 GB", 100: "100 GB", 1e3: "1 TB",
              1e4: "10 TB", 1e5: "100 TB", 1e6: "1 PB"}
# What grows with N in each stage's allocation (README's Backward table), written by its line.
MEMORY_GROWTH = {"02_safe_softmax": "grows as N²: P and dS, N × N per head",
                 "05_sequence_parallel": "grows as N: Q, K, V, O, their gradients, L and D"}


def memory_figure(memory, model, style_order):
    """Device memory (forward + backward) against N at B = 1, H = 2048/d, one panel per d."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter
    order = list(style_order) + [s for s in MEMORY_STAGES if s not in style_order]
    styles, zorder = stage_styles(order), stage_zorder(order)
    ds = sorted({int(r["d"]) for r in memory})
    fig, axes = plt.subplots(1, len(ds), figsize=(13, 6.8), squeeze=False)
    gpu_bytes = int(memory[0]["gpu memory"]) if memory[0]["gpu memory"] else None
    gpu = memory[0].get("gpu") or "GPU"
    handles = {}
    growth = []  # (axes, stage, points, colour) whose growth is written along the line
    x_lo, x_hi = MEMORY_NS[0] / 1.4, MEMORY_NS[-1] * 1.6
    y_lo, y_hi = 0.005, 5e6  # GB
    for j, d in enumerate(ds):
        ax = axes[0][j]
        mine = [r for r in memory if int(r["d"]) == d]
        if gpu_bytes:
            g = gpu_bytes / 1e9
            ax.axhspan(g, y_hi, color="0.93", zorder=0)
            h = ax.axhline(g, color="firebrick", linewidth=1.5, zorder=1)
            handles.setdefault(f"{gpu} memory, {g:.0f} GB (shaded: does not fit)", h)
        for s in MEMORY_STAGES:
            pts = [(n, b / 1e9) for n, b in (model or {}).get(str(d), {}).get(s, [])]
            if not pts:
                continue
            c, m, ls = styles[s]
            label = f"{BACKWARD_LABELS.get(s, s)}: what it allocates (model)"
            (h,) = ax.plot(*zip(*pts), color=c, marker=m, linestyle=ls, zorder=zorder[s],
                           label=label,
                           markevery=[k for k, (n, _) in enumerate(pts) if n in MEMORY_NS])
            handles.setdefault(label, h)
            if s in MEMORY_GROWTH:
                growth.append((ax, s, pts, c))
        if not model:  # without the CLI, the stages' rows of the CSV: one point each
            for r in mine:
                if r["stage"] in styles and r["memory"]:
                    c, m, _ = styles[r["stage"]]
                    label = (f"{BACKWARD_LABELS.get(r['stage'], r['stage'])}: {r['how']} "
                             f"at N = {int(r['N']):,}")
                    h = ax.scatter([int(r["N"])], [int(r["memory"]) / 1e9], s=70, marker=m,
                                   color=c, zorder=4, label=label)
                    handles.setdefault(label, h)
        for p, label in FP32_PEERS.items():
            hit = [r for r in mine if r["stage"] == p and r["memory"]]
            if hit:
                c, _, _ = PEER_STYLE[p]
                lab = f"{label}: measured peak at N = {int(hit[0]['N']):,}"
                h = ax.scatter([int(hit[0]["N"])], [int(hit[0]["memory"]) / 1e9], s=150, marker="*",
                               color=c, edgecolors="black", linewidths=0.6, zorder=6, label=lab)
                handles.setdefault(lab, h)
        # Each backward's largest N at B = 1: a tick on the GPU's line, its N beside it.
        if gpu_bytes:
            for k, r in enumerate(mine):
                if not r["largest N"]:
                    continue
                n = int(r["largest N"])
                c = styles[r["stage"]][0] if r["stage"] in styles else PEER_STYLE[r["stage"]][0]
                ax.plot([n], [gpu_bytes / 1e9], marker="|", markersize=26, markeredgewidth=3,
                        color=c, zorder=5, linestyle="none")
                extrapolated = r["largest N how"].startswith("extrapolated")
                ax.annotate(f"{n:,}" + ("*" if extrapolated else ""), (n, gpu_bytes / 1e9),
                            xytext=(-5, 16), textcoords="offset points", rotation=90, ha="right",
                            va="bottom", fontsize=8.5, color=c if c != "0.55" else "0.35")
            (h,) = ax.plot([], [], marker="|", markersize=14, markeredgewidth=3, color="black",
                           linestyle="none")
            handles.setdefault("largest N at B = 1 (tick on the GPU's line, N beside it; "
                               "* extrapolated from SDPA's peak)", h)
        ax.set_xscale("log", base=2)
        ax.set_xticks(MEMORY_NS[::2])
        ax.set_xticklabels([n_label(n) for n in MEMORY_NS[::2]])
        ax.set_xticks(MEMORY_NS[1::2], minor=True)
        ax.set_xlim(x_lo, x_hi)
        ax.set_xlabel("sequence length N")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_yscale("log")
        ax.set_ylim(y_lo, y_hi)
        ax.set_yticks(list(BYTE_TICKS))
        ax.set_yticklabels(list(BYTE_TICKS.values()))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.grid(True, which="major", alpha=0.3)
        hh = {int(r["H"]) for r in mine}
        ax.set_title(f"d = {d}, B = 1, H = {hh.pop() if len(hh) == 1 else 2048 // d}", fontsize=11)
        if j == 0:
            ax.set_ylabel("device memory, forward + backward (log)")
    what = ("stages: what they allocate, `flashstep model --backward`" if model else
            "stages' lines left out: no build/stages/cli/flashstep to model them")
    fig.suptitle("fp32 forward + backward device memory (inputs, outputs, gradients, workspaces) "
                 f"against N\n{what}; SDPA: measured\n{provenance(memory, 'backward_memory.csv')}",
                 fontsize=11)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=2, fontsize=9,
               frameon=False)
    fig.tight_layout(rect=(0, 0.13, 1, 1))
    # Each stage's growth in words, parallel to its line just below it, from N = 2^16
    # (02, clear of the largest-N ticks) or 2^12 (05): the angle is the line's on
    # screen, so after the layout.
    for ax, s, pts, c in growth:
        n0 = 2 ** 16 if s == "02_safe_softmax" else 2 ** 12
        xy = dict(pts)
        if n0 not in xy or 2 * n0 not in xy:
            continue
        (x0, y0), (x1, y1) = ax.transData.transform([(n0, xy[n0]), (2 * n0, xy[2 * n0])])
        angle = math.degrees(math.atan2(y1 - y0, x1 - x0))
        ax.annotate(MEMORY_GROWTH[s], (n0, xy[n0]), xytext=(6, -8), textcoords="offset points",
                    rotation=angle, rotation_mode="anchor", ha="left", va="top", fontsize=9,
                    color=c)
    return fig


# ------------------------------------------------------------------ 16 bits: stage 07

# The FlashAttention-2 paper's forward figure, in bf16: (source, stage, legend,
# colour, hatch). Stages 02 and 03 keep their colours of the fp32 plots; the
# peers are hatched, so that what this project built and what it is measured
# against tell apart.
BF16_SERIES = [
    ("stages", "02_safe_softmax", "standard attention: stage 02 bf16", None, None),
    ("peers", "sdpa_math_bf16", "standard attention: PyTorch SDPA math bf16", "0.7", "//"),
    ("stages", "03_fa1_kv_outer", "FlashAttention-1's loop order: stage 03 bf16", None, None),
    ("stages", TENSOR_CORE, "FlashAttention-2: stage 07 bf16", None, None),
    ("peers", FA2_PEER, "FlashAttention-2: PyTorch SDPA flash bf16", "0.25", "//"),
    ("peers", "sdpa_cudnn_bf16", "cuDNN: PyTorch SDPA cuDNN bf16", "C9", "//"),
]
# Stage 07's ladder in shades of one colour, lighter to darker as the steps add up;
# no fp32 stage's colour is among them.
LADDER_SHADES = (0.35, 0.5, 0.65, 0.8, 0.95)


def sixteen_bit_styles(order):
    """Colours of the 16-bit stages: the fp32 plots' for 02 and 03, shades of red for 07's ladder."""
    from matplotlib import colormaps
    colours = {s: c for s, (c, _, _) in stage_styles(order).items()}
    colours.update({s: colormaps["Reds"](x) for s, x in zip(STEPS, LADDER_SHADES)})
    return colours


def bf16_figure(rows16, peers, order):
    """2 x 2 panels (d x causal) of grouped bars, TFLOP/s per N, as the FlashAttention-2
    paper draws its forward figure; out-of-memory runs marked OOM."""
    import matplotlib.pyplot as plt
    colour = sixteen_bit_styles(order)
    sources = {"stages": [r for r in rows16 if dtype_of(r) == "bf16"],
               "peers": [r for r in peers if dtype_of(r) == "bf16"]}
    series = [s for s in BF16_SERIES if any(r["stage"] == s[1] for r in sources[s[0]])]
    ns = sorted({int(r["Nq"]) for r in rows16})
    fig, axes = plt.subplots(2, 2, figsize=(15, 10))
    width = 0.84 / max(len(series), 1)
    handles = {}
    top = max([float(r["TFLOP/s"]) for src in sources.values() for r in src
               if r["TFLOP/s"] and r["stage"] in {s[1] for s in series}] + [1])
    for i, d in enumerate((64, 128)):
        for j, causal in enumerate(("0", "1")):
            ax = axes[i][j]
            for k, (src, stage, label, c, hatch) in enumerate(series):
                xs = [x + (k - (len(series) - 1) / 2) * width for x in range(len(ns))]
                for x, n in zip(xs, ns):
                    hit = [r for r in sources[src] if r["stage"] == stage and int(r["d"]) == d
                           and r["causal"] == causal and int(r["Nq"]) == n]
                    if not hit:
                        continue
                    if not hit[0]["TFLOP/s"]:
                        why = "OOM" if hit[0].get("note") == "out of memory" else "–"
                        ax.text(x, top * 0.01, why, rotation=90, ha="center", va="bottom",
                                fontsize=7, color="0.3")
                        continue
                    v = float(hit[0]["TFLOP/s"])
                    h = ax.bar([x], [v], width, color=c or colour[stage], hatch=hatch,
                               edgecolor="black", linewidth=0.5, label=label)
                    handles.setdefault(label, h)
                    ax.text(x, v + top * 0.01, f"{v:.0f}" if v >= 10 else f"{v:.1f}",
                            rotation=90, ha="center", va="bottom", fontsize=6.5)
            ax.set_xticks(range(len(ns)))
            ax.set_xticklabels([f"{n // 1024}k" if n >= 1024 else str(n) for n in ns])
            ax.set_xlabel("sequence length N")
            ax.set_ylim(0, top * 1.15)
            ax.grid(True, axis="y", alpha=0.3)
            ax.set_title(f"d = {d}, {'causal' if causal == '1' else 'non-causal'}")
            if j == 0:
                ax.set_ylabel("TFLOP/s")
    src = provenance(rows16, "forward16.csv")
    bf16_peers = [r for r in peers if r["stage"] in PEERS16]
    if bf16_peers:
        src += f"; {provenance(bf16_peers, 'peers.csv')}"
    fig.suptitle("bf16 forward, TFLOP/s, the FlashAttention-2 paper's forward figure on this GPU "
                 f"({FLOP_RULE}; {SWEEP_RULE})\n{src}", fontsize=11)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=3, fontsize=9,
               frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


# causal.png: what each mode of causal.csv switches off, and its line style.
CAUSAL_LINES = (("no_skip", "1", "skipping off", "-"),
                ("mask_every", "1", "diagonal-only masking off", "--"),
                ("mask_every", "0", "diagonal-only masking off, non-causal", ":"))


def causal_figure(causal, order):
    """causal.csv: per d, each stage's time with one half of FlashAttention-2's causal
    lesson switched off over its time with both on, against N; and the non-causal
    time over the causal one (the paper's 1.7-1.8x compares those two)."""
    import matplotlib.pyplot as plt

    def ms(stage, d, c, mode, n):
        hit = [r for r in causal if r["stage"] == stage and int(r["d"]) == d and r["causal"] == c
               and r["mode"] == mode and int(r["N"]) == n and r["median ms"]]
        return float(hit[0]["median ms"]) if hit else None

    stages = list(dict.fromkeys(r["stage"] for r in causal))
    styles = stage_styles(order + [s for s in stages if s not in order])
    ns = sorted({int(r["N"]) for r in causal})
    ds = sorted({int(r["d"]) for r in causal})
    fig, axes = plt.subplots(1, len(ds), figsize=(7 * len(ds), 5.5), squeeze=False)
    for ax, d in zip(axes[0], ds):
        for stage in stages:
            colour, marker, _ = styles[stage]
            lines = CAUSAL_LINES + (("fast", "0", "causal over non-causal", "-."),)
            for mode, c, label, dash in lines:
                off_on = [(n, ms(stage, d, c, mode, n), ms(stage, d, "1" if mode == "fast" else c,
                                                           "fast", n)) for n in ns]
                pts = [(n, a / b) for n, a, b in off_on if a and b]
                if pts:
                    ax.plot([n for n, _ in pts], [v for _, v in pts], color=colour, marker=marker,
                            linestyle=dash, label=f"{stage}: {label}")
        ax.axhline(1.0, color="0.5", linewidth=0.8)
        ax.axhspan(1.7, 1.8, color="0.85", label="the paper's 1.7–1.8x (skipping)")
        log2_n_axis(ax, ns)
        ax.set_ylabel("time with it off ÷ time with both on")
        ax.set_title(f"d = {d}")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.suptitle("FlashAttention-2's causal lesson in the fp32 stages: tile skipping and "
                 f"diagonal-only masking, each switched off ({SWEEP_RULE})\n"
                 + provenance(causal, "causal.csv"), fontsize=11)
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.25, 1, 1))
    return fig


# Stall reasons stacked in ablation.png, bottom up, with their colours.
STALL_COLOURS = ["C0", "C1", "C2", "C3", "C4", "C5", "C6"]


# The ladder's bars, by what each step adds (tables.STEP_ADDS says it in full).
LADDER_NAMES = {"07_step1_plain_mma": "step 1: mma.sync", "07_step2_ldmatrix": "2: + ldmatrix",
                "07_step3_cp_async": "3: + cp.async", "07_step4_p_in_registers": "4: + P~ in registers",
                TENSOR_CORE: "07_tensor_core:\n+ tuned tiles"}


def ablation_figure(rows16, peers, ablation):
    """Top: each step's TFLOP/s at N = 4096 (forward16.csv), its gain over the step
    before, FlashAttention-2 beside. Bottom (with ablation.csv): each kernel's warp
    stalls, cycles per issued instruction, stacked by reason."""
    import matplotlib.pyplot as plt
    colour = sixteen_bit_styles([])
    ladder = [r for r in rows16 if r["stage"] in STEPS and dtype_of(r) == "bf16"
              and int(r["Nq"]) == ABLATION_N and r["causal"] == "0"]
    ds = sorted({int(r["d"]) for r in ladder})
    stalls = [c for c in STALL_LABELS if any(r.get(c) for r in ablation)]
    rows_of_panels = 2 if stalls else 1
    fig, axes = plt.subplots(rows_of_panels, len(ds), figsize=(7 * len(ds), 5 + 4 * (rows_of_panels - 1)),
                             squeeze=False)
    names = [LADDER_NAMES[s] for s in STEPS] + ["FlashAttention-2\n(SDPA flash bf16)"]

    def tflops(rows, stage, d):
        hit = [r for r in rows if r["stage"] == stage and int(r["d"]) == d and r["causal"] == "0"
               and int(r["Nq"]) == ABLATION_N and dtype_of(r) == "bf16" and r["TFLOP/s"]]
        return float(hit[0]["TFLOP/s"]) if hit else None

    for j, d in enumerate(ds):
        ax = axes[0][j]
        values = [tflops(rows16, s, d) for s in STEPS] + [tflops(peers, FA2_PEER, d)]
        prev = None
        for k, v in enumerate(values):
            if v is None:
                continue
            peer = k == len(STEPS)
            ax.bar([k], [v], 0.7, color="0.25" if peer else colour[STEPS[k]],
                   hatch="//" if peer else None, edgecolor="black", linewidth=0.5)
            ours = values[len(STEPS) - 1]  # 07_tensor_core's
            if peer:
                gain = f"\n07 at {ours / v:.0%}" if ours and same_gpu(rows16, peers) else ""
            else:
                gain = f"\n×{v / prev:.2f}" if prev else ""
            ax.text(k, v, f"{v:.0f}{gain}", ha="center", va="bottom", fontsize=9)
            if not peer:
                prev = v
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=20, ha="right", fontsize=9)
        ax.set_ylim(0, 1.2 * max([v for v in values if v] + [1]))
        ax.grid(True, axis="y", alpha=0.3)
        b = [r for r in ladder if int(r["d"]) == d][0]
        ax.set_title(f"d = {d}, N = {ABLATION_N}, B = {b['B']}, H = {b['H']}, "
                     "non-causal: TFLOP/s; ×: gain over the step before", fontsize=10)
        if j == 0:
            ax.set_ylabel("TFLOP/s")
        if not stalls:
            continue
        ax = axes[1][j]
        kernels = [*STEPS, ABLATION_PEER]
        bottom = [0.0] * len(kernels)
        for c, col in zip(stalls, STALL_COLOURS):
            ys = []
            for s in kernels:
                hit = [r for r in ablation if r["stage"] == s and int(r["d"]) == d and r.get(c)]
                ys.append(float(hit[0][c]) if hit else 0.0)
            ax.bar(range(len(kernels)), ys, 0.7, bottom=bottom, color=col, edgecolor="black",
                   linewidth=0.4, label=STALL_LABELS[c])
            bottom = [b_ + y for b_, y in zip(bottom, ys)]
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=20, ha="right", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
        ax.set_title(f"d = {d}: warp stalls (ncu), cycles per issued instruction, by reason",
                     fontsize=10)
        if j == 0:
            ax.set_ylabel("stall cycles per instruction")
            ax.legend(fontsize=8, ncol=2, loc="upper right")
    sources = [provenance(rows16, "forward16.csv")]
    fa2 = [r for r in peers if r["stage"] == FA2_PEER]
    if fa2:
        sources.append(provenance(fa2, "peers.csv"))
    if stalls:
        sources.append(provenance(ablation, "ablation.csv"))
    # One source per line: three on one line run past the figure's edges.
    src = "\n".join(sources)
    fig.suptitle(f"Stage 07's ablation ladder, bf16 ({FLOP_RULE})\n{src}", fontsize=11)
    fig.tight_layout()
    return fig


def tflops_panel(ax, ns, d, causal, legend_at):
    """The axes of one (d, causal) panel of TFLOP/s against N, its lines drawn."""
    if ns:
        log2_n_axis(ax, ns)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"d = {d}, {'causal' if causal == '1' else 'non-causal'}")
    ax.legend(fontsize=7, loc=legend_at)


def hopper_figure(rows08, peers):
    """Stage 08: 2 x 2 panels (d x causal) of bf16 TFLOP/s against N, 07_tensor_core and
    each step of stage 08's ladder (forward08.csv, shades of blue as the steps add up),
    SDPA's FlashAttention-2 and cuDNN dashed (peers.csv, when from the same GPU)."""
    import matplotlib.pyplot as plt
    from matplotlib import colormaps
    stages = [r for r in rows08 if dtype_of(r) == "bf16"]
    theirs = [r for r in peers if r["stage"] in (FA2_PEER, CUDNN_PEER)] \
        if same_gpu(rows08, peers) else []
    colour = {s: colormaps["Blues"](0.35 + 0.6 * k / (len(HOPPER_STEPS) - 1))
              for k, s in enumerate(HOPPER_STEPS)}
    colour[TENSOR_CORE] = colormaps["Reds"](LADDER_SHADES[-1])  # stage 07's colour elsewhere
    ns = sorted({int(r["Nq"]) for r in stages})
    fig, axes = plt.subplots(2, 2, figsize=(14, 10))
    for i, d in enumerate((64, 128)):
        for j, causal in enumerate(("0", "1")):
            ax = axes[i][j]
            for stage in HOPPER_STEPS:
                pts = series(stages, stage, d, causal == "1", "TFLOP/s")
                if pts:
                    ax.plot([n for n, _ in pts], [v for _, v in pts], marker="o",
                            color=colour[stage], label=stage)
            for peer, look in ((FA2_PEER, ("0.25", "--")), (CUDNN_PEER, ("C9", "--"))):
                pts = series([r for r in theirs if dtype_of(r) == "bf16"], peer, d,
                             causal == "1", "TFLOP/s")
                if pts:
                    ax.plot([n for n, _ in pts], [v for _, v in pts], color=look[0],
                            linestyle=look[1], marker="s", label=PEERS16[peer])
            tflops_panel(ax, ns, d, causal, "lower right")
    src = provenance(rows08, "forward08.csv")
    if theirs:
        src += f"; {provenance(theirs, 'peers.csv')}"
    fig.suptitle(f"Stage 08 on Hopper, bf16 forward, TFLOP/s ({FLOP_RULE}; {SWEEP_RULE})\n{src}",
                 fontsize=11)
    fig.tight_layout()
    return fig


# backward16_tflops_vs_n.png: each implementation's colour and line style.
BACKWARD16_LOOKS = {"07_tensor_core": ("C3", "-"), "07_tensor_core_deterministic": ("C1", "-"),
                    "sdpa_flash_bf16": ("0.25", "--"), "sdpa_cudnn_bf16": ("C9", "--"),
                    "sdpa_math_bf16": ("0.6", ":")}


def backward16_figure(rows):
    """Stage 07's backward: 2 x 2 panels (d x causal) of bf16 backward TFLOP/s against N,
    both dQ variants solid, SDPA's backwards dashed (backward16.csv, one run)."""
    import matplotlib.pyplot as plt
    bwd = [r for r in rows if r["pass"] == "bwd"]
    ns = sorted({int(r["Nq"]) for r in bwd})
    fig, axes = plt.subplots(2, 2, figsize=(14, 10))
    for i, d in enumerate((64, 128)):
        for j, causal in enumerate(("0", "1")):
            ax = axes[i][j]
            for stage, label in BACKWARD16.items():
                pts = series(bwd, stage, d, causal == "1", "TFLOP/s")
                if pts:
                    colour, style = BACKWARD16_LOOKS[stage]
                    ax.plot([n for n, _ in pts], [v for _, v in pts], color=colour,
                            linestyle=style, marker="o" if style == "-" else "s", label=label)
            tflops_panel(ax, ns, d, causal, "upper left")
    fig.suptitle(f"Stage 07's backward, bf16, TFLOP/s ({BACKWARD_FLOP_RULE}; {SWEEP_RULE})\n"
                 f"{provenance(rows, 'backward16.csv')}", fontsize=11)
    fig.tight_layout()
    return fig


def ring_figure(ring):
    """Stage 10: weak scaling's efficiency (TFLOP/s per GPU over one GPU's, at the same
    tokens per GPU) and strong scaling's speed-up (one GPU's time over P GPUs')."""
    import matplotlib.pyplot as plt
    from ring_tables import VARIANTS, variant
    fig, (weak_ax, strong_ax) = plt.subplots(1, 2, figsize=(12, 4.8))
    styles = dict(zip(VARIANTS, STAGE_STYLE))
    weak = [r for r in ring if r["part"] == "weak"]
    one = {(variant(r), int(r["Nq"])): num(r["TFLOP/s"]) for r in weak if r["gpus"] == "1"}
    for v in VARIANTS:
        for p in sorted({int(r["gpus"]) for r in weak if r["gpus"] != "1"}):
            pts = sorted((int(r["Nq"]) // p, num(r["TFLOP/s per GPU"]) / one[(v, int(r["Nq"]) // p)])
                         for r in weak if variant(r) == v and int(r["gpus"]) == p
                         and one.get((v, int(r["Nq"]) // p)) and num(r["TFLOP/s per GPU"]))
            if pts:
                color, marker, line = styles[v]
                weak_ax.plot([x for x, _ in pts], [100 * y for _, y in pts], color=color,
                             marker=marker, linestyle=line, label=f"{v}, {p} GPUs")
    weak_ax.axhline(90, color="grey", linestyle=":", label="the issue's target, 90%")
    ns = sorted({int(r["Nq"]) // int(r["gpus"]) for r in weak})
    if ns:
        log2_n_axis(weak_ax, ns)
    weak_ax.set_xlabel("tokens per GPU")
    weak_ax.set_ylabel("efficiency, % of one GPU's TFLOP/s per GPU")
    weak_ax.set_title("weak scaling")
    weak_ax.legend(fontsize=8)
    strong = [r for r in ring if r["part"] == "strong"]
    base = {variant(r): num(r["median ms"]) for r in strong if r["gpus"] == "1"}
    gpus = sorted({int(r["gpus"]) for r in strong})
    for v in VARIANTS:
        pts = sorted((int(r["gpus"]), base[v] / num(r["median ms"])) for r in strong
                     if variant(r) == v and base.get(v) and num(r["median ms"]))
        if pts:
            color, marker, line = styles[v]
            strong_ax.plot([x for x, _ in pts], [y for _, y in pts], color=color, marker=marker,
                           linestyle=line, label=v)
    if gpus:
        strong_ax.plot(gpus, gpus, color="grey", linestyle=":", label="ideal")
        strong_ax.set_xticks(gpus)
    n = f"N = {int(strong[0]['Nq']):,}" if strong else "not recorded"
    strong_ax.set_xlabel("GPUs")
    strong_ax.set_ylabel("speed-up over one GPU")
    strong_ax.set_title(f"strong scaling, {n}")
    strong_ax.grid(True, alpha=0.3)
    strong_ax.legend(fontsize=8)
    fig.suptitle("Stage 10, ring attention: B = 1, H = 8, d = 128, bf16, partials by 07_tensor_core"
                 f"\n{provenance(ring, 'ring.csv')}", fontsize=11)
    fig.tight_layout()
    return fig


def decode_figure(decode):
    """Stage 09: bandwidth (ideal bytes over the median time) as a share of the copy
    ceiling against Nk, at B = 1, one panel per Nq, a colour per H_kv; split-KV solid,
    one block dotted, the fastest fp32 SDPA backend dashed."""
    import matplotlib.pyplot as plt
    from decode_tables import ONE, SPLIT, best_peer
    rows = [r for r in decode if r["B"] == "1"]
    nqs = sorted({int(r["Nq"]) for r in rows}) or [1]
    dtypes = [t for t in ("fp32", "bf16", "fp16")
              if any(r["dtype"] == t and r["stage"] == SPLIT for r in rows)] or ["fp32"]
    fig, axes = plt.subplots(len(dtypes), len(nqs), figsize=(7 * len(nqs), 5 * len(dtypes)),
                             squeeze=False)
    for ax, (dtype, nq) in zip(axes.flat, [(t, nq) for t in dtypes for nq in nqs]):
        mine = [r for r in rows if int(r["Nq"]) == nq]
        for k, h_kv in enumerate(sorted({int(r["H_kv"]) for r in mine}, reverse=True)):
            colour = STAGE_STYLE[k % len(STAGE_STYLE)][0]
            at = [r for r in mine if int(r["H_kv"]) == h_kv]
            nks = sorted({int(r["Nk"]) for r in at})
            for stage, dash, label in ((SPLIT, "-", "split-KV"), (ONE, ":", "one block")):
                pts = [(int(r["Nk"]), num(r["of copy"])) for r in at
                       if r["stage"] == stage and r["dtype"] == dtype and num(r.get("of copy"))]
                if pts:
                    pts.sort()
                    ax.plot([x for x, _ in pts], [100 * y for _, y in pts], color=colour,
                            marker="o", linestyle=dash, label=f"H_kv = {h_kv}: {label}")
            best = [(n, best_peer([r for r in at if int(r["Nk"]) == n], dtype)) for n in nks]
            pts = [(n, num(p["of copy"])) for n, p in best if p and num(p.get("of copy"))]
            if pts:
                ax.plot([x for x, _ in pts], [100 * y for _, y in pts], color=colour,
                        linestyle="--", label=f"H_kv = {h_kv}: fastest {dtype} SDPA")
        ax.axhline(85, color="grey", linestyle=":", label="the issue's goal, 85%")
        nks = sorted({int(r["Nk"]) for r in mine})
        if nks:
            log2_n_axis(ax, nks)
        ax.set_xlabel("cached keys Nk")
        ax.set_ylabel("bandwidth, % of the copy ceiling")
        ax.set_title(f"{dtype}, Nq = {nq}, B = 1")
        ax.legend(fontsize=7)
    fig.suptitle("Stage 09, decoding: H = 32, d = 128; bytes = Q, K, V read and O written "
                 f"once\n{provenance(decode, 'decode.csv')}", fontsize=11)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ main

def draw(out, flashstep=FLASHSTEP):
    """Draws every plot the CSVs allow; returns the PNGs drawn and the memory model used."""
    import matplotlib
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "flashstep"  # no randomness anywhere
    (fwd, peers, traffic, ceilings, bwd, memory, rows16, ablation, causal, ring, decode, rows08,
     bwd16) = (read(n) for n in INPUTS)
    fwd = fp32_only(fwd)
    if not fwd:
        sys.exit("plots: no docs/results/forward.csv (run tests/bench/sweep.py on a GPU)")
    os.makedirs(out, exist_ok=True)
    drawn = []
    title = (f"fp32 forward, median time ({SWEEP_RULE}: tokens per batch fixed, "
             "so FLOPs grow as N)")
    save(sweep_figure(fwd, peers, "median ms", "median ms (log)", title, True), "time_vs_n.png", out)
    title = f"fp32 forward, TFLOP/s ({FLOP_RULE}; {SWEEP_RULE})"
    save(sweep_figure(fwd, peers, "TFLOP/s", "TFLOP/s", title, False), "tflops_vs_n.png", out)
    drawn += ["time_vs_n.png", "tflops_vs_n.png"]
    save(hbm_figure(fwd, traffic), "hbm_vs_n.png", out)
    drawn.append("hbm_vs_n.png")
    if ceilings:
        save(roofline_figure(fwd, peers, ceilings), "roofline.png", out)
        drawn.append("roofline.png")
    else:
        print("plots: no docs/results/ceilings.csv (tests/bench/ceilings.py): no roofline")
    order = list(dict.fromkeys(r["stage"] for r in fwd))  # each stage's colour as in the forward's
    model = None
    if bwd:
        stages = [r for r in bwd if r["stage"] not in FP32_PEERS]
        bpeers = [r for r in bwd if r["stage"] in FP32_PEERS]
        src = provenance(bwd, "backward.csv")
        if bwd[-1].get("torch"):
            src += f", PyTorch {bwd[-1]['torch']}"
        title = (f"fp32 backward, TFLOP/s ({BACKWARD_FLOP_RULE}; {SWEEP_RULE}); "
                 "SDPA in the same run, TF32 off")
        save(sweep_figure(stages, bpeers, "TFLOP/s", "TFLOP/s", title, False, style_order=order,
                          labels=BACKWARD_LABELS, src=src, source="backward.csv", ncol=3),
             "backward_tflops_vs_n.png", out)
        drawn.append("backward_tflops_vs_n.png")
    else:
        print("plots: no docs/results/backward.csv (tests/bench/backward.py): no backward TFLOP/s")
    if memory:
        model = memory_model(flashstep, memory)
        if model is None:
            print(f"plots: no {os.path.relpath(flashstep, ROOT)}: backward_memory.png without the "
                  "stages' lines", file=sys.stderr)
        save(memory_figure(memory, model, order), "backward_memory.png", out)
        drawn.append("backward_memory.png")
    else:
        print("plots: no docs/results/backward_memory.csv (tests/bench/backward.py): no memory plot")
    if rows16:
        save(bf16_figure(rows16, peers, order), "bf16_tflops_vs_n.png", out)
        drawn.append("bf16_tflops_vs_n.png")
    else:
        print("plots: no docs/results/forward16.csv (sweep.py --dtype bf16): no bf16 plot")
    if has_ablation(rows16):
        save(ablation_figure(rows16, peers, ablation), "ablation.png", out)
        drawn.append("ablation.png")
    else:
        print("plots: no ladder at N = 4096 in docs/results/forward16.csv: no ablation plot")
    if causal:
        save(causal_figure(causal, order), "causal.png", out)
        drawn.append("causal.png")
    else:
        print("plots: no docs/results/causal.csv (tests/bench/causal.py): no causal plot")
    if ring:
        save(ring_figure(ring), "ring_scaling.png", out)
        drawn.append("ring_scaling.png")
    else:
        print("plots: no docs/results/ring.csv (tests/bench/ring.py, 2 GPUs or more): no ring plot")
    if decode:
        save(decode_figure(decode), "decode_bandwidth.png", out)
        drawn.append("decode_bandwidth.png")
    else:
        print("plots: no docs/results/decode.csv (tests/bench/decode.py): no decode plot")
    if rows08:
        save(hopper_figure(rows08, peers), "hopper_tflops_vs_n.png", out)
        drawn.append("hopper_tflops_vs_n.png")
    else:
        print("plots: no docs/results/forward08.csv (run_all.sh sweep08): no stage 08 plot")
    if bwd16:
        save(backward16_figure(bwd16), "backward16_tflops_vs_n.png", out)
        drawn.append("backward16_tflops_vs_n.png")
    else:
        print("plots: no docs/results/backward16.csv (run_all.sh backward16): no bf16 backward "
              "plot")
    return drawn, model


def main(argv=None):
    global RESULTS, PLOTS, SIDECAR
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="fail if the PNGs are missing or older than the CSVs (no matplotlib needed)")
    ap.add_argument("--flashstep", default=FLASHSTEP,
                    help="the built CLI, for the stages' modelled memory (default %(default)s)")
    ap.add_argument("--results", default=RESULTS,
                    help="folder of the CSVs (default: docs/results), e.g. synthetic ones; the "
                         "plots go to its plots/")
    args = ap.parse_args(argv)
    RESULTS = tables.RESULTS = os.path.abspath(args.results)
    PLOTS = os.path.join(RESULTS, "plots")
    SIDECAR = os.path.join(PLOTS, "plots.json")
    if args.check:
        problems = check()
        if problems:
            sys.exit("plots: out of date (run python3 tests/bench/plots.py):\n  "
                     + "\n  ".join(problems))
        print("plots: up to date")
        return
    drawn, model = draw(PLOTS, os.path.abspath(args.flashstep))
    stale = [p for p in os.listdir(PLOTS) if p.endswith(".png") and p not in drawn]
    for p in stale:
        print(f"plots: warning: docs/results/plots/{p} is not drawn by plots.py", file=sys.stderr)
    meta = fingerprint()
    meta["outputs"] = drawn
    # What backward_memory.png's stage lines show, and the sources it came from
    # (--check compares those); null when drawn without the CLI.
    meta["memory model"] = model and {
        "command": "flashstep model --backward --stage 02,05 --B 1 --H 2048/d --N N --d d "
                   "--format csv (column \"device memory\", bytes)",
        "sources": model_sources(),
        "device memory": {d: {s: {str(n): b for n, b in pts} for s, pts in by.items()}
                          for d, by in model.items()}}
    with open(SIDECAR, "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.write("\n")
    missing = [p for p in readme_plots() if p not in drawn]
    if missing:
        sys.exit("plots: a README shows plots not drawn: " + ", ".join(missing))


if __name__ == "__main__":
    main()
