#!/usr/bin/env python3
"""Grades a student's stage: one command, a printed report and a JSON one.

    tests/course/grade.py --stage 99_yours [--build build] [--reference 04]
                          [--mode cpu|gpu|all] [--backward] [--json build/grade_99_yours.json]

Configures BUILD with -DFLASHSTEP_EXTRA_STAGES=stages/<stage> when the stage is
not registered there yet, builds flashstep_grade (and test_gpu), and runs it:
the CPU mirror (where the stage has one) and, on a GPU, the kernel on the
shared ragged shapes, causal and not, pass/fail with the worst error and what
contract was broken; the model's HBM traffic and FLOPs and whether the
mirror's counts match it; on a GPU, the time beside the reference stage.
With --backward the same for the stage's backward pass (assignment 6):
dQ, dK, dV of its backward mirror and kernel against the fp64 gradients.
Exit status: flashstep_grade's (0 pass, 1 fail, 77 nothing graded).
"""
import argparse
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stage", required=True, help="the stage folder name, e.g. 99_yours")
    ap.add_argument("--dir", help="the stage folder (default stages/<stage>)")
    ap.add_argument("--build", default="build")
    ap.add_argument("--reference", default="", help="stage to time against, e.g. 04")
    ap.add_argument("--mode", default="all", choices=["cpu", "gpu", "all"])
    ap.add_argument("--backward", action="store_true",
                    help="grade the stage's backward pass (mirror and kernel) instead")
    ap.add_argument("--json", help="JSON report path (default BUILD/grade_<stage>.json)")
    a = ap.parse_args()
    build = pathlib.Path(a.build)
    folder = pathlib.Path(a.dir) if a.dir else ROOT / "stages" / a.stage
    cache = build / "CMakeCache.txt"
    extra = ""
    if cache.exists():
        m = re.search(r"^FLASHSTEP_EXTRA_STAGES:\w+=(.*)$", cache.read_text(), re.M)
        extra = m.group(1) if m else ""
    if a.stage not in [pathlib.Path(e).name for e in extra.split(";") if e]:
        if not (folder / "CMakeLists.txt").exists():
            sys.exit(f"grade.py: no stage folder {folder} (make one: tests/course/starter.py 04 {folder})")
        extras = ";".join([e for e in extra.split(";") if e] + [str(folder.resolve())])
        cmd = ["cmake", "-S", str(ROOT), "-B", str(build), f"-DFLASHSTEP_EXTRA_STAGES={extras}"]
        if not cache.exists():
            cmd += ["-G", "Ninja"]
        print("+", " ".join(cmd), flush=True)
        if subprocess.run(cmd).returncode:
            return 2
    targets = ["flashstep_grade", "test_gpu", "flashstep"]
    print("+ cmake --build", build, "--target", *targets, flush=True)
    if subprocess.run(["cmake", "--build", str(build), "--target", *targets]).returncode:
        sys.exit("grade.py: the build failed (compiler errors above): fix them first")
    report = a.json or str(build / f"grade_{a.stage}.json")
    cmd = [str(build / "tests" / "flashstep_grade"), f"--stage={a.stage}", f"--mode={a.mode}",
           f"--json={report}"]
    if a.reference:
        cmd.append(f"--reference={a.reference}")
    if a.backward:
        cmd.append("--backward")
    return subprocess.run(cmd).returncode


if __name__ == "__main__":
    sys.exit(main())
