#!/usr/bin/env python3
"""Draws the course benchmark's plot from docs/results/course.csv (course_bench.py).

    python3 tests/bench/course_plots.py [--check]

Writes docs/results/plots/course.png (median time against N: bf16 and fp32
rows, forward / backward / forward + backward columns; every implementation
at d = 64 solid and d = 128 dashed, out-of-memory points named in the legend)
and docs/results/plots/course.json, the fingerprint (sha256) of the CSV and
of this script it was drawn from. As plots.py does for the README's plots:
nothing typed by hand; `--check` (no matplotlib needed) fails when the CSV or
this script changed since the PNG was drawn, or the PNG is missing. Before
anything is recorded (no course.csv, no course.json) there is nothing to
draw and --check passes: docs/assignments/07_pytorch_triton.md then says
"not recorded yet".
"""
import argparse
import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from course_tables import LABELS, PASS_TITLES  # noqa: E402
from tables import RESULTS, ROOT, read  # noqa: E402

CSV = os.path.join(RESULTS, "course.csv")
PLOTS = os.path.join(RESULTS, "plots")
PNG = "course.png"
SIDECAR = os.path.join(PLOTS, "course.json")
DPI = 100
STYLE = {"naive": ("C3", "s"), "sdpa": ("black", None), "triton": ("C0", "o"),
         "05_sequence_parallel": ("C4", "D"), "06_warp_split_q": ("C5", "P"),
         "07_tensor_core": ("C7", "*")}


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def fingerprint():
    return {"input": {"course.csv": {"sha256": sha256(CSV), "rows": len(read("course.csv"))}},
            "generator": {"tests/bench/course_plots.py": sha256(os.path.abspath(__file__))}}


def check():
    have_csv, have_sidecar = os.path.exists(CSV), os.path.exists(SIDECAR)
    if not have_csv and not have_sidecar:
        return []
    if not have_csv:
        return ["docs/results/course.csv is gone but docs/results/plots/course.json remains"]
    if not have_sidecar:
        return ["docs/results/course.csv has no plot yet"]
    with open(SIDECAR) as f:
        recorded = json.load(f)
    now = fingerprint()
    problems = []
    if recorded.get("input") != now["input"]:
        problems.append("docs/results/course.csv changed since the plot was drawn")
    if recorded.get("generator") != now["generator"]:
        problems.append("tests/bench/course_plots.py changed since the plot was drawn")
    if not os.path.exists(os.path.join(PLOTS, PNG)):
        problems.append(f"docs/results/plots/{PNG} is missing")
    return problems


def draw():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = read("course.csv")
    fig, axes = plt.subplots(2, 3, figsize=(16, 9), sharex=True)
    ns = sorted({int(r["N"]) for r in rows})
    for i, dt in enumerate(("bf16", "fp32")):
        for j, p in enumerate(("fwd", "bwd", "fwd+bwd")):
            ax = axes[i][j]
            for impl, label in LABELS.items():
                color, marker = STYLE[impl]
                for d, ls in ((64, "-"), (128, "--")):
                    mine = [r for r in rows if r["impl"] == impl and r["dtype"] == dt
                            and r["pass"] == p and int(r["d"]) == d]
                    pts = sorted((int(r["N"]), float(r["ms"])) for r in mine if r["status"] == "ok")
                    if not pts:
                        continue
                    oom = sorted(int(r["N"]) for r in mine if r["status"] == "OOM")
                    text = f"{label}, d={d}" + (f" (OOM from N={oom[0]})" if oom else "")
                    ax.plot([n for n, _ in pts], [ms for _, ms in pts], ls, color=color,
                            marker=marker, markersize=4, label=text)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(ns)
            ax.set_xticklabels([f"{n // 1024}k" if n >= 1024 else str(n) for n in ns], fontsize=8)
            ax.grid(True, alpha=0.3)
            ax.set_title(f"{dt}, {PASS_TITLES[p]}")
            if j == 0:
                ax.set_ylabel("median ms (log)")
            if i == 1:
                ax.set_xlabel("sequence length N")
            ax.legend(fontsize=6, loc="upper left")
    r0 = rows[0]
    fig.suptitle("CS336 assignment 2's benchmark: B = 1, one head, causal "
                 f"({r0['gpu']}, {r0['date']}, commit {r0['commit'][:10]}, PyTorch {r0['torch']}, "
                 f"Triton {r0['triton']})", fontsize=11)
    fig.tight_layout()
    os.makedirs(PLOTS, exist_ok=True)
    fig.savefig(os.path.join(PLOTS, PNG), dpi=DPI, metadata={"Software": None})
    plt.close(fig)
    meta = fingerprint()
    meta["outputs"] = [PNG]
    with open(SIDECAR, "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"course_plots: wrote docs/results/plots/{PNG}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if the plot is missing or stale")
    a = ap.parse_args()
    if a.check:
        problems = check()
        if problems:
            sys.exit("course_plots: out of date (run python3 tests/bench/course_plots.py):\n  "
                     + "\n  ".join(problems))
        print("course_plots: up to date" if os.path.exists(CSV) else
              "course_plots: nothing recorded yet (no docs/results/course.csv)")
        return
    if not os.path.exists(CSV):
        sys.exit("course_plots: no docs/results/course.csv (run tests/bench/course_bench.py on a GPU)")
    draw()


if __name__ == "__main__":
    main()
