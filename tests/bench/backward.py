#!/usr/bin/env python3
"""Times every backward pass at the FlashAttention-2 paper's settings, with PyTorch's.

The problems of sweep.py (hidden 2048: H = 2048/d, B = 16384/N, N in
{512 ... 16384}, d in {64, 128}, causal and not). Our stages run through
`flashstep --backward --format csv` (forward and backward each checked against
fp64 where affordable: all heads, or head 0 alone, or none above N = 4096;
timed with CUDA events, L2 flushed, median of the timed runs; the backward
timed alone, after one forward). The peers, PyTorch SDPA's memory-efficient
and math backends in fp32 (TF32 off), are timed the same way: the backward
alone (autograd.grad with retain_graph), their gradients checked against fp64
on head 0 where affordable, and their peak memory over forward + backward
recorded. TFLOP/s counts 2.5 x the forward's 4*B*H*N^2*d (halved if causal).

Last, dQ's run-to-run variation (--determinism-out): our backwards run
DETERMINISM_RUNS times on the same inputs (`flashstep --backward --save`), and
each run's dQ, dK, dV are compared with the first's, element by element.

It writes the timings (--out) and the memory table (--memory-out):
each backward's device memory at N = 16384 and the largest N (B = 1,
H = 2048/d) it can run on this GPU. For our stages both come from the exact
allocation (`flashstep model --backward`'s device memory). For the peers the
N = 16384 figure is measured (peak allocated), and the largest N is
extrapolated from it: the math backend's memory beyond the tensors grows as
N^2 (it stores P and its gradient), the memory-efficient one's as N.

    python3 tests/bench/backward.py --flashstep build/stages/cli/flashstep \\
        --out docs/results/backward.csv --memory-out docs/results/backward_memory.csv
"""
import csv
import datetime
import io
import math
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sweep import (HIDDEN, ITERS, LONG_N, TOKENS, Parser, add_problem_args,  # noqa: E402
                   check_flashstep, check_problem_args, gpu_facts, paper_problems, write_csv)
from peers import INPUT_MEAN, flush_buffer, short, time_ms  # noqa: E402

STAGES = "02,05"           # the stages with a backward pass
PEERS = {"sdpa_efficient_fp32": "EFFICIENT_ATTENTION", "sdpa_math_fp32": "MATH"}
BACKWARD_FLOP_FACTOR = 2.5  # FlashAttention's convention: backward = 2.5 x forward
MEMORY_N = 16384           # the memory point
FP32_BYTES = 4
# Gradients of head 0 are checked against fp64 while one head's N x N doubles
# stay this small (as the CLI's budget).
CHECK_MAX_SCORES = 16 * 1024 * 1024
GRAD_TOLERANCE = (1e-4, 1e-4)  # common/check.h kFp32GradTolerance
COLUMNS = ["stage", "check", "max err dQKV", "median ms", "p20 ms", "p80 ms", "TFLOP/s",
           "B", "H", "Nq", "Nk", "d", "causal", "memory", "HBM read", "HBM write", "iters",
           "note", "torch", "gpu", "driver", "max_sm_clock", "date", "commit"]
DETERMINISM_RUNS = 5
# (B, H, N, d, causal): moderate sizes, so the saved .npy files stay small.
DETERMINISM_PROBLEMS = [(1, 8, 4096, 64, False), (1, 8, 4096, 64, True), (1, 8, 4096, 128, False)]
DETERMINISM_COLUMNS = ["stage", "B", "H", "Nq", "Nk", "d", "causal", "runs", "dQ elements",
                       "dQ differing", "dQ max abs diff", "dQ max abs", "dQ max rel diff", "dK identical",
                       "dV identical", "gpu", "driver", "date", "commit"]
MEMORY_COLUMNS = ["stage", "d", "N", "B", "H", "memory", "how", "largest N", "largest N how",
                  "gpu memory", "gpu", "driver", "date", "commit"]


def flashstep_backward(exe, stages, B, H, N, d, causal, warmup, iters, extra=()):
    """`flashstep --backward` on one problem: its CSV rows that have a backward
    (none without a GPU, where it prints the model) and its exit code."""
    cmd = [exe, "--backward", "--stage", stages, "--B", str(B), "--H", str(H), "--N", str(N),
           "--d", str(d), "--format", "csv", "--warmup", str(warmup), "--iters", str(iters),
           *extra]
    if causal:
        cmd.append("--causal")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
    rows = [r for r in csv.DictReader(io.StringIO(proc.stdout)) if r.get("bwd check", "-") != "-"]
    return rows, proc.returncode


