#!/usr/bin/env python3
"""Times decoding (few queries, many cached keys) on stage 09 and PyTorch SDPA, in one GPU run.

Problems: H = 32 query heads with H_kv = 32, 8 and 1 K/V heads (MHA, GQA,
MQA), d = 128, Nq = 1 and 4, Nk from 1k to 512k, B in {1, 8, 64}, fp32 and
bf16 (stage 09 in each; --dtype), non-causal (a decoding query sees every cached key; the bottom-right causal
mask differs only on the last Nq - 1 keys and is covered by the tests).
Points whose K and V would pass --max-kv-gb are left out (B = 64 at 512k keys
is terabytes). Rows:

  09_split_kv, 09_one_block  one `flashstep --stage 09 --dtype T --format csv`
                             call per problem and type: checked against fp64 where that is
                             affordable, timed with CUDA events, L2 flushed
  sdpa_<backend>_<dtype>     F.scaled_dot_product_attention(q, k, v,
                             enable_gqa=True) under each SDPA backend that
                             takes the problem (skipped without torch + CUDA;
                             --no-peers), timed the same way; fp32 with TF32
                             off; the 16-bit rows read half the bytes

"ideal bytes" is Q, K and V read once and O written once (and L for stage 09),
the least any kernel must move; "GB/s" is ideal bytes over the median time,
and "of copy" that as a fraction of the copy ceiling in
docs/results/ceilings.csv (empty when none is recorded). For stage 09 "model
bytes" is its model's HBM traffic (partials included). Rows go to the output
CSV with the GPU, driver, date, commit and torch version; progress to stderr.

    python3 tests/bench/decode.py --flashstep build/stages/cli/flashstep \\
        --out docs/results/decode.csv [--Nk 1024 32768] [--B 1] [--H-kv 8] [--Nq 1] [--append]
"""
import csv
import datetime
import io
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sweep import Parser, check_flashstep, gpu_facts, write_csv  # noqa: E402
from peers import flush_buffer, short, time_ms  # noqa: E402

H = 32
D = 128
NK = [1024, 4096, 16384, 32768, 65536, 131072, 262144, 524288]
BATCH = [1, 8, 64]
H_KV = [32, 8, 1]
NQ = [1, 4]
WARMUP, ITERS = 2, 10
CHECK_MACS = 2e9       # fp64-check a point only while B*H*Nq*Nk*d stays under this
FLOAT_BYTES = 4
ELEM_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# stage column: (SDPBackend member, torch dtype name).
PEERS = {
    "sdpa_efficient_fp32": ("EFFICIENT_ATTENTION", "float32"),
    "sdpa_math_fp32": ("MATH", "float32"),
    "sdpa_flash_bf16": ("FLASH_ATTENTION", "bfloat16"),
    "sdpa_efficient_bf16": ("EFFICIENT_ATTENTION", "bfloat16"),
    "sdpa_cudnn_bf16": ("CUDNN_ATTENTION", "bfloat16"),
}
PEER_TOLERANCE = {"float32": (1e-5, 1e-4), "bfloat16": (1e-2, 2e-2)}  # as peers.py
COLUMNS = ["stage", "dtype", "check", "median ms", "p20 ms", "p80 ms", "ideal bytes",
           "model bytes", "GB/s", "of copy", "B", "H", "H_kv", "Nq", "Nk", "d", "causal",
           "note", "torch", "gpu", "driver", "max_sm_clock", "date", "commit"]
CEILINGS = Path(__file__).resolve().parents[2] / "docs/results/ceilings.csv"


def copy_ceiling_gbs():
    """The recorded copy bandwidth in GB/s, or None."""
    if not CEILINGS.exists():
        return None
    with open(CEILINGS, newline="") as f:
        for row in csv.DictReader(f):
            if row["ceiling"] == "copy" and row["unit"] == "TB/s":
                return float(row["value"]) * 1000.0
    return None


def ideal_bytes(B, H_kv, Nq, Nk, elem_bytes, with_lse):
    """Q, K, V read once, O (and L) written once."""
    q = B * H * Nq * D * elem_bytes
    kv = 2 * B * H_kv * Nk * D * elem_bytes
    lse = B * H * Nq * FLOAT_BYTES if with_lse else 0
    return 2 * q + kv + lse


def row_key(r):
    """What says which run a row is: its stage, type and problem (for --append)."""
    return tuple(str(r[k]) for k in ("stage", "dtype", "B", "H", "H_kv", "Nq", "Nk", "d", "causal"))


