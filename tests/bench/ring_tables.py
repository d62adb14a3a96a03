"""Stage 10's tables (tests/bench/ring.py -> docs/results/ring.csv), for tables.py:
the body of <!-- results:ring:begin/end --> in README.md and stages/10_ring/README.md.
Generated only from the recorded CSV; until it exists, one line saying how to
record it.

Weak scaling keeps the tokens per GPU fixed, so the work per GPU grows with
the ring (attention is quadratic in N): its efficiency is TFLOP/s per GPU on
P GPUs over TFLOP/s on one, at the same tokens per GPU. Strong scaling keeps
N: its speed-up is the one-GPU time over the P-GPU time."""
import os

NOT_RECORDED = ("_Not recorded yet: on a machine of 2 or more GPUs, `bash tests/bench/run_all.sh "
                "LOGDIR build ring` records it (tests/bench/ring.py; `RING_ARGS=\"--parts weak\"` "
                "and `\"--parts strong long contrast\"` split it into two calls of ten minutes), "
                "then `tests/bench/tables.py` and `tests/bench/plots.py`._\n")
FLOP_RULE = "TFLOP/s counts 4·B·H·N²·d, halved if causal"


def variant(r):
    """The row's mask and assignment, as the tables name them."""
    if r["causal"] != "1":
        return "non-causal"
    return f"causal, {r['assign']}"


VARIANTS = ("non-causal", "causal, contiguous", "causal, zigzag")


def num(x):
    return float(x) if x not in ("", None) else None


def fmt(x, digits=3):
    return "–" if x is None else f"{x:.{digits}g}"


def check_note(r):
    return "" if r["check"] == "ok" else f" ({r['check']})"


def weak_table(rows):
    weak = [r for r in rows if r["part"] == "weak"]
    if not weak:
        return ""
    base = {(variant(r), int(r["Nq"])): num(r["TFLOP/s"]) for r in weak if r["gpus"] == "1"}
    lines = ["**Weak scaling** (tokens per GPU fixed; efficiency = TFLOP/s per GPU ÷ one GPU's "
             "at the same tokens per GPU)", "",
             "| variant | tokens per GPU | GPUs | median ms | TFLOP/s | per GPU | efficiency | "
             "hidden % | sent per GPU |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for v in VARIANTS:
        mine = sorted((r for r in weak if variant(r) == v),
                      key=lambda r: (int(r["Nq"]) // int(r["gpus"]), int(r["gpus"])))
        for r in mine:
            p = int(r["gpus"])
            per_gpu = int(r["Nq"]) // p
            one = base.get((v, per_gpu))
            tf = num(r["TFLOP/s per GPU"])
            eff = f"{100 * tf / one:.0f}%" if one and tf is not None else "–"
            lines.append(f"| {v} | {per_gpu:,} | {p} | {fmt(num(r['median ms']))}"
                         f"{check_note(r)} | {fmt(num(r['TFLOP/s']))} | {fmt(tf)} | {eff} | "
                         f"{fmt(num(r['hidden %']))} | {int(r['sent per GPU']) / 1e9:.2f} GB |")
    return "\n".join(lines) + "\n"


def strong_table(rows):
    strong = [r for r in rows if r["part"] == "strong"]
    if not strong:
        return ""
    n = int(strong[0]["Nq"])
    one = {variant(r): num(r["median ms"]) for r in strong if r["gpus"] == "1"}
    lines = [f"**Strong scaling** (N = {n:,}; speed-up = one GPU's time ÷ P GPUs'; compute = "
             "each GPU's time in its steps, least and most)", "",
             "| variant | GPUs | median ms | speed-up | TFLOP/s | hidden % | compute ms, least – most |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for v in VARIANTS:
        for r in sorted((r for r in strong if variant(r) == v), key=lambda r: int(r["gpus"])):
            ms = num(r["median ms"])
            base = one.get(v)
            speed = f"{base / ms:.2f}x" if base and ms else "–"
            lines.append(f"| {v} | {r['gpus']} | {fmt(ms)}{check_note(r)} | {speed} | "
                         f"{fmt(num(r['TFLOP/s']))} | {fmt(num(r['hidden %']))} | "
                         f"{fmt(num(r['compute ms min']))} – {fmt(num(r['compute ms max']))} |")
    return "\n".join(lines) + "\n"


def long_and_contrast_table(rows):
    longest = [r for r in rows if r["part"] == "long"]
    contrast = [r for r in rows if r["part"] == "contrast"]
    lines = []
    if longest:
        lines += ["**The longest sequence** (B = 1, H = 8, d = 128, causal, zig-zag, one timed run)", "",
                  "| N | GPUs | time s | TFLOP/s | hidden % | check |",
                  "| ---: | ---: | ---: | ---: | ---: | --- |"]
        for r in sorted(longest, key=lambda r: int(r["Nq"])):
            ms = num(r["median ms"])
            lines.append(f"| {int(r['Nq']):,} | {r['gpus']} | {fmt(ms / 1e3 if ms else None)} | "
                         f"{fmt(num(r['TFLOP/s']))} | {fmt(num(r['hidden %']))} | {r['check']} |")
        lines.append("")
    if contrast:
        weak = {(variant(r), r["Nq"], r["gpus"]): r for r in rows if r["part"] == "weak"}
        lines += ["**Overlap on and off** (each transfer beside its step's compute, or before it)", "",
                  "| variant | N | GPUs | overlap | median ms | hidden % |",
                  "| --- | ---: | ---: | --- | ---: | ---: |"]
        for r in sorted(contrast, key=lambda r: VARIANTS.index(variant(r))):
            on = weak.get((variant(r), r["Nq"], r["gpus"]))
            for x in ([on] if on else []) + [r]:
                lines.append(f"| {variant(x)} | {int(x['Nq']):,} | {x['gpus']} | {x['overlap']} | "
                             f"{fmt(num(x['median ms']))}{check_note(x)} | {fmt(num(x['hidden %']))} |")
    return "\n".join(lines) + ("\n" if lines else "")


def provenance(rows):
    runs = sorted({(r.get("gpu") or "GPU not recorded", r["driver"], r["date"], r["commit"][:10])
                   for r in rows})
    return ("_Recorded in `docs/results/ring.csv` (tests/bench/ring.py): "
            + "; ".join(f"{g}, driver {dr}, {da}, commit `{c}`" for g, dr, da, c in runs)
            + f". B = 1, H = 8, d = 128, bf16, partials by 07_tensor_core; {FLOP_RULE}; "
              "hidden = share of the transfers' time during which the same GPU was computing "
              "(CUDA events on both streams)._\n")


def ring_body(read):
    """The tables from ring.csv as `read` (tables.py's, which honours --results) gives it."""
    rows = read("ring.csv")
    if not rows:
        return NOT_RECORDED
    parts = [t for t in (weak_table(rows), strong_table(rows), long_and_contrast_table(rows)) if t]
    return "\n".join(parts) + "\n" + provenance(rows)


def ring_edits(root, read):
    """{path: [(tag, body)]} for tables.py's edits."""
    body = ring_body(read)
    return {os.path.join(root, "README.md"): [("results:ring", body)],
            os.path.join(root, "stages", "10_ring", "README.md"): [("results:ring", body)]}
