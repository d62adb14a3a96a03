#!/usr/bin/env python3
"""Grades a student's PyTorch + Triton FlashAttention package: a printed report and a JSON one.

    tests/course/py_grade.py --package notebooks/my_flash [--impl pytorch,triton]
                             [--device auto|cpu|cuda] [--dtype fp32,bf16] [--quick]
                             [--json PATH] [--iters 20]

For each implementation (pytorch_flash, triton_flash) of the package, on the
shared ragged grid (tests/shapes.h: 12 shapes, causal and not) in each dtype,
forward() and backward() are run and checked against the project's fp64
reference (notebooks/flashstep_course/reference.py and checks.py: the C++
kit's bounds, FlashAttention's 2x-naive rule in bf16), and the autograd
Function on one case; every failure says which tensor, which rows and what
likely went wrong. On a GPU (--device cuda, the default when torch sees one)
the forward and backward are also timed beside the project's own
implementation (triton.testing.do_bench, B=1 H=8 N=1024 d=64).

--device cpu runs the PyTorch code on the CPU and the Triton kernels under
Triton's interpreter (TRITON_INTERPRET=1, set here before the package is
imported): slow (about a minute for the Triton grid in one dtype) but no GPU
needed. --quick keeps the grid's shapes with Nq, Nk <= 256.

The JSON has the C++ kit's format (tests/course/grade_stage.cpp): per
implementation ("stage") a "mirror" section, here the CPU run, and a "kernel"
section, the GPU run, each with its cases (problem, causal, pass,
max_abs_error_O, max_abs_error_L, problems, count_mismatches) plus the
gradients' max_abs_error_dQ/dK/dV and the dtype; "counts_match_model" and
"model" are null (no traffic model in Python). Exit: 0 pass, 1 fail,
2 bad usage, 77 nothing graded (PyTorch, or Triton for --impl triton, missing).
"""
import argparse
import importlib
import importlib.util
import json
import math
import os
import pathlib
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The venv `make pydeps` (and `make test`) makes when python3 lacks PyTorch.
VENV = ROOT / ".venv-course"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_SKIP = 0, 1, 2, 77
IMPLS = {"pytorch": ("pytorch_flash", "FlashAttentionPytorch", "tiled PyTorch, autograd Function"),
         "triton": ("triton_flash", "FlashAttentionTriton", "Triton kernels, forward and backward")}
QUICK_N = 256
TIMING_PROBLEM = (1, 8, 1024, 1024, 64)  # grade_stage.cpp's default problem


def load_package(path):
    """The student's package at `path`, imported under its folder name."""
    path = pathlib.Path(path).resolve()
    init = path / "__init__.py"
    if not init.exists():
        sys.exit(f"py_grade.py: {path} is no package (no __init__.py); make one with "
                 f"tests/course/py_starter.py {path}")
    spec = importlib.util.spec_from_file_location(path.name, init,
                                                  submodule_search_locations=[str(path)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.name] = module
    spec.loader.exec_module(module)
    return module


def num(x):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else \
        (1e999 if x == math.inf else float(x))


def grade_case(torch, impl, checks, R, shape, causal, dtype, device, seed):
    B, H, n_q, n_k, d = shape
    case = {"problem": checks.describe(B, H, n_q, n_k, d, causal, dtype), "causal": causal,
            "dtype": str(dtype).replace("torch.", ""), "pass": False,
            "max_abs_error_O": None, "max_abs_error_L": None, "max_abs_error_dQ": None,
            "max_abs_error_dK": None, "max_abs_error_dV": None, "problems": [],
            "count_mismatches": []}
    q, k, v, do = R.random_inputs((B, H, n_q, d), (B, H, n_k, d), dtype, device, seed)
    truth = checks.Truth(q, k, v, do, causal)
    try:
        o, lse = impl.forward(q, k, v, causal=causal)
        ok_f, e_o, e_l, problems = checks.check_forward(o, lse, truth)
        case.update(max_abs_error_O=num(e_o), max_abs_error_L=num(e_l))
        grads = impl.backward(q, k, v, o, lse, do, causal=causal)
        ok_b, errs, more = checks.check_backward(grads, truth)
        case.update({f"max_abs_error_{n}": num(e) for n, e in zip(("dQ", "dK", "dV"), errs)})
        case["problems"] = problems + more
        case["pass"] = ok_f and ok_b
    except Exception as e:  # noqa: BLE001 - a student's exception is a graded failure
        case["problems"].append(raised(e, impl))
    return case


def raised(e, impl):
    """One line for an exception from the student's code: where in their package,
    and for a TODO still standing, only the start of its hint."""
    folder = pathlib.Path(impl.__file__).parent
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if pathlib.Path(f.filename).parent == folder]
    where = f" at {pathlib.Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    text = str(e).splitlines()[0] if str(e) else ""
    if "TODO(student)" in text:
        hint = text[text.index("TODO(student)"):]
        return f"not written yet{where}: {hint[:110]}{'...' if len(hint) > 110 else ''}"
    return f"raised {type(e).__name__}{where}: {text[:300]}"