def problems(args):
    for nq in args.Nq:
        for h_kv in args.H_kv:
            for b in args.B:
                for nk in args.Nk:
                    if 2 * b * h_kv * nk * D * FLOAT_BYTES > args.max_kv_gb * 1e9:
                        continue
                    yield b, h_kv, nq, nk


def bandwidth_cells(nbytes, median_ms, copy_gbs):
    if not median_ms:
        return {"GB/s": "", "of copy": ""}
    gbs = nbytes / (float(median_ms) * 1e-3) / 1e9
    return {"GB/s": f"{gbs:.1f}", "of copy": f"{gbs / copy_gbs:.3f}" if copy_gbs else ""}


def run_stage09(exe, dtype, b, h_kv, nq, nk, copy_gbs):
    """Rows of 09_split_kv and 09_one_block in `dtype` on one problem, and whether all ran ok."""
    cmd = [exe, "--stage", "09", "--dtype", dtype, "--B", str(b), "--H", str(H),
           "--H-kv", str(h_kv), "--Nq", str(nq), "--Nk", str(nk), "--d", str(D),
           "--format", "csv", "--warmup", str(WARMUP), "--iters", str(ITERS)]
    if b * H * nq * nk * D > CHECK_MACS:
        cmd.append("--no-check")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
    rows = []
    for r in csv.DictReader(io.StringIO(proc.stdout)):
        if "check" not in r:  # the model alone: flashstep found no GPU (its stderr says why)
            sys.stderr.write(proc.stderr)
            sys.exit("decode: flashstep ran nothing on a GPU")
        model = int(r["HBM read"]) + int(r["HBM write"])
        ideal = ideal_bytes(b, h_kv, nq, nk, ELEM_BYTES[dtype], True)
        row = {"stage": r["stage"], "dtype": r["dtype"], "check": r["check"],
               "median ms": r["median ms"], "p20 ms": r["p20 ms"], "p80 ms": r["p80 ms"],
               "ideal bytes": ideal, "model bytes": model, "note": ""}
        row.update(bandwidth_cells(ideal, r["median ms"], copy_gbs))
        rows.append(row)
    return rows, proc.returncode == 0


