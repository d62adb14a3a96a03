"""Stage 09's KV-cache layouts (tests/bench/kvcache.py -> docs/results/kvcache.csv), for
tables.py: the body of <!-- results:kvcache:begin/end --> in stages/09_split_kv/README.md.
Generated only from the recorded CSV; until it exists, one line saying how to record it.

Per type, one table: each decode point's time with the contiguous cache (and its
bandwidth, the model's HBM bytes over the time), then every other layout's time
as a ratio to it (a paged cache of 64 or 256 keys a page, and the new token
appended in the same call), then one line with the range of each ratio. A row
whose check is not ok shows it in place of the ratio."""
import os

from decode_tables import script_provenance

NOT_RECORDED = ("_KV-cache layouts (kvcache.csv): not recorded yet; on a GPU, "
                "`bash tests/bench/kvcache_gpu.sh` records them "
                "(tests/bench/kvcache.py)._\n")
BASE = "contiguous"
# The other layouts, in the CSV's order (flashstep_kvcache's kLayouts).
OTHERS = ("paged64", "paged256", "contiguous+append", "paged256+append")


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
    return "\n".join(lines) + f"\n\nRange over the points: {ranges}.\n"


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
