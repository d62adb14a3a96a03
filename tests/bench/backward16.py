#!/usr/bin/env python3
"""Times stage 07's bf16 backward at the FlashAttention-2 paper's settings, with SDPA's.

The problems of sweep.py (hidden 2048: H = 2048/d, B = 16384/N, N in
{512 ... 16384}, d in {64, 128}, causal and not), in bf16. Our backwards
(07_tensor_core: dQ by atomics, as FlashAttention-2; 07_tensor_core_deterministic:
dQ by a second kernel) run through `flashstep --backward --dtype bf16 --format
csv`: forward and backward each checked against fp64 where affordable (the
gradients by the low-precision rule of common/check.h), timed with CUDA events,
L2 flushed, median of the timed runs, the backward timed alone after one
forward. The peers, PyTorch SDPA's flash (FlashAttention-2's own kernels),
cuDNN and math (standard attention) backends in bf16, run in the same process
order on the same problems when torch with CUDA is there: forward alone and
backward alone (autograd.grad with retain_graph), timed the same way; their
gradients' largest error on head 0 against fp64 is reported (not judged) where
one head's N x N fits the budget. Stage 02's standard backward runs in fp32
only, so the 16-bit standard-attention baseline is SDPA math.

Each problem gives two rows per implementation: pass "bwd" (TFLOP/s counts 2.5
x the forward's 4*B*H*N^2*d, halved if causal) and pass "fwd+bwd" (3.5 x; its
time is the sum of the forward's and the backward's medians: the paper's
Figure 4 shape).

    python3 tests/bench/backward16.py --flashstep build/stages/cli/flashstep \\
        --out docs/results/backward16.csv
"""
import datetime
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sweep import (HIDDEN, ITERS, LONG_N, TOKENS, Parser, add_problem_args,  # noqa: E402
                   check_flashstep, check_problem_args, gpu_facts, paper_problems, write_csv)
from peers import INPUT_MEAN, flush_buffer, short, time_ms  # noqa: E402
from backward import flashstep_backward, head0_reference  # noqa: E402

STAGES = "07_tensor_core,07_tensor_core_deterministic"
PEERS = {"sdpa_flash_bf16": "FLASH_ATTENTION", "sdpa_cudnn_bf16": "CUDNN_ATTENTION",
         "sdpa_math_bf16": "MATH"}
FLOP_FACTOR = {"bwd": 2.5, "fwd+bwd": 3.5}  # FlashAttention's convention, x the forward's
# Peers' gradients of head 0 are compared with fp64 while one head's N x N
# doubles stay this small (as the CLI's budget).
COLUMNS = ["stage", "pass", "dtype", "check", "max err dQKV", "fwd median ms", "bwd median ms",
           "median ms", "TFLOP/s", "B", "H", "Nq", "Nk", "d", "causal", "iters", "note", "torch",
           "gpu", "driver", "max_sm_clock", "date", "commit"]


def flashstep_rows(exe, B, H, N, d, causal, warmup, iters):
    """Our stages' (fwd ms, bwd ms, check, max err) on one problem, from `flashstep --backward`."""
    got, rc = flashstep_backward(exe, STAGES, B, H, N, d, causal, warmup, iters,
                                 extra=("--dtype", "bf16"))
    out = []
    for r in got:
        # The backward's verdict (ok, or unchecked past the fp64 budget), unless
        # either pass failed.
        passed = r["check"] in ("ok", "unchecked") and r["bwd check"] in ("ok", "unchecked")
        check = r["bwd check"] if passed else f"fwd {r['check']}, bwd {r['bwd check']}"
        out.append({"stage": r["stage"], "check": check, "max err dQKV": r["max err dQKV"],
                    "fwd median ms": r["median ms"], "bwd median ms": r["bwd median ms"],
                    "iters": iters, "note": ""})
    return out, rc


def head0_error(torch, q, k, v, dO, grads, causal):
    """Largest |error| of dQ, dK, dV of batch 0, head 0 against fp64 of the bf16 inputs."""
    want = head0_reference(torch, q, k, v, dO, causal)
    if want is None:
        return ""
    return f"{max((g[0, 0].double() - w).abs().max().item() for g, w in zip(grads, want)):.2g}"