def flashstep_rows(exe, B, H, N, d, causal, warmup, iters):
    """Our stages' backward rows on one problem, from `flashstep --backward`."""
    got, rc = flashstep_backward(exe, STAGES, B, H, N, d, causal, warmup, iters)
    rows = []
    for r in got:
        rows.append({"stage": r["stage"], "check": r["bwd check"],
                     "max err dQKV": r["max err dQKV"], "median ms": r["bwd median ms"],
                     "p20 ms": r["bwd p20 ms"], "p80 ms": r["bwd p80 ms"],
                     "TFLOP/s": r["bwd TFLOP/s"], "B": B, "H": H, "Nq": N, "Nk": N, "d": d,
                     "causal": int(causal), "memory": r["bwd memory"],
                     "HBM read": r["bwd HBM read"], "HBM write": r["bwd HBM write"],
                     "iters": iters, "note": ""})
    return rows, rc


def model_memory(exe, stage, B, H, N, d):
    """Exact device bytes a forward + backward run of `stage` allocates."""
    out = subprocess.run([exe, "model", "--backward", "--stage", stage, "--B", str(B),
                          "--H", str(H), "--N", str(N), "--d", str(d), "--format", "csv"],
                         capture_output=True, text=True, check=True).stdout
    return int(next(csv.DictReader(io.StringIO(out)))["device memory"])


def determinism(exe, workdir):
    """Rows of dQ's (and dK's, dV's) variation over DETERMINISM_RUNS runs."""
    import numpy as np
    rows = []
    for B, H, N, d, causal in DETERMINISM_PROBLEMS:
        runs = []
        for k in range(DETERMINISM_RUNS):
            out = os.path.join(workdir, f"det{k}")
            cmd = [exe, "--backward", "--stage", STAGES, "--B", str(B), "--H", str(H), "--N", str(N),
                   "--d", str(d), "--iters", "0", "--no-check", "--save", out, "--overwrite"]
            subprocess.run(cmd + (["--causal"] if causal else []), capture_output=True, check=True)
            runs.append(out)
        for stage in ("02_safe_softmax", "05_sequence_parallel"):
            load = lambda run, g: np.load(os.path.join(run, f"{g}_{stage}.npy"))  # noqa: E731
            first = {g: load(runs[0], g) for g in ("dQ", "dK", "dV")}
            differing, max_abs, max_rel, same_k, same_v = 0, 0.0, 0.0, True, True
            for run in runs[1:]:
                dQ = load(run, "dQ")
                diff = np.abs(dQ.astype(np.float64) - first["dQ"])
                differing += int((dQ != first["dQ"]).sum())
                max_abs = max(max_abs, float(diff.max()))
                max_rel = max(max_rel, float((diff / np.maximum(np.abs(first["dQ"]), 1e-30)).max()))
                same_k = same_k and np.array_equal(load(run, "dK"), first["dK"])
                same_v = same_v and np.array_equal(load(run, "dV"), first["dV"])
            rows.append({"stage": stage, "B": B, "H": H, "Nq": N, "Nk": N, "d": d,
                         "causal": int(causal), "runs": DETERMINISM_RUNS,
                         "dQ elements": first["dQ"].size * (DETERMINISM_RUNS - 1),
                         "dQ differing": differing, "dQ max abs diff": f"{max_abs:.3g}",
                         "dQ max abs": f"{float(np.abs(first['dQ']).max()):.3g}",
                         "dQ max rel diff": f"{max_rel:.3g}", "dK identical": int(same_k),
                         "dV identical": int(same_v)})
            print(f"determinism: {stage} N={N} d={d} causal={int(causal)}: {differing} dQ elements "
                  f"differ, max rel {max_rel:.3g}", file=sys.stderr, flush=True)
    return rows


