#!/usr/bin/env python3
"""Times PyTorch SDPA's backends (the peers) on sweep.py's problems, in one GPU run.

The same problems as sweep.py (hidden 2048: H = 2048/d, B = 16384/N, N in
{512 ... 16384}, d in {64, 128}, causal and not) and its timing method: CUDA
events after warm-up, L2 flushed (a buffer twice its size read, as the CLI's
flush_l2 does) before each timed run, median and p20/p80; fewer runs from
N = 8192 on. Peers:

  sdpa_efficient_fp32  SDPBackend.EFFICIENT_ATTENTION, float32
  sdpa_math_fp32       SDPBackend.MATH, float32 (materialises S: may run out of memory)
  sdpa_flash_bf16      SDPBackend.FLASH_ATTENTION, bfloat16 (FlashAttention-2's own kernel)
  sdpa_cudnn_bf16      SDPBackend.CUDNN_ATTENTION, bfloat16
  sdpa_math_bf16       SDPBackend.MATH, bfloat16: standard attention in 16 bits, as the
                       FlashAttention-2 paper's figures run it (may run out of memory)
  sdpa_flash_fp16      SDPBackend.FLASH_ATTENTION, float16
  sdpa_cudnn_fp16      SDPBackend.CUDNN_ATTENTION, float16

fp32 peers run with TF32 off. The problems are square (Nq = Nk), so SDPA's
is_causal (top-left) is flashstep's bottom-right mask. Each result is checked
against fp64 on a sample of query rows; a peer that cannot run (out of memory,
no kernel for the shape) gets a row with an empty time and a note. Rows go to
the output CSV with the GPU, driver, date, commit and torch version, in
forward.csv's columns where they apply; progress goes to stderr.

    python3 tests/bench/peers.py --out docs/results/peers.csv [--N 1024 2048] [--d 64]
"""
import argparse
import datetime
import math
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sweep import HIDDEN, ITERS, LONG_N, TOKENS, gpu_facts, write_csv  # noqa: E402

# stage column: (SDPBackend member, dtype name).
PEERS = {
    "sdpa_efficient_fp32": ("EFFICIENT_ATTENTION", "float32"),
    "sdpa_math_fp32": ("MATH", "float32"),
    "sdpa_flash_bf16": ("FLASH_ATTENTION", "bfloat16"),
    "sdpa_cudnn_bf16": ("CUDNN_ATTENTION", "bfloat16"),
    "sdpa_math_bf16": ("MATH", "bfloat16"),
    "sdpa_flash_fp16": ("FLASH_ATTENTION", "float16"),
    "sdpa_cudnn_fp16": ("CUDNN_ATTENTION", "float16"),
}
COLUMNS = ["stage", "check", "max err O", "median ms", "p20 ms", "p80 ms", "TFLOP/s",
           "B", "H", "Nq", "Nk", "d", "causal", "iters", "note", "torch",
           "gpu", "driver", "max_sm_clock", "date", "commit"]
L2_FLUSH_FACTOR = 2    # the flush buffer is this many times the L2 size (as common/l2_flush.h)
INPUT_MEAN = 0.5       # common/check.h kInputMean: zero-mean inputs hide errors
CHECK_ROWS = 64        # query rows (of batch 0, head 0) checked against fp64
# |got - want| <= atol + rtol*|want| against fp64 on the inputs as the peer saw
# them: fp32 as common/check.h's kFp32Tolerance (TF32 left on would fail it);
# bf16 loose enough for bf16 P and O (relative rounding 2^-8; the math backend
# also rounds S), tight enough to catch a wrong mask or scale; fp16 the same
# with 3 more bits (relative rounding 2^-11).
TOLERANCE = {"float32": (1e-5, 1e-4), "bfloat16": (1e-2, 2e-2), "float16": (2e-3, 4e-3)}
NOTE_CHARS = 160       # a note keeps the first line of the reason, this long at most


def percentile(sorted_ms, q):
    """Linear interpolation between order statistics (as common/device.cpp)."""
    pos = q * (len(sorted_ms) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_ms) - 1)
    t = pos - lo
    return sorted_ms[lo] * (1 - t) + sorted_ms[hi] * t


