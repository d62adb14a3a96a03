"""Stage 09's KV-cache layouts (tests/bench/kvcache.py -> docs/results/kvcache.csv), for
tables.py: the body of <!-- results:kvcache:begin/end --> in stages/09_split_kv/README.md.
Generated only from the recorded CSV; until it exists, one line saying how to record it.

Per type, one table: each decode point's time with the contiguous cache (and its
bandwidth, the model's HBM bytes over the time), then every other layout's time
as a ratio to it (a paged cache of 64 or 256 keys a page, and the new token
appended in the same call), then one line with the range of each ratio and
one by regime: the paged layouts near the copy ceiling (the contiguous run at
NEAR_CEILING_GBS or more) and below it, and what the append adds to short
decodes (under SHORT_US) in µs and to long ones (LONG_US and more). A row
whose check is not ok shows it in place of the ratio and is left out of the
ranges."""
import os

from decode_tables import script_provenance

NOT_RECORDED = ("_KV-cache layouts (kvcache.csv): not recorded yet; on a GPU, "
                "`bash tests/bench/kvcache_gpu.sh` records them "
                "(tests/bench/kvcache.py)._\n")
BASE = "contiguous"
# The other layouts, in the CSV's order (flashstep_kvcache's kLayouts).
OTHERS = ("paged64", "paged256", "contiguous+append", "paged256+append")
PAGED = ("paged64", "paged256")
APPEND = "contiguous+append"
NEAR_CEILING_GBS = 4000  # the H200's copy ceiling is about 4,400 GB/s (ceilings.csv)
SHORT_US = 50            # a decode this short is latency-bound: a few tiles a split
LONG_US = 100


def num(x):
    return float(x) if x not in ("", None) else None


def ratio(base, other):
    if not base or not other or not num(base["median ms"]) or not num(other["median ms"]):
        return None
    return num(other["median ms"]) / num(base["median ms"])


def cell(base, other):
    if other and other["check"] != "ok":
        return other["check"]
    r = ratio(base, other)
    return f"×{r:.2f}" if r else "–"


def kvcache_table(rows, dtype):
    here = [r for r in rows if r["dtype"] == dtype]
    if not here:
        return ""
    by = {(int(r["H_kv"]), int(r["B"]), int(r["Nk"]), r["layout"]): r for r in here}
    points = sorted({k[:3] for k in by})
    H, d, nq = here[0]["H"], here[0]["d"], here[0]["Nq"]
    lines = [f"**{dtype}** (H = {H}, d = {d}, Nq = {nq}; each layout's time ÷ the contiguous "
             "cache's)", "",
             "| H_kv | B | Nk | contiguous µs | GB/s | " + " | ".join(OTHERS) + " |",
             "| ---: | ---: | ---: | ---: | ---: |" + " ---: |" * len(OTHERS)]
    spans = {o: [] for o in OTHERS}
    for h_kv, b, nk in points:
        base = by.get((h_kv, b, nk, BASE))
        ms = num(base["median ms"]) if base else None
        us = f"{ms * 1e3:.1f}" if ms else "–"
        if base and base["check"] != "ok":
            us += f" ({base['check']})"
        gbs = f"{num(base['GB/s']):,.0f}" if base and num(base["GB/s"]) else "–"
        cells = []
        for o in OTHERS:
            other = by.get((h_kv, b, nk, o))
            cells.append(cell(base, other))
            r = ratio(base, other)
            if r and other["check"] == "ok":
                spans[o].append(r)
        lines.append(f"| {h_kv} | {b} | {nk:,} | {us} | {gbs} | " + " | ".join(cells) + " |")
    ranges = "; ".join(f"{o} ×{min(v):.2f} to ×{max(v):.2f}" for o, v in spans.items() if v)
    return ("\n".join(lines) + f"\n\nRange over the points: {ranges}.\n\n"
            + regimes(by, points) + "\n")


def span(values, fmt):
    return f"{fmt(min(values))} to {fmt(max(values))}" if values else "no point"


def regimes(by, points):
    """One line: the paged layouts near the copy ceiling and below it, and the append's
    cost on short decodes (µs added, ratio) and on long ones (ratio)."""
    near, below, short_us, short_x, long_x = [], [], [], [], []
    for h_kv, b, nk in points:
        base = by.get((h_kv, b, nk, BASE))
        if not base or base["check"] != "ok" or not num(base["median ms"]):
            continue
        us = num(base["median ms"]) * 1e3
        for o in PAGED:
            other = by.get((h_kv, b, nk, o))
            r = ratio(base, other)
            if r and other["check"] == "ok":
                (near if num(base["GB/s"]) >= NEAR_CEILING_GBS else below).append(r)
        other = by.get((h_kv, b, nk, APPEND))
        r = ratio(base, other)
        if r and other["check"] == "ok":
            if us < SHORT_US:
                short_us.append(us * (r - 1))
                short_x.append(r)
            elif us >= LONG_US:
                long_x.append(r)
    x = "×{:.2f}".format
    return (f"Paged ÷ contiguous near the copy ceiling (contiguous at {NEAR_CEILING_GBS:,} GB/s "
            f"or more): {span(near, x)}; below it: {span(below, x)}. The append adds "
            f"{span(short_us, '{:.1f} µs'.format)} to decodes under {SHORT_US} µs "
            f"({span(short_x, x)}), {span(long_x, x)} from {LONG_US} µs.")


def provenance(rows):
    return script_provenance(rows, "kvcache.csv", "tests/bench/kvcache.py")


def kvcache_body(read):
    rows = read("kvcache.csv")
    if not rows:
        return NOT_RECORDED
    tables = [kvcache_table(rows, t) for t in dict.fromkeys(r["dtype"] for r in rows)]
    return "\n".join(t for t in tables if t) + "\n" + provenance(rows)


def kvcache_edits(root, read):
    """{path: [(tag, body)]} for tables.py's edits."""
    return {os.path.join(root, "stages", "09_split_kv", "README.md"):
            [("results:kvcache", kvcache_body(read))]}
