"""The course benchmark's tables (tests/bench/course_bench.py -> docs/results/course.csv),
for tables.py: the body of <!-- results:course:begin/end --> in
docs/assignments/07_pytorch_triton.md. Generated only from the recorded CSV;
until it exists, one line saying so."""
import os

LABELS = {"naive": "naive PyTorch", "sdpa": "PyTorch SDPA", "triton": "Triton (this track)",
          "05_sequence_parallel": "C++ 05_sequence_parallel", "06_warp_split_q": "C++ 06_warp_split_q",
          "07_tensor_core": "C++ 07_tensor_core"}
PASS_TITLES = {"fwd": "forward", "bwd": "backward", "fwd+bwd": "forward + backward"}
NOT_RECORDED = ("_Not recorded yet: run `tests/bench/course_bench.py` on a GPU (see above), "
                "then `tests/bench/tables.py`._\n")


def cell(r):
    if r is None:
        return "–"
    if r["status"] == "ok":
        ms = float(r["ms"])
        return f"{ms:.3g}" if ms < 100 else f"{ms:,.0f}"
    return {"OOM": "OOM", "unsupported": "n/a"}.get(r["status"], "error")


def provenance(rows):
    runs = sorted({(r["gpu"] or "GPU not recorded", r["driver"], r["date"], r["commit"][:10],
                    r["torch"], r["triton"]) for r in rows})
    return ("_Recorded in `docs/results/course.csv` (tests/bench/course_bench.py): "
            + "; ".join(f"{g}, driver {dr}, {da}, commit `{c}`, PyTorch {t}, Triton {tr}"
                        for g, dr, da, c, t, tr in runs)
            + ". Median ms of `triton.testing.do_bench`; B = 1, one head, causal; fp32 without "
              "TF32. OOM: out of device memory; n/a: no such pass or type; error: the CSV's "
              "note says why._\n")


def course_body(read):
    """The tables from course.csv as `read` (tables.py's, which honours --results) gives it."""
    rows = read("course.csv")
    if not rows:
        return NOT_RECORDED
    ns = sorted({int(r["N"]) for r in rows})
    out = []
    for dt in ("bf16", "fp32"):
        for p in ("fwd", "bwd", "fwd+bwd"):
            sel = [r for r in rows if r["dtype"] == dt and r["pass"] == p
                   and r["status"] != "unsupported"]
            if not sel:
                continue
            lines = [f"**{dt}, {PASS_TITLES[p]}** (median ms)", "",
                     "| implementation | d | " + " | ".join(f"N={n}" for n in ns) + " |",
                     "| --- | ---: |" + " ---: |" * len(ns)]
            for impl in LABELS:
                for d in sorted({int(r["d"]) for r in sel}):
                    mine = {int(r["N"]): r for r in sel if r["impl"] == impl and int(r["d"]) == d}
                    if mine:
                        lines.append(f"| {LABELS[impl]} | {d} | "
                                     + " | ".join(cell(mine.get(n)) for n in ns) + " |")
            out.append("\n".join(lines) + "\n")
    return "\n".join(out) + "\n" + provenance(rows)


def course_edits(root, read):
    """{path: [(tag, body)]} for tables.py's edits."""
    return {os.path.join(root, "docs", "assignments", "07_pytorch_triton.md"):
            [("results:course", course_body(read))]}