def flush_buffer(torch, device):
    """The L2 flush's buffer: L2_FLUSH_FACTOR times the L2 size of int32 zeros.

    time_ms flushes by reading it (a sum), as the CLI does (common/l2_flush.h):
    a flush that writes leaves L2 full of dirty lines, and the timed run pays
    for writing them back (on the H200 6-10 us, a fifth of a short decode)."""
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    return torch.zeros(L2_FLUSH_FACTOR * l2 // 4, dtype=torch.int32, device=device)


def time_ms(torch, fn, warmup, iters, flush):
    """Median, p20, p80 of `iters` runs of fn, each after an L2 flush (flush:
    flush_buffer's, read)."""
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for k in range(iters):
        flush.sum()
        starts[k].record()
        fn()
        stops[k].record()
    torch.cuda.synchronize()
    ms = sorted(s.elapsed_time(e) for s, e in zip(starts, stops))
    return percentile(ms, 0.5), percentile(ms, 0.2), percentile(ms, 0.8)


def check_rows(torch, q, k, v, o, causal, dtype_name):
    """('ok' or 'FAIL', max abs error) of O on sampled rows of batch 0, head 0."""
    N, d = q.shape[2], q.shape[3]
    rows = torch.linspace(0, N - 1, min(CHECK_ROWS, N), device=q.device).long()
    q64, k64, v64 = q[0, 0, rows].double(), k[0, 0].double(), v[0, 0].double()
    s = (q64 @ k64.T) / math.sqrt(d)
    if causal:  # square: row i sees keys 0..i
        s = s.masked_fill(torch.arange(N, device=q.device)[None, :] > rows[:, None], -math.inf)
    want = torch.softmax(s, dim=-1) @ v64
    got = o[0, 0, rows].double()
    atol, rtol = TOLERANCE[dtype_name]
    err = (got - want).abs()
    ok = bool((err <= atol + rtol * want.abs()).all())
    return ("ok" if ok else "FAIL"), err.max().item()


def short(text):
    line = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return line[:NOTE_CHARS]


def run_peer(torch, F, SDPBackend, sdpa_kernel, peer, inputs32, causal, warmup, iters, flush):
    """One peer on one problem: dict of the timing and check cells."""
    member, dtype_name = PEERS[peer]
    cells = {"check": "", "max err O": "", "median ms": "", "p20 ms": "", "p80 ms": "",
             "iters": "", "note": ""}
    backend = getattr(SDPBackend, member, None)
    if backend is None:
        cells["note"] = f"SDPBackend.{member} is not in this torch"
        return cells
    q, k, v = (t.to(getattr(torch, dtype_name)) for t in inputs32)

    def fn():
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    try:
        with sdpa_kernel(backend), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                o = fn()
            except RuntimeError as e:
                if isinstance(e, torch.cuda.OutOfMemoryError):
                    raise
                why = "; ".join(short(w.message) for w in caught) or short(e)
                cells["note"] = short(f"no kernel: {why}")
                return cells
            cells["check"], err = check_rows(torch, q, k, v, o, causal, dtype_name)
            cells["max err O"] = f"{err:.2g}"
            del o
            median, p20, p80 = time_ms(torch, fn, warmup, iters, flush)
    except torch.cuda.OutOfMemoryError:
        cells.update({"check": "", "max err O": "", "note": "out of memory"})
        return cells
    except RuntimeError as e:  # failed while checking or timing: record it, go on
        cells.update({"check": "error", "note": short(e)})
        return cells
    finally:
        del q, k, v
        torch.cuda.empty_cache()
    cells.update({"median ms": f"{median:.4g}", "p20 ms": f"{p20:.4g}", "p80 ms": f"{p80:.4g}",
                  "iters": str(iters)})
    if dtype_name == "float32":
        cells["note"] = "TF32 off"
    return cells


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="CSV to write")
    ap.add_argument("--N", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    ap.add_argument("--peer", default=",".join(PEERS),
                    help="comma-separated subset of " + ", ".join(PEERS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--commit", default=os.environ.get("FLASHSTEP_COMMIT", "unknown"))
    args = ap.parse_args()
    peers = [p.strip() for p in args.peer.split(",") if p.strip()]
    unknown = [p for p in peers if p not in PEERS]
    if unknown or not peers:
        ap.error(f"--peer: unknown {', '.join(unknown) or '(none given)'}; "
                 f"choose from {', '.join(PEERS)}")

    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        sys.exit(f"peers: needs PyTorch >= 2.3 with CUDA (the GPU machine's image has it): {e}")

    if not torch.cuda.is_available():
        sys.exit("peers: no CUDA device visible to torch")
    # fp32 peers in true fp32: no TF32 in the matmuls (MATH) or in cuDNN.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    device = torch.device("cuda", torch.cuda.current_device())
    flush = flush_buffer(torch, device)
    gen = torch.Generator(device=device).manual_seed(args.seed)

    meta = gpu_facts()
    if not meta["gpu"]:
        meta["gpu"] = torch.cuda.get_device_name(device)
    meta.update(date=datetime.date.today().isoformat(), commit=args.commit,
                torch=torch.__version__)
    causals = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    problems = [(N, d, c) for d in args.d for c in causals for N in args.N]

    rows, failures = [], 0
    t_all = time.time()
    with torch.inference_mode():
        for n_done, (N, d, causal) in enumerate(problems, 1):
            B, H = TOKENS // N, HIDDEN // d
            warmup, iters = ITERS["long" if N >= LONG_N else "short"]
            t0 = time.time()
            inputs32 = [torch.randn((B, H, N, d), generator=gen, device=device) + INPUT_MEAN
                        for _ in range(3)]
            flops = 4.0 * B * H * N * N * d / (2 if causal else 1)
            summary = []
            for peer in peers:
                cells = run_peer(torch, F, SDPBackend, sdpa_kernel, peer, inputs32, causal,
                                 warmup, iters, flush)
                tflops = (f"{flops / (float(cells['median ms']) / 1e3) / 1e12:.3g}"
                          if cells["median ms"] else "")
                row = {"stage": peer, **cells, "TFLOP/s": tflops, "B": B, "H": H, "Nq": N,
                       "Nk": N, "d": d, "causal": int(causal), **meta}
                rows.append({c: row.get(c, "") for c in COLUMNS})
                failures += cells["check"] == "FAIL"
                summary.append(f"{peer} " + (f"{cells['median ms']} ms {cells['check']}"
                                             if cells["median ms"] else f"- ({cells['note']})"))
            del inputs32
            print(f"[{n_done}/{len(problems)}] N={N} d={d} causal={int(causal)}: "
                  + ", ".join(summary) + f" ({time.time() - t0:.1f} s)",
                  file=sys.stderr, flush=True)

    write_csv(args.out, rows, COLUMNS)
    print(f"peers: {len(rows)} rows to {args.out} in {time.time() - t_all:.0f} s; "
          f"{failures} check failure(s)", file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
