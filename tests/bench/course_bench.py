#!/usr/bin/env python3
"""CS336 assignment 2's FlashAttention benchmark, with the C++ stages beside it.

Batch 1, one head, causal (N x N, so the two causal conventions agree),
N = 128, 256, ..., 65536, d = 16, 32, 64, 128, in bfloat16 and float32; the
forward, the backward and forward + backward, each timed with
triton.testing.do_bench (its median ms; L2 cleared before each run). The
implementations, on the same inputs:

  naive      attention in plain PyTorch (S and P stored: O(N^2) memory),
             reference.standard_attention, backward by autograd
  sdpa       torch.nn.functional.scaled_dot_product_attention(is_causal=True),
             whatever backend PyTorch picks (flash or cuDNN in bf16,
             mem-efficient in fp32); TF32 off
  triton     the course track's Triton kernels (notebooks/flashstep_course/
             triton_flash.py), fp32 dots without TF32
  05_sequence_parallel   the C++ stage through the C ABI (notebooks/flashstep.py):
             fp32 forward and backward (FlashAttention-2, Algorithm 2)
  06_warp_split_q        the C++ stage, fp32 forward
  07_tensor_core         the C++ stage, bf16 forward (tensor cores)

A point that runs out of device memory gets a row with status OOM, and one
that cannot run another status (unsupported: no such pass or type; error:
the first line of why), never no row. Each forward is checked on 64 sampled
query rows against the fp64 reference (the max abs error is recorded).
Every row carries the GPU, driver, date, commit and the torch and Triton
versions. The CSV is rewritten after each point, so a run cut short keeps
what it measured; --append adds to (and replaces the same points of) an
existing CSV, so the sweep can be split into calls that each fit a time limit:

    python3 tests/bench/course_bench.py --dtype bf16                 # ~4 min (estimate)
    python3 tests/bench/course_bench.py --dtype fp32 --append        # ~5 min (estimate)

--max-minutes (default 9) stops starting new points after that long and
prints the ones left, to be run with --append. Then tests/bench/tables.py
writes the tables and tests/bench/course_plots.py the plot.
"""
import argparse
import csv
import datetime
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "notebooks"))
from sweep import gpu_facts, write_csv  # noqa: E402

NS = [2 ** k for k in range(7, 17)]  # 128 ... 65536
DS = [16, 32, 64, 128]
DTYPES = ["bf16", "fp32"]
PASSES = ["fwd", "bwd", "fwd+bwd"]
IMPLS = ["naive", "sdpa", "triton", "05_sequence_parallel", "06_warp_split_q", "07_tensor_core"]
# The passes and types each C++ stage has (the ABI says so too; fixed here so
# that a missing one is a row "unsupported", not a silent gap).
CPP = {"05_sequence_parallel": {"fp32": PASSES},
       "06_warp_split_q": {"fp32": ["fwd"]},
       "07_tensor_core": {"bf16": ["fwd"]}}
FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}  # of 4 N^2 d, halved causal
CHECK_ROWS = 64
COLUMNS = ["impl", "dtype", "pass", "N", "d", "causal", "status", "ms", "TFLOP/s",
           "max err O", "note", "torch", "triton", "gpu", "driver", "max_sm_clock", "date",
           "commit"]
KEY = ("impl", "dtype", "pass", "N", "d")


def parse_list(text, kind, allowed=None):
    out = [kind(x) for x in text.split(",") if x.strip()]
    if allowed is not None:
        bad = [x for x in out if x not in allowed]
        if bad:
            raise SystemExit(f"course_bench.py: {bad} not in {allowed}")
    return out


def flops(n, d, pass_name):
    return FLOP_FACTOR[pass_name] * 4.0 * n * n * d / 2  # causal


def is_oom(torch, e):
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return True
    text = str(e)
    return "out of memory" in text.lower() or "FLASHSTEP_ENOMEM" in text or \
        getattr(e, "code", None) == 3  # flashstep.ENOMEM


def make_fns(torch, impl, q, k, v, do, fs):
    """{pass: fn} for one implementation on these inputs (fn runs that pass once)."""
    from flashstep_course import reference as R
    F = torch.nn.functional
    leaves = (q, k, v)
    if impl in ("naive", "sdpa", "triton"):
        if impl == "naive":
            def f():
                return R.standard_attention(*leaves, True)
        elif impl == "sdpa":
            def f():
                return F.scaled_dot_product_attention(*leaves, is_causal=True)
        else:
            from flashstep_course.triton_flash import FlashAttentionTriton

            def f():
                return FlashAttentionTriton.apply(*leaves, True)
        state = {}

        def fwd():
            with torch.no_grad():
                return f()

        def bwd():
            if "o" not in state:
                state["o"] = f()
            state["o"].backward(do, retain_graph=True)

        def both():
            f().backward(do)
        return {"fwd": fwd, "bwd": bwd, "fwd+bwd": both}, f
    # A C++ stage through the C ABI.
    qd, kd, vd = (t.detach() for t in leaves)
    state = {}

    def fwd():
        return fs.forward(qd, kd, vd, stage=impl, causal=True)[0]

    def bwd():
        if "o" not in state:
            state["o"], state["lse"] = fs.forward(qd, kd, vd, stage=impl, causal=True)
        fs.backward(qd, kd, vd, state["o"], state["lse"], do, stage=impl, causal=True)

    def both():
        o, lse = fs.forward(qd, kd, vd, stage=impl, causal=True)
        fs.backward(qd, kd, vd, o, lse, do, stage=impl, causal=True)
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": both}, fwd