def largest_n(fits):
    """The largest N (a multiple of 64) with fits(N) true, by doubling then bisection."""
    lo, hi = 64, 128
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 64:
        mid = (lo + hi) // 2 // 64 * 64
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def head0_reference(torch, q, k, v, dO, causal):
    """fp64 dQ, dK, dV of batch 0, head 0 from the inputs as given (None when
    one head's N x N scores pass CHECK_MAX_SCORES)."""
    N = q.shape[2]
    if N * N > CHECK_MAX_SCORES:
        return None
    q64, k64, v64 = (t[0, 0].detach().double().requires_grad_() for t in (q, k, v))
    s = (q64 @ k64.T) / math.sqrt(q.shape[3])
    if causal:
        s = s.masked_fill(torch.ones(N, N, dtype=torch.bool, device=q.device).triu(1), -math.inf)
    o = torch.softmax(s, dim=-1) @ v64
    return torch.autograd.grad(o, (q64, k64, v64), dO[0, 0].double())


def check_head0(torch, q, k, v, dO, grads, causal):
    """('ok' or 'FAIL', max abs error) of dQ, dK, dV of batch 0, head 0 against fp64."""
    want = head0_reference(torch, q, k, v, dO, causal)
    if want is None:
        return "unchecked", float("nan")
    atol, rtol = GRAD_TOLERANCE
    ok, worst = True, 0.0
    for got, w in zip(grads, want):
        err = (got[0, 0].double() - w).abs()
        ok = ok and bool((err <= atol + rtol * w.abs()).all())
        worst = max(worst, err.max().item())
    return ("ok" if ok else "FAIL"), worst


def peer_row(torch, F, sdpa_kernel, backend, inputs, dO, causal, warmup, iters, flush):
    """One peer's backward on one problem: the timing, check and memory cells."""
    cells = {"check": "", "max err dQKV": "", "median ms": "", "p20 ms": "", "p80 ms": "",
             "memory": "", "iters": "", "note": ""}
    q, k, v = (t.detach().clone().requires_grad_() for t in inputs)
    try:
        with sdpa_kernel(backend):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            grads = torch.autograd.grad(o, (q, k, v), dO, retain_graph=True)
            torch.cuda.synchronize()
            cells["memory"] = str(torch.cuda.max_memory_allocated())
            cells["check"], err = check_head0(torch, q, k, v, dO, grads, causal)
            cells["max err dQKV"] = "" if math.isnan(err) else f"{err:.2g}"
            del grads

            def backward():
                torch.autograd.grad(o, (q, k, v), dO, retain_graph=True)

            median, p20, p80 = time_ms(torch, backward, warmup, iters, flush)
            del o
    except torch.cuda.OutOfMemoryError:
        cells.update({"check": "", "max err dQKV": "", "note": "out of memory"})
        return cells
    except RuntimeError as e:
        cells.update({"check": "error", "note": short(e)})
        return cells
    finally:
        del q, k, v
        torch.cuda.empty_cache()
    cells.update({"median ms": f"{median:.4g}", "p20 ms": f"{p20:.4g}", "p80 ms": f"{p80:.4g}",
                  "iters": str(iters), "note": "TF32 off"})
    return cells


