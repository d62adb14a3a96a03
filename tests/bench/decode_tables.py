"""Stage 09's tables (tests/bench/decode.py -> docs/results/decode.csv), for
tables.py: the body of <!-- results:decode:begin/end --> in README.md and
stages/09_split_kv/README.md. Generated only from the recorded CSV; until it
exists, one line saying how to record it.

Per element type and decoding problem (Nq, H_kv, B, Nk): stage 09's achieved
bandwidth (Q, K, V read once and O, L written once, over its median time) as
a share of the recorded copy ceiling, the one-block contrast's, and the time
of the fastest SDPA backend in the same type over stage 09's (above 1: stage
09 is faster)."""
import os

NOT_RECORDED = ("Not recorded yet: on a GPU, `bash tests/bench/run_all.sh LOGDIR build decode "
                "tables plots` records `docs/results/decode.csv` (tests/bench/decode.py; "
                "`DECODE_ARGS=\"--Nq 1 --dtype fp32\"`, then `--Nq 1 --dtype bf16`, `--Nq 4 "
                "--dtype fp32` and `--Nq 4 --dtype bf16`, split it into calls of ten minutes, "
                "each adding its rows).\n")
SPLIT, ONE = "09_split_kv", "09_one_block"
LONG_NK = 32768  # the goal: >= 85 % of the copy ceiling from here on


def num(x):
    return float(x) if x not in ("", None) else None


def fmt(x):
    return "–" if x is None else f"{x:.3g}"


def share(r):
    v = num(r.get("of copy")) if r else None
    return f"{100 * v:.0f}%" if v is not None else "–"


def best_peer(rows, dtype):
    """The fastest SDPA row in `dtype` that ran and checked ok, or None."""
    ok = [r for r in rows if r["stage"].startswith("sdpa_") and r["dtype"] == dtype
          and r["check"] == "ok" and num(r["median ms"])]
    return min(ok, key=lambda r: num(r["median ms"])) if ok else None


def point_key(r):
    return (int(r["Nq"]), int(r["H_kv"]), int(r["B"]), int(r["Nk"]))