def peer_cells(torch, F, sdpa_kernel, backend, inputs, dO, causal, warmup, iters, flush):
    """One peer on one problem: forward and backward medians, the check, a note."""
    cells = {"check": "", "max err dQKV": "", "fwd median ms": "", "bwd median ms": "",
             "iters": "", "note": ""}
    q, k, v = (t.detach().clone().requires_grad_() for t in inputs)
    try:
        with sdpa_kernel(backend):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            grads = torch.autograd.grad(o, (q, k, v), dO, retain_graph=True)
            cells["max err dQKV"] = head0_error(torch, q, k, v, dO, grads, causal)
            cells["check"] = "reported" if cells["max err dQKV"] else "unchecked"
            del grads

            def forward():
                F.scaled_dot_product_attention(q, k, v, is_causal=causal)

            def backward():
                torch.autograd.grad(o, (q, k, v), dO, retain_graph=True)

            fwd = time_ms(torch, forward, warmup, iters, flush)[0]
            bwd = time_ms(torch, backward, warmup, iters, flush)[0]
            del o
    except torch.cuda.OutOfMemoryError:
        cells["note"] = "out of memory"
        return cells
    except RuntimeError as e:
        cells.update({"check": "error", "note": short(e)})
        return cells
    finally:
        del q, k, v
        torch.cuda.empty_cache()
    cells.update({"fwd median ms": f"{fwd:.4g}", "bwd median ms": f"{bwd:.4g}",
                  "iters": str(iters)})
    return cells


def pass_rows(cells, flops):
    """The "bwd" and "fwd+bwd" rows of one implementation on one problem."""
    out = []
    for name, factor in FLOP_FACTOR.items():
        r = dict(cells, **{"pass": name, "median ms": "", "TFLOP/s": ""})
        fwd, bwd = cells["fwd median ms"], cells["bwd median ms"]
        if bwd and (name == "bwd" or fwd):
            ms = float(bwd) + (float(fwd) if name == "fwd+bwd" else 0.0)
            tflops = factor * flops / (ms / 1e3) / 1e12
            r.update({"median ms": f"{ms:.4g}", "TFLOP/s": f"{tflops:.3g}"})
        out.append(r)
    return out


def main():
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--flashstep", required=True, help="path to the flashstep binary")
    ap.add_argument("--out", required=True, help="CSV to write")
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
            if not torch.cuda.is_available():
                raise ImportError("torch sees no CUDA device")
        except ImportError as e:
            print(f"backward16: no PyTorch with CUDA ({e}); our stages only", file=sys.stderr)
            torch = None
    meta = gpu_facts()
    meta.update(date=datetime.date.today().isoformat(), commit=args.commit, dtype="bf16",
                torch=torch.__version__ if torch else "")
    if torch:
        device = torch.device("cuda", torch.cuda.current_device())
        flush = flush_buffer(torch, device)
        gen = torch.Generator(device=device).manual_seed(args.seed)

    problems = paper_problems(args)
    rows, failures, t_all = [], 0, time.time()
    for n_done, (N, d, causal) in enumerate(problems, 1):
        B, H = TOKENS // N, HIDDEN // d
        warmup, iters = ITERS["long" if N >= LONG_N else "short"]
        t0 = time.time()
        batch, rc = flashstep_rows(args.flashstep, B, H, N, d, causal, warmup, iters)
        # No rows of ours (no GPU, or the run failed) is a failure too.
        failures += (rc != 0 or not batch
                     or any(r["check"] not in ("ok", "unchecked") for r in batch))
        if torch:
            inputs = [(torch.randn((B, H, N, d), generator=gen, device=device) + INPUT_MEAN)
                      .to(torch.bfloat16) for _ in range(3)]
            dO = (torch.randn((B, H, N, d), generator=gen, device=device) + INPUT_MEAN
                  ).to(torch.bfloat16)
            for peer, member in PEERS.items():
                cells = peer_cells(torch, F, sdpa_kernel, getattr(SDPBackend, member), inputs, dO,
                                   causal, warmup, iters, flush)
                batch.append({"stage": peer, **cells})
            del inputs, dO
            torch.cuda.empty_cache()
        flops = 4.0 * B * H * N * N * d / (2 if causal else 1)
        problem = {"B": B, "H": H, "Nq": N, "Nk": N, "d": d, "causal": int(causal)}
        for cells in batch:
            for r in pass_rows(cells, flops):
                rows.append({c: {**r, **problem, **meta}.get(c, "") for c in COLUMNS})
        print(f"[{n_done}/{len(problems)}] N={N} d={d} causal={int(causal)}: "
              + ", ".join(f"{c['stage']} bwd {c['bwd median ms'] or '-'} ms {c['check']}"
                          for c in batch)
              + f" ({time.time() - t0:.1f} s)", file=sys.stderr, flush=True)
    write_csv(args.out, rows, COLUMNS)
    print(f"backward16: {len(rows)} rows to {args.out} in {time.time() - t_all:.0f} s; "
          f"{failures} failure(s)", file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