def check_error(torch, o, q, k, v):
    """Max abs error of o on CHECK_ROWS sampled query rows against fp64."""
    from flashstep_course import reference as R
    n = q.shape[-2]
    rows = torch.linspace(0, n - 1, min(CHECK_ROWS, n), device=q.device).round().long()
    o_ref, _ = R.reference_forward_rows(q.detach(), k.detach(), v.detach(), rows, True)
    return float((o.detach()[..., rows, :].double() - o_ref).abs().max())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "results", "course.csv"))
    ap.add_argument("--append", action="store_true",
                    help="keep the CSV's other rows (the same points are replaced)")
    ap.add_argument("--dtype", default=",".join(DTYPES))
    ap.add_argument("--N", default=",".join(map(str, NS)))
    ap.add_argument("--d", default=",".join(map(str, DS)))
    ap.add_argument("--impl", default=",".join(IMPLS))
    ap.add_argument("--pass", dest="passes", default=",".join(PASSES))
    ap.add_argument("--max-minutes", type=float, default=9.0,
                    help="start no new point after this long (default %(default)s)")
    ap.add_argument("--commit", default=os.environ.get("FLASHSTEP_COMMIT", "unknown"))
    a = ap.parse_args()
    dtypes = parse_list(a.dtype, str, DTYPES)
    ns, ds = parse_list(a.N, int), parse_list(a.d, int)
    impls, passes = parse_list(a.impl, str, IMPLS), parse_list(a.passes, str, PASSES)

    import torch
    import triton
    import triton.testing
    if not torch.cuda.is_available():
        print("course_bench.py: needs a CUDA device", file=sys.stderr)
        return 77
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    fs = None
    if any(i in CPP for i in impls):
        import flashstep
        try:
            flashstep.library_path()
            fs = flashstep
        except FileNotFoundError as e:
            print(f"course_bench.py: the C++ stages are left out: {e}", file=sys.stderr)
    meta = gpu_facts()
    meta.update(date=datetime.date.today().isoformat(), commit=a.commit,
                torch=torch.__version__, triton=triton.__version__)
    rows = []
    if a.append and os.path.exists(a.out):
        with open(a.out, newline="") as f:
            rows = list(csv.DictReader(f))
    by_key = {tuple(r[c] for c in KEY): i for i, r in enumerate(rows)}

    def record(row):
        row = {**{c: "" for c in COLUMNS}, **row, **meta, "causal": "1"}
        key = tuple(str(row[c]) for c in KEY)
        if key in by_key:
            rows[by_key[key]] = row
        else:
            by_key[key] = len(rows)
            rows.append(row)
        write_csv(a.out, rows, COLUMNS)

    t_start = time.time()
    points = [(dt, n, d) for dt in dtypes for d in ds for n in ns]
    left = []
    for k_point, (dt, n, d) in enumerate(points, 1):
        if time.time() - t_start > a.max_minutes * 60:
            left.append((dt, n, d))
            continue
        dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dt]
        from flashstep_course import reference as R
        q, k, v, do = R.random_inputs((1, 1, n, d), (1, 1, n, d), dtype, "cuda", n + d)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        for impl in impls:
            base = {"impl": impl, "dtype": dt, "N": n, "d": d}
            if impl in CPP:
                have = CPP[impl].get(dt, [])
                if fs is None:
                    for p in passes:
                        record({**base, "pass": p, "status": "error",
                                "note": "libflashstep.so not found"})
                    continue
            else:
                have = PASSES
            try:
                fns, f = make_fns(torch, impl, q, k, v, do, fs)
            except Exception as e:  # noqa: BLE001
                for p in passes:
                    record({**base, "pass": p, "status": "error", "note": str(e).splitlines()[0][:160]})
                continue
            err = ""
            for p in passes:
                if p not in have:
                    record({**base, "pass": p, "status": "unsupported",
                            "note": f"{impl} has no {p} in {dt}"})
                    continue
                try:
                    if p == "fwd" and err == "":
                        with torch.no_grad():
                            err = f"{check_error(torch, fns['fwd'](), q, k, v):.3g}"
                    fns[p]()  # compile (Triton) and warm up outside the timing
                    torch.cuda.synchronize()
                    ms = triton.testing.do_bench(fns[p], grad_to_none=[q, k, v])
                    record({**base, "pass": p, "status": "ok", "ms": f"{ms:.4g}",
                            "TFLOP/s": f"{flops(n, d, p) / (ms / 1e3) / 1e12:.3g}",
                            "max err O": err})
                except Exception as e:  # noqa: BLE001 - every failure is a row
                    oom = is_oom(torch, e)
                    record({**base, "pass": p, "status": "OOM" if oom else "error",
                            "note": "" if oom else f"{type(e).__name__}: "
                                                   f"{str(e).splitlines()[0][:160] if str(e) else ''}"})
                finally:
                    q.grad = k.grad = v.grad = None
            del fns, f
            torch.cuda.empty_cache()
        print(f"course_bench: [{k_point}/{len(points)}] {dt} N={n} d={d} "
              f"({time.time() - t_start:.0f} s)", file=sys.stderr, flush=True)
        del q, k, v, do
        torch.cuda.empty_cache()
    print(f"course_bench: wrote {len(rows)} rows to {os.path.relpath(a.out, ROOT)} in "
          f"{time.time() - t_start:.0f} s", file=sys.stderr)
    if left:
        print(f"course_bench: --max-minutes reached; not run ({len(left)} points): "
              + " ".join(f"{dt}:N={n}:d={d}" for dt, n, d in left)
              + "; run them with --append and --dtype/--N/--d", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