def peer_rows(torch, b, h_kv, nq, nk, dtypes, copy_gbs, flush):
    """One row per SDPA backend of the element types `dtypes` on one problem (empty times and a
    note where it cannot run): a run for fp32 alone leaves the bf16 peers' rows, timed beside
    stage 09's bf16 rows, as they were."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gen = torch.Generator(device="cuda").manual_seed(b * 1000003 + h_kv * 101 + nq * 7 + nk)
    q32 = torch.randn((b, H, nq, D), generator=gen, device="cuda") + 0.5
    k32 = torch.randn((b, h_kv, nk, D), generator=gen, device="cuda") + 0.5
    v32 = torch.randn((b, h_kv, nk, D), generator=gen, device="cuda") + 0.5
    rows = []
    for peer, (member, dtype_name) in PEERS.items():
        short_dtype = {"float32": "fp32", "bfloat16": "bf16"}[dtype_name]
        if short_dtype not in dtypes:
            continue
        dtype = getattr(torch, dtype_name)
        row = {"stage": peer, "dtype": short_dtype,
               "check": "", "median ms": "", "p20 ms": "", "p80 ms": "",
               "ideal bytes": ideal_bytes(b, h_kv, nq, nk, 4 if dtype_name == "float32" else 2,
                                          False),
               "model bytes": "", "note": ""}
        backend = getattr(SDPBackend, member, None)
        try:
            if backend is None:
                raise RuntimeError(f"SDPBackend.{member} is not in this torch")
            q, k, v = (t.to(dtype) for t in (q32, k32, v32))

            def fn():
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

            o = fn()
            torch.cuda.synchronize()
            # Batch 0, head 0 (K/V head 0) against fp64 on the inputs as the peer saw them.
            s = (q[0, 0].double() @ k[0, 0].double().T) / D ** 0.5
            want = torch.softmax(s, dim=-1) @ v[0, 0].double()
            atol, rtol = PEER_TOLERANCE[dtype_name]
            err = (o[0, 0].double() - want).abs()
            row["check"] = "ok" if bool((err <= atol + rtol * want.abs()).all()) else "FAIL"
            med, p20, p80 = time_ms(torch, fn, WARMUP, ITERS, flush)
            row.update({"median ms": f"{med:.4g}", "p20 ms": f"{p20:.4g}", "p80 ms": f"{p80:.4g}"})
        except (RuntimeError, torch.cuda.OutOfMemoryError) as e:
            row["note"] = short(e)
            torch.cuda.empty_cache()
        row.update(bandwidth_cells(row["ideal bytes"], row["median ms"], copy_gbs))
        rows.append(row)
    return rows


def main():
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--flashstep", required=True, help="path to the flashstep binary")
    ap.add_argument("--out", required=True, help="CSV to write")
    ap.add_argument("--Nk", type=int, nargs="+", default=NK)
    ap.add_argument("--B", type=int, nargs="+", default=BATCH)
    ap.add_argument("--H-kv", dest="H_kv", type=int, nargs="+", default=H_KV)
    ap.add_argument("--Nq", type=int, nargs="+", default=NQ)
    ap.add_argument("--dtype", nargs="+", choices=sorted(ELEM_BYTES), default=["fp32", "bf16"],
                    help="stage 09's element types (default fp32 bf16)")
    ap.add_argument("--max-kv-gb", type=float, default=4.0,
                    help="leave out points whose fp32 K and V pass this many GB (default 4: "
                         "80 points, 13 G floats drawn on the host)")
    ap.add_argument("--no-peers", action="store_true", help="stage 09 only, no SDPA rows")
    ap.add_argument("--append", action="store_true",
                    help="keep the rows of an existing --out CSV (a row of the same stage, dtype "
                         "and problem is replaced)")
    ap.add_argument("--commit", default=os.environ.get("FLASHSTEP_COMMIT", "unknown"))
    args = ap.parse_args()
    check_flashstep(ap, args.flashstep)
    for flag, values in (("--Nk", args.Nk), ("--B", args.B), ("--Nq", args.Nq)):
        for v in values:
            if v < 1:
                ap.error(f"{flag} {v}: must be at least 1")
    for h_kv in args.H_kv:
        if h_kv < 1 or H % h_kv:
            ap.error(f"--H-kv {h_kv}: must divide H = {H}")
    if not args.max_kv_gb > 0:
        ap.error(f"--max-kv-gb {args.max_kv_gb}: must be above 0")

    torch = None
    if not args.no_peers:
        try:
            import torch  # noqa: F811
            if not torch.cuda.is_available():
                torch = None
        except ImportError:
            torch = None
        if torch is None:
            print("decode: no PyTorch with CUDA: stage 09 rows only", file=sys.stderr)
    meta = gpu_facts()
    meta.update(date=datetime.date.today().isoformat(), commit=args.commit,
                torch=torch.__version__ if torch else "")
    flush = None
    if torch is not None:
        torch.backends.cuda.matmul.allow_tf32 = False
        flush = flush_buffer(torch, torch.device("cuda", 0))
    copy_gbs = copy_ceiling_gbs()

    points = list(problems(args))
    rows, failures = [], 0
    for k, (b, h_kv, nq, nk) in enumerate(points, 1):
        t0 = time.time()
        point = {"B": b, "H": H, "H_kv": h_kv, "Nq": nq, "Nk": nk, "d": D, "causal": 0}
        got = []
        for dtype in args.dtype:
            mine, ok = run_stage09(args.flashstep, dtype, b, h_kv, nq, nk, copy_gbs)
            failures += 0 if ok and mine else 1
            got += mine
        if torch is not None:
            got += peer_rows(torch, b, h_kv, nq, nk, args.dtype, copy_gbs, flush)
        for r in got:
            r.update(point)
            r.update(meta)
            rows.append(r)
        print(f"[{k}/{len(points)}] B={b} H_kv={h_kv} Nq={nq} Nk={nk}: {time.time() - t0:.1f} s",
              file=sys.stderr, flush=True)
    if not rows:
        sys.exit("decode: no results")
    n_new = len(rows)
    if args.append and os.path.exists(args.out):
        with open(args.out, newline="") as f:
            old = list(csv.DictReader(f))
        new = {row_key(r) for r in rows}
        rows = [r for r in old if row_key(r) not in new] + rows
    write_csv(args.out, rows, COLUMNS)
    bad = sum(1 for r in rows if r["check"] == "FAIL")
    print(f"decode: {n_new} rows to {args.out} ({len(rows)} in all); {failures} stage 09 run(s) failed, "
          f"{bad} check(s) FAIL", file=sys.stderr)
    sys.exit(1 if failures or bad else 0)


if __name__ == "__main__":
    main()