def decode_table(rows, nq, dtype):
    points = sorted({point_key(r) for r in rows if int(r["Nq"]) == nq and r["dtype"] == dtype
                     and r["stage"] == SPLIT})
    if not points:
        return ""
    lines = [f"**Nq = {nq}, {dtype}** (H = 32, d = 128; bandwidth as a share of the copy "
             f"ceiling; vs SDPA = fastest {dtype} SDPA backend's time ÷ stage 09's)", "",
             "| H_kv | B | Nk | 09_split_kv ms | of copy | 09_one_block ms | of copy | "
             f"best {dtype} SDPA | vs SDPA |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for key in points:
        here = [r for r in rows if point_key(r) == key]
        split = next((r for r in here if r["stage"] == SPLIT and r["dtype"] == dtype), None)
        one = next((r for r in here if r["stage"] == ONE and r["dtype"] == dtype), None)
        peer = best_peer(here, dtype)
        ms = num(split["median ms"]) if split else None
        note = "" if not split or split["check"] in ("ok", "unchecked") else f" ({split['check']})"
        vs = f"{num(peer['median ms']) / ms:.2f}x" if peer and ms else "–"
        peer_cell = (f"{peer['stage'][5:]} {num(peer['median ms']):.3g} ms" if peer else "–")
        one_ms = num(one["median ms"]) if one else None
        lines.append(f"| {key[1]} | {key[2]} | {key[3]:,} | {fmt(ms)}{note} | "
                     f"{share(split)} | {fmt(one_ms)} | {share(one)} | "
                     f"{peer_cell} | {vs} |")
    return "\n".join(lines) + "\n"


def summary(rows, dtype):
    """One line on the goal: the share of copy bandwidth at Nk >= 32k."""
    long = [num(r["of copy"]) for r in rows
            if r["stage"] == SPLIT and r["dtype"] == dtype and int(r["Nk"]) >= LONG_NK
            and num(r.get("of copy"))]
    if not long:
        return ""
    return (f"At Nk ≥ {LONG_NK:,}, 09_split_kv in {dtype} reaches {100 * min(long):.0f}% to "
            f"{100 * max(long):.0f}% of the copy ceiling (the goal: 85%).\n")


def figure(x):
    """Two significant figures, without an exponent: 0.056, 2.3, 24, 120."""
    return f"{float(f'{x:.2g}'):g}" if x < 100 else f"{x:.0f}"


def span(values, unit=""):
    """'lo–hi' (or one value when they round alike), each to two figures."""
    lo, hi = figure(min(values)) + unit, figure(max(values)) + unit
    return lo if lo == hi else f"{lo}–{hi}"


# The measured peak of the cores stage 09 runs each type on (ceilings.csv):
# fp32 on FFMA, the 16-bit types on mma.sync.
CORE_PEAK = {"fp32": "fma", "bf16": "mma_bf16", "fp16": "mma_bf16"}
GOAL_SHARE = 0.85  # the goal, as a share of the copy ceiling


def flops_per_byte(r):
    """Decoding point r's 4 B H Nq Nk d FLOPs (both products) per ideal byte."""
    flops = 4 * int(r["B"]) * int(r["H"]) * int(r["Nq"]) * int(r["Nk"]) * int(r["d"])
    return flops / int(r["ideal bytes"])


def core_bound(r, ceil):
    """The most of the copy ceiling decoding point r can reach when the cores are the
    other limit: its FLOPs at the measured peak of the cores it runs on, against its ideal
    bytes at the copy ceiling; None without both ceilings or the bytes."""
    peak, copy = ceil.get(CORE_PEAK.get(r["dtype"])), ceil.get("copy")
    if not peak or not copy or not num(r.get("ideal bytes")):
        return None
    return min(1.0, peak / (flops_per_byte(r) * copy))


def bound_lines(rows, ceil):
    """A line for each (type, Nq, H_kv) whose cores, not its bytes, keep it under the goal
    at Nk >= LONG_NK: the most it can reach, and its FLOPs per byte."""
    out = []
    groups = sorted({(r["dtype"], int(r["Nq"]), int(r["H_kv"])) for r in rows
                     if r["stage"] == SPLIT and int(r["Nk"]) >= LONG_NK})
    for t, nq, h_kv in groups:
        here = [r for r in rows if r["stage"] == SPLIT and r["dtype"] == t and int(r["Nq"]) == nq
                and int(r["H_kv"]) == h_kv and int(r["Nk"]) >= LONG_NK]
        bounds = [b for b in (core_bound(r, ceil) for r in here) if b is not None]
        if not bounds or max(bounds) >= GOAL_SHARE:
            continue
        intensity = flops_per_byte(next(r for r in here if core_bound(r, ceil) is not None))
        out.append(f"- {t}, Nq = {nq}, H_kv = {h_kv}: {intensity:.0f} FLOP per byte read, so "
                   f"{CORE_PEAK[t]}'s {ceil[CORE_PEAK[t]]:g} TFLOP/s allow at most "
                   f"{span([100 * b for b in bounds], '%')} of the copy ceiling: the goal's "
                   f"{100 * GOAL_SHARE:.0f}% cannot be reached on these cores.")
    return out


def findings(rows, ceilings=()):
    """stages/09_split_kv/README.md's <!-- results:decode_findings -->: what the sweep says,
    every figure from decode.csv: the share of copy at Nk >= LONG_NK per K/V heads, Nq and
    type; how often stage 09 beats the fastest SDPA backend; the split against one block;
    and the one point that shows whether the bytes set the time (MQA, the longest Nk, in
    both types)."""
    dtypes = [t for t in ("fp32", "bf16", "fp16") if any(r["dtype"] == t for r in rows)]
    cols = [(t, nq) for t in dtypes for nq in (1, 4)
            if any(r["dtype"] == t and int(r["Nq"]) == nq for r in rows)]
    out = [f"Share of the copy ceiling at Nk ≥ {LONG_NK:,} (09_split_kv, lowest–highest over B "
           "and Nk):", "",
           "| H_kv (G = 32/H_kv) | " + " | ".join(f"{t} Nq = {nq}" for t, nq in cols) + " |",
           "| --- |" + " --- |" * len(cols)]
    for h_kv in sorted({int(r["H_kv"]) for r in rows}, reverse=True):
        cells = []
        for t, nq in cols:
            v = [100 * num(r["of copy"]) for r in rows if r["stage"] == SPLIT and r["dtype"] == t
                 and int(r["Nq"]) == nq and int(r["H_kv"]) == h_kv and int(r["Nk"]) >= LONG_NK
                 and num(r.get("of copy")) is not None]
            cells.append(span(v, "%") if v else "–")
        out.append(f"| {h_kv} (G = {32 // h_kv}) | " + " | ".join(cells) + " |")
    out.append("")
    ceil = {c["ceiling"]: float(c["value"]) for c in ceilings if c.get("value")}
    bounds = bound_lines(rows, ceil)
    if bounds:
        out += ["Where the cores, not the bytes, set the floor (the most a point can reach is "
                "min(copy, peak ÷ FLOPs per byte), from `docs/results/ceilings.csv`):", ""]
        out += bounds + [""]
    points = sorted({point_key(r) for r in rows if r["stage"] == SPLIT})
    for t in dtypes:
        ratios = []
        for key in points:
            here = [r for r in rows if point_key(r) == key]
            mine = next((r for r in here if r["stage"] == SPLIT and r["dtype"] == t), None)
            peer = best_peer(here, t)
            if mine and peer and num(mine["median ms"]):
                ratios.append(num(peer["median ms"]) / num(mine["median ms"]))
        if ratios:
            out.append(f"- {t}: 09_split_kv is faster than the fastest {t} SDPA backend at "
                       f"{sum(x > 1 for x in ratios)} of {len(ratios)} points "
                       f"(its time ÷ stage 09's: {span(ratios, 'x')}).")
    gains = []
    for r in rows:
        if r["stage"] != SPLIT or not num(r["median ms"]):
            continue
        one = next((o for o in rows if o["stage"] == ONE and o["dtype"] == r["dtype"]
                    and point_key(o) == point_key(r) and num(o["median ms"])), None)
        if one:
            gains.append(num(one["median ms"]) / num(r["median ms"]))
    if gains:
        out.append(f"- Splitting the keys against one block per K/V head (09_one_block's time ÷ "
                   f"09_split_kv's): {span(gains, 'x')}.")
    mqa = [r for r in rows if r["stage"] == SPLIT and int(r["H_kv"]) == 1 and int(r["B"]) == 1
           and int(r["Nq"]) == 1 and num(r["median ms"])]
    if mqa:
        nk = max(int(r["Nk"]) for r in mqa)
        at = {r["dtype"]: r for r in mqa if int(r["Nk"]) == nk}
        if len(at) > 1:
            out.append(f"- Bytes against time, MQA (H_kv = 1), B = 1, Nq = 1, Nk = {nk:,}: "
                       + ", ".join(f"{t} {num(r['median ms']):.3g} ms for "
                                   f"{int(r['ideal bytes']) / 1e6:.0f} MB ({share(r)} of copy)"
                                   for t, r in at.items()) + ".")
    return "\n".join(out) + "\n\n" + provenance(rows)


def script_provenance(rows, name, script, extra=""):
    """The line under a table: which CSV, written by which script, on which runs
    (GPU, driver, date, commit), then `extra`."""
    dates = {}  # (GPU, driver, commit) -> the dates of its rows: a run may pass midnight
    for r in rows:
        key = (r.get("gpu") or "GPU not recorded", r["driver"], r["commit"][:10])
        dates.setdefault(key, set()).add(r["date"])

    def when(days):
        first, last = min(days), max(days)
        return first if first == last else f"{first} to {last}"
    runs = sorted(dates.items(), key=lambda kv: (min(kv[1]), kv[0]))
    return (f"_Recorded in `docs/results/{name}` ({script}): "
            + "; ".join(f"{g}, driver {dr}, {when(days)}, commit `{c}`"
                        for (g, dr, c), days in runs)
            + f"{extra}._\n")


def provenance(rows):
    return script_provenance(rows, "decode.csv", "tests/bench/decode.py",
                             "; the copy ceiling from `docs/results/ceilings.csv`")


def decode_body(read):
    rows = read("decode.csv")
    if not rows:
        return NOT_RECORDED
    dtypes = [t for t in ("fp32", "bf16", "fp16") if any(r["dtype"] == t for r in rows)]
    parts = [summary(rows, t) for t in dtypes]
    parts += [decode_table(rows, nq, t) for t in dtypes for nq in (1, 4)]
    parts = [t for t in parts if t]
    return "\n".join(parts) + "\n" + provenance(rows)


def decode_edits(root, read):
    """{path: [(tag, body)]} for tables.py's edits; with results, the plot under them."""
    body = decode_body(read)
    plot = "docs/results/plots/decode_bandwidth.png"
    alt = "stage 09's bandwidth against Nk beside one block per head and PyTorch SDPA"
    recorded = body != NOT_RECORDED
    rows = read("decode.csv")
    goal = "\n".join(summary(rows, t) for t in ("fp32", "bf16", "fp16")
                     if any(r["dtype"] == t for r in rows))
    return {os.path.join(root, "docs", "stage09.md"):
            [("results:decode_goal", goal + "\n" + provenance(rows) if recorded else body)],
            os.path.join(root, "README.md"):
            [("results:decode", body + (f"\n![{alt}]({plot})\n" if recorded else ""))],
            os.path.join(root, "stages", "09_split_kv", "README.md"):
            [("results:decode", body + (f"\n![{alt}](../../{plot})\n" if recorded else "")),
             ("results:decode_findings", findings(rows, read("ceilings.csv"))
              if recorded else body)]}