def grade_autograd(torch, package, impl_name, R, dtype, device):
    """The autograd Function on one ragged causal case: saves L, gives backward()'s gradients."""
    module = getattr(package, IMPLS[impl_name][0])
    fn = getattr(module, IMPLS[impl_name][1])
    q, k, v, do = R.random_inputs((2, 1, 113, 40), (2, 1, 203, 40), dtype, device, 99)
    try:
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        o = fn.apply(*leaves, True)
        saved = [t for t in o.grad_fn.saved_tensors if tuple(t.shape) == (2, 1, 113)]
        (o * do).sum().backward()
        o2, lse = module.forward(q, k, v, causal=True)
        grads = module.backward(q, k, v, o2, lse, do, causal=True)
        problems = []
        if not saved:
            problems.append(f"{IMPLS[impl_name][1]} does not save L [..., Nq] for the backward "
                            "(ctx.save_for_backward)")
        if not torch.equal(o, o2):
            problems.append(f"{IMPLS[impl_name][1]}.apply gives another O than forward()")
        for name, leaf, g in zip(("dQ", "dK", "dV"), leaves, grads):
            if leaf.grad is None or not torch.equal(leaf.grad, g):
                problems.append(f"autograd's {name} differs from backward()'s")
        return problems
    except Exception as e:  # noqa: BLE001
        return [f"{IMPLS[impl_name][1]}.apply: {raised(e, module)}"]


def timing(torch, R, package, reference_package, impl_name, dtype):
    """do_bench ms of forward and of forward + backward, the student's and the project's."""
    import triton.testing
    B, H, n, _, d = TIMING_PROBLEM
    q, k, v, do = (t.requires_grad_() if i < 3 else t for i, t in enumerate(
        R.random_inputs((B, H, n, d), (B, H, n, d), dtype, "cuda", 0)))
    out = []
    for who, pkg in (("yours", package), ("project", reference_package)):
        fn = getattr(getattr(pkg, IMPLS[impl_name][0]), IMPLS[impl_name][1])
        try:
            fwd = triton.testing.do_bench(lambda: fn.apply(q, k, v, True))
            both = triton.testing.do_bench(lambda: fn.apply(q, k, v, True).backward(do))
            out.append({"stage": f"{who}:{IMPLS[impl_name][0]}", "median_ms": fwd,
                        "fwd_bwd_ms": both})
        except Exception as e:  # noqa: BLE001
            out.append({"stage": f"{who}:{IMPLS[impl_name][0]}", "error": f"{type(e).__name__}: {e}"})
    return out


