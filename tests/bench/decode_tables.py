"""Stage 09's tables (tests/bench/decode.py -> docs/results/decode.csv), for
tables.py: the body of <!-- results:decode:begin/end --> in README.md and
stages/09_split_kv/README.md. Generated only from the recorded CSV; until it
exists, one line saying how to record it.

Per decoding problem (Nq, H_kv, B, Nk): stage 09's achieved bandwidth (Q, K,
V read once and O, L written once, over its median time) as a share of the
recorded copy ceiling, the one-block contrast's, and the time of the fastest
fp32 SDPA backend over stage 09's (above 1: stage 09 is faster)."""
import os

NOT_RECORDED = ("Not recorded yet: on a GPU, `bash tests/bench/run_all.sh LOGDIR build decode "
                "tables plots` records `docs/results/decode.csv` (tests/bench/decode.py; "
                "`DECODE_ARGS=\"--Nq 1\"` and `\"--Nq 4\"` split it into two calls of ten "
                "minutes).\n")
SPLIT, ONE = "09_split_kv", "09_one_block"
LONG_NK = 32768  # the goal: >= 85 % of the copy ceiling from here on


def num(x):
    return float(x) if x not in ("", None) else None


def fmt(x):
    return "–" if x is None else f"{x:.3g}"


def share(r):
    v = num(r.get("of copy")) if r else None
    return f"{100 * v:.0f}%" if v is not None else "–"


def best_fp32_peer(rows):
    """The fastest fp32 SDPA row that ran and checked ok, or None."""
    ok = [r for r in rows if r["stage"].startswith("sdpa_") and r["dtype"] == "fp32"
          and r["check"] == "ok" and num(r["median ms"])]
    return min(ok, key=lambda r: num(r["median ms"])) if ok else None


def point_key(r):
    return (int(r["Nq"]), int(r["H_kv"]), int(r["B"]), int(r["Nk"]))


def decode_table(rows, nq):
    points = sorted({point_key(r) for r in rows if int(r["Nq"]) == nq})
    if not points:
        return ""
    lines = [f"**Nq = {nq}** (H = 32, d = 128, fp32; bandwidth as a share of the copy ceiling; "
             "vs SDPA = fastest fp32 SDPA backend's time ÷ stage 09's)", "",
             "| H_kv | B | Nk | 09_split_kv ms | of copy | 09_one_block ms | of copy | "
             "best fp32 SDPA | vs SDPA |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for key in points:
        here = [r for r in rows if point_key(r) == key]
        split = next((r for r in here if r["stage"] == SPLIT), None)
        one = next((r for r in here if r["stage"] == ONE), None)
        peer = best_fp32_peer(here)
        ms = num(split["median ms"]) if split else None
        note = "" if not split or split["check"] in ("ok", "unchecked") else f" ({split['check']})"
        vs = f"{num(peer['median ms']) / ms:.2f}x" if peer and ms else "–"
        peer_cell = (f"{peer['stage'][5:]} {num(peer['median ms']):.3g} ms" if peer else "–")
        one_ms = num(one["median ms"]) if one else None
        lines.append(f"| {key[1]} | {key[2]} | {key[3]:,} | {fmt(ms)}{note} | "
                     f"{share(split)} | {fmt(one_ms)} | {share(one)} | "
                     f"{peer_cell} | {vs} |")
    return "\n".join(lines) + "\n"


def summary(rows):
    """One line on the goal: the least share of copy bandwidth at Nk >= 32k."""
    long = [num(r["of copy"]) for r in rows
            if r["stage"] == SPLIT and int(r["Nk"]) >= LONG_NK and num(r.get("of copy"))]
    if not long:
        return ""
    return (f"At Nk ≥ {LONG_NK:,}, 09_split_kv reaches {100 * min(long):.0f}% to "
            f"{100 * max(long):.0f}% of the copy ceiling (the goal: 85%).\n")


def provenance(rows):
    runs = sorted({(r.get("gpu") or "GPU not recorded", r["driver"], r["date"], r["commit"][:10])
                   for r in rows})
    return ("_Recorded in `docs/results/decode.csv` (tests/bench/decode.py): "
            + "; ".join(f"{g}, driver {dr}, {da}, commit `{c}`" for g, dr, da, c in runs)
            + "; the copy ceiling from `docs/results/ceilings.csv`._\n")


def decode_body(read):
    rows = read("decode.csv")
    if not rows:
        return NOT_RECORDED
    parts = [t for t in (summary(rows), decode_table(rows, 1), decode_table(rows, 4)) if t]
    return "\n".join(parts) + "\n" + provenance(rows)


def decode_edits(root, read):
    """{path: [(tag, body)]} for tables.py's edits; with results, the plot under them."""
    body = decode_body(read)
    plot = "docs/results/plots/decode_bandwidth.png"
    alt = "stage 09's bandwidth against Nk beside one block per head and PyTorch SDPA"
    recorded = body != NOT_RECORDED
    return {os.path.join(root, "README.md"):
            [("results:decode", body + (f"\n![{alt}]({plot})\n" if recorded else ""))],
            os.path.join(root, "stages", "09_split_kv", "README.md"):
            [("results:decode", body + (f"\n![{alt}](../../{plot})\n" if recorded else ""))]}