def main():
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--flashstep", required=True, help="path to the flashstep binary")
    ap.add_argument("--out", required=True, help="timings CSV to write")
    ap.add_argument("--memory-out", required=True, help="memory CSV to write")
    ap.add_argument("--determinism-out", help="dQ run-to-run CSV to write (skipped if absent)")
    ap.add_argument("--workdir", default="/tmp/flashstep_backward", help="scratch for .npy files")
    add_problem_args(ap)
    ap.add_argument("--no-peers", action="store_true", help="our stages only (no PyTorch)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--commit", default=os.environ.get("FLASHSTEP_COMMIT", "unknown"))
    args = ap.parse_args()
    check_flashstep(ap, args.flashstep)
    check_problem_args(ap, args)

    torch = F = sdpa_kernel = SDPBackend = None
    if not args.no_peers:
        try:
            import torch
            import torch.nn.functional as F
            from torch.nn.attention import SDPBackend, sdpa_kernel
        except ImportError as e:
            print(f"backward: no PyTorch ({e}); our stages only", file=sys.stderr)
    meta = gpu_facts()
    meta.update(date=datetime.date.today().isoformat(), commit=args.commit,
                torch=torch.__version__ if torch else "")
    gpu_memory = None
    if torch:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        device = torch.device("cuda", torch.cuda.current_device())
        props = torch.cuda.get_device_properties(device)
        gpu_memory = props.total_memory
        flush = flush_buffer(torch, device)
        gen = torch.Generator(device=device).manual_seed(args.seed)

    problems = paper_problems(args)
    rows, failures, t_all = [], 0, time.time()
    for n_done, (N, d, causal) in enumerate(problems, 1):
        B, H = TOKENS // N, HIDDEN // d
        warmup, iters = ITERS["long" if N >= LONG_N else "short"]
        t0 = time.time()
        ours, rc = flashstep_rows(args.flashstep, B, H, N, d, causal, warmup, iters)
        failures += rc != 0
        batch = ours
        if torch:
            inputs = [torch.randn((B, H, N, d), generator=gen, device=device) + INPUT_MEAN
                      for _ in range(3)]
            dO = torch.randn((B, H, N, d), generator=gen, device=device) + INPUT_MEAN
            for peer, member in PEERS.items():
                cells = peer_row(torch, F, sdpa_kernel, getattr(SDPBackend, member), inputs, dO,
                                 causal, warmup, iters, flush)
                failures += cells["check"] == "FAIL"
                batch.append({"stage": peer, **cells, "B": B, "H": H, "Nq": N, "Nk": N, "d": d,
                              "causal": int(causal)})
            del inputs, dO
            torch.cuda.empty_cache()
        flops = BACKWARD_FLOP_FACTOR * 4.0 * B * H * N * N * d / (2 if causal else 1)
        for r in batch:
            if r["median ms"] and not r.get("TFLOP/s"):
                r["TFLOP/s"] = f"{flops / (float(r['median ms']) / 1e3) / 1e12:.3g}"
            rows.append({c: {**r, **meta}.get(c, "") for c in COLUMNS})
        print(f"[{n_done}/{len(problems)}] N={N} d={d} causal={int(causal)}: "
              + ", ".join(f"{r['stage']} {r['median ms'] or '-'} ms {r['check']}" for r in batch)
              + f" ({time.time() - t0:.1f} s)", file=sys.stderr, flush=True)

    memory_rows = []
    for d in args.d:
        H = HIDDEN // d
        for stage in ("02_safe_softmax", "05_sequence_parallel"):
            need = model_memory(args.flashstep, stage, 1, H, MEMORY_N, d)
            big = (largest_n(lambda n: model_memory(args.flashstep, stage, 1, H, n, d) <= gpu_memory)
                   if gpu_memory else "")
            memory_rows.append({"stage": stage, "d": d, "N": MEMORY_N, "B": 1, "H": H,
                                "memory": need, "how": "allocation (model)", "largest N": big,
                                "largest N how": "allocation <= GPU memory" if big else ""})
        for peer in PEERS:
            measured = [r for r in rows if r["stage"] == peer and r["Nq"] == MEMORY_N
                        and r["d"] == d and r["memory"]]
            if not measured or not gpu_memory:
                continue
            peak = max(int(r["memory"]) for r in measured)
            # Q, K, V, O, dO, dQ, dK, dV: the memory any backward needs; the rest grows
            # as N^2 (math: P, dP) or N (memory-efficient: L and its workspace).
            tensors = 8 * H * MEMORY_N * d * FP32_BYTES
            power = 2 if peer == "sdpa_math_fp32" else 1
            extra = max(peak - tensors, 0)

            def fits(n, extra=extra, power=power):
                return 8 * H * n * d * FP32_BYTES + extra * (n / MEMORY_N) ** power <= gpu_memory

            memory_rows.append({"stage": peer, "d": d, "N": MEMORY_N, "B": 1, "H": H,
                                "memory": peak, "how": "measured peak",
                                "largest N": largest_n(fits),
                                "largest N how": f"extrapolated: extra memory as N^{power}"})
    for r in memory_rows:
        r.update({"gpu memory": gpu_memory or "", **{k: meta[k] for k in
                                                     ("gpu", "driver", "date", "commit")}})

    outputs = [(args.out, COLUMNS, rows), (args.memory_out, MEMORY_COLUMNS, memory_rows)]
    if args.determinism_out:
        det_rows = determinism(args.flashstep, args.workdir)
        for r in det_rows:
            r.update({k: meta[k] for k in ("gpu", "driver", "date", "commit")})
        outputs.append((args.determinism_out, DETERMINISM_COLUMNS, det_rows))
    for path, cols, data in outputs:
        write_csv(path, data, cols)
    print(f"backward: {len(rows)} rows to {args.out}, {len(memory_rows)} to {args.memory_out} "
          f"in {time.time() - t_all:.0f} s; {failures} failure(s)", file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