def print_section(name, sec):
    if not sec["graded"]:
        print(f"  {name}: not graded ({sec['skipped_why']})")
        return
    cases = sec["cases"]
    print(f"  {name}: {sum(c['pass'] for c in cases)} of {len(cases)} cases pass")

    def e(x):
        return "-" if x is None else f"{x:.2g}"
    for c in cases:
        print(f"    {'ok' if c['pass'] else 'FAIL':<4} {c['problem']:<44} O {e(c['max_abs_error_O']):<8}"
              f" L {e(c['max_abs_error_L']):<8} dQ {e(c['max_abs_error_dQ']):<8}"
              f" dK {e(c['max_abs_error_dK']):<8} dV {e(c['max_abs_error_dV'])}")
        for why in c["problems"][:8]:
            print(f"         - {why}")
    fails = [c for c in cases if not c["pass"]]
    if fails and all(c["causal"] for c in fails):
        print("  hint: only causal cases fail: check the mask (query i sees key j iff "
              "j <= i + Nk - Nq, bottom-right) and the tiles the causal loops skip")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--package", required=True, help="the student's package folder")
    ap.add_argument("--impl", default="pytorch,triton")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--dtype", default="fp32,bf16")
    ap.add_argument("--quick", action="store_true", help=f"only shapes with Nq, Nk <= {QUICK_N}")
    ap.add_argument("--json", help="JSON report path (default PACKAGE/grade.json)")
    ap.add_argument("--no-timing", action="store_true", help="skip the GPU timing")
    a = ap.parse_args()
    impls = [s.strip() for s in a.impl.split(",") if s.strip()]
    bad = [s for s in impls if s not in IMPLS]
    names = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
    dtypes = [s.strip() for s in a.dtype.split(",") if s.strip()]
    if bad or not impls or any(t not in names for t in dtypes) or not dtypes:
        print(f"py_grade.py: --impl takes {', '.join(IMPLS)}; --dtype takes {', '.join(names)}",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        import torch
    except ImportError as e:
        # Run as `tests/course/py_grade.py ...` by a python3 without PyTorch:
        # the project's venv has it, so go on there with the same arguments.
        venv_python = VENV / "bin" / "python"
        if venv_python.exists() and pathlib.Path(sys.prefix).resolve() != VENV.resolve():
            os.execv(venv_python, [str(venv_python), *sys.argv])
        print(f"py_grade.py: needs PyTorch ({e}); `make pydeps` installs it into .venv-course",
              file=sys.stderr)
        return EXIT_SKIP
    device = a.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        print("py_grade.py: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        return EXIT_SKIP
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before any triton.jit runs
    sys.path.insert(0, str(ROOT / "notebooks"))
    ref_pkg = importlib.import_module("flashstep_course")
    from flashstep_course import checks, reference as R
    package = load_package(a.package)
    grid = [p for p in checks.ragged_problems()
            if not a.quick or (p[2] <= QUICK_N and p[3] <= QUICK_N)]
    report = {"stages": [], "pass": True, "graded": False}
    for impl_name in impls:
        title = f"{package.__name__}.{IMPLS[impl_name][0]}"
        print(f"== {title} ({IMPLS[impl_name][2]}; {device}"
              f"{', Triton interpreter' if device == 'cpu' and impl_name == 'triton' else ''})")
        cpu = {"graded": False, "skipped_why": "", "cases": []}
        gpu = {"graded": False, "skipped_why": "", "cases": []}
        sec = cpu if device == "cpu" else gpu
        other = gpu if device == "cpu" else cpu
        other["skipped_why"] = (f"--device {device}" if device == "cuda" else
                                "no GPU" if not torch.cuda.is_available() else "--device cpu")
        try:
            impl = getattr(package, IMPLS[impl_name][0])
        except (ImportError, AttributeError) as e:
            sec["skipped_why"] = f"cannot import {IMPLS[impl_name][0]}: {e}"
            print(f"  not graded: {sec['skipped_why']}")
            report["stages"].append({"stage": title, "pass": False, "mirror": cpu,
                                     "kernel": gpu, "counts_match_model": None, "model": None,
                                     "timing": []})
            continue
        t0 = time.time()
        seed = 1
        for dt in dtypes:
            for (B, H, n_q, n_k, d, causal) in grid:
                sec["cases"].append(grade_case(torch, impl, checks, R, (B, H, n_q, n_k, d),
                                               causal, getattr(torch, names[dt]), device, seed))
                seed += 1
        sec["graded"] = True
        autograd = grade_autograd(torch, package, impl_name, R, getattr(torch, names[dtypes[0]]),
                                  device)
        if autograd:
            sec["cases"].append({"problem": "autograd Function, B=2 H=1 Nq=113 Nk=203 d=40 causal",
                                 "causal": True, "pass": False, "problems": autograd,
                                 "count_mismatches": [], "max_abs_error_O": None,
                                 "max_abs_error_L": None, "max_abs_error_dQ": None,
                                 "max_abs_error_dK": None, "max_abs_error_dV": None})
        print_section("cpu (graded as the kit's 'mirror')" if device == "cpu" else
                      "gpu (graded as the kit's 'kernel')", sec)
        print(f"  {len(sec['cases'])} cases in {time.time() - t0:.0f} s")
        timed = []
        if device == "cuda" and not a.no_timing:
            timed = timing(torch, R, package, ref_pkg, impl_name, torch.bfloat16)
            for t in timed:
                print(f"  time {t['stage']}: " + (t["error"] if "error" in t else
                      f"forward {t['median_ms']:.3f} ms, forward+backward {t['fwd_bwd_ms']:.3f} ms "
                      "(bf16, B=1 H=8 N=1024 d=64, causal)"))
        passed = all(c["pass"] for c in sec["cases"])
        print(f"  verdict: {'PASS' if passed else 'FAIL'}")
        report["graded"] = True
        report["pass"] = report["pass"] and passed
        report["stages"].append({"stage": title, "pass": passed, "mirror": cpu, "kernel": gpu,
                                 "counts_match_model": None, "model": None, "timing": timed})
    report["pass"] = report["pass"] and report["graded"]
    path = pathlib.Path(a.json or pathlib.Path(a.package) / "grade.json")
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"JSON report: {path}")
    if not report["graded"]:
        return EXIT_SKIP
    return EXIT_OK if report["pass"] else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
