#!/usr/bin/env python3
"""CI for the course kit (CTest label `course`, CPU only).

    ci_course.py paste    --source DIR --work DIR [--generator G] [--cuda-compiler NVCC]
    ci_course.py starters --source DIR --work DIR [...]

paste: starter.py 04 --solution (the project's stage, renamed, core pasted
back) must pass its student CPU test; then each planted bug (a missing rescale,
an off-by-one in the causal mask, an unwritten tail) must make the grader fail
with a readable report. The same for the backward assignment: starter.py 05
--part backward --solution must pass flashstep_grade --backward on the CPU
(its backward mirror), and each planted backward bug (the mask, the scale of
dS, D left out) must fail it naming the gradient. One scratch build, only the
targets needed.
starters: every assignment's starter (02 .. 06, cores cut; 05's backward too) builds.
"""
import argparse
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
STUDENT = "99_ci"
REFERENCE = "04_fa2_q_outer"
MIRROR = "fa2_q_outer_mirror.cpp"
# (name, file, reference text, planted text, what the report must say)
BUGS = [
    ("missing rescale", MIRROR,
     "for (std::int64_t k = 0; k < d; ++k) O_r[k] = chip.mul(O_r[k], alpha);",
     "// (rescale of O~_i forgotten)",
     "O differs from the fp64 reference"),
    ("off-by-one causal mask", MIRROR,
     "S_ij[static_cast<size_t>(r * C + c)] = !test || chip.mask_test(c < visible) ? s : -kInf;",
     "S_ij[static_cast<size_t>(r * C + c)] = !test || chip.mask_test(c <= visible) ? s : -kInf;",
     "only causal cases fail"),
    ("unwritten tail", MIRROR,
     "for (std::int64_t i = 0; i < q_blocks(p); ++i) attend_q_block(",
     "for (std::int64_t i = 0; i < p.Nq / kBr; ++i) attend_q_block(",
     "were never written"),
]
STARTERS = ["02", "03", "04", "05", "06"]
# The backward assignment: stage 05's backward, cut by --part backward.
STUDENT_BW = "99_ci_bw"
REFERENCE_BW = "05_sequence_parallel"
MIRROR_BW = "sequence_parallel_backward_mirror.cpp"
BUGS_BW = [
    ("backward: off-by-one causal mask", MIRROR_BW,
     "const float P_rc = whole || chip.mask_test(c < visible) ? e : 0.0f;",
     "const float P_rc = whole || chip.mask_test(c <= visible) ? e : 0.0f;",
     "only causal cases fail"),
    ("backward: dS scaled in log2 units", MIRROR_BW,
     "const float dS_rc = chip.mul(chip.mul(P_rc, chip.sub(dP, D_r)), scale);",
     "const float dS_rc = chip.mul(chip.mul(P_rc, chip.sub(dP, D_r)), scale_log2);",
     "P is right (dV is) but dS is not"),
    ("backward: dV from dS", MIRROR_BW,
     "chip.axpy(P, r, c, dOi, r, d, &dV_j[static_cast<size_t>(c * d)]);",
     "chip.axpy(dS, r, c, dOi, r, d, &dV_j[static_cast<size_t>(c * d)]);",
     "dV differs from the fp64 gradient"),
]


def run(cmd, **kw):
    print("+", " ".join(str(c) for c in cmd), flush=True)
    return subprocess.run([str(c) for c in cmd], text=True, **kw)


def configure(a, build, extra, only):
    cmd = ["cmake", "-S", a.source, "-B", build, "-G", a.generator, "-DCMAKE_BUILD_TYPE=Release",
           "-DCMAKE_CUDA_ARCHITECTURES=90", f"-DFLASHSTEP_EXTRA_STAGES={';'.join(map(str, extra))}",
           f"-DFLASHSTEP_STAGES_ONLY={only}"]
    if a.cuda_compiler:
        cmd.append(f"-DCMAKE_CUDA_COMPILER={a.cuda_compiler}")
    if run(cmd, stdout=subprocess.DEVNULL).returncode != 0:
        sys.exit("configure failed")


def build(build_dir, *targets):
    r = run(["cmake", "--build", build_dir, "--target", *targets])
    if r.returncode != 0:
        sys.exit(f"build of {' '.join(targets)} failed")


def grade(build_dir, work, tag, stage=STUDENT, backward=False):
    report = work / f"report_{tag}.json"
    r = run([build_dir / "tests" / "flashstep_grade", f"--stage={stage}", "--mode=cpu",
             f"--json={report}"] + (["--backward"] if backward else []), capture_output=True)
    print(r.stdout[-6000:], r.stderr, sep="")
    return r.returncode, r.stdout, report


def paste(a, work):
    src = work / "src"
    student = src / STUDENT
    if run([sys.executable, HERE / "starter.py", REFERENCE, student, "--solution", "--force"]).returncode:
        sys.exit("starter.py failed")
    student_bw = src / STUDENT_BW
    if run([sys.executable, HERE / "starter.py", REFERENCE_BW, student_bw, "--part", "backward",
            "--solution", "--force"]).returncode:
        sys.exit("starter.py --part backward failed")
    b = work / "build-paste"
    configure(a, b, [student, student_bw], REFERENCE)
    build(b, "flashstep_grade")
    failures = []
    rc, out, report = grade(b, work, "pasted")
    if rc != 0 or "verdict: PASS" not in out or not report.exists():
        failures.append(f"the pasted reference core should pass (exit {rc})")
    # The student's own CTest test runs the same check under the label student.
    r = run(["ctest", "--test-dir", b, "-L", "student", "-R", f"^cpu\\.{STUDENT}$", "--output-on-failure"],
            capture_output=True)
    if r.returncode != 0 or f"cpu.{STUDENT}" not in r.stdout:
        failures.append("ctest -L student did not run and pass cpu." + STUDENT)
    mirror = student / MIRROR
    good = mirror.read_text()
    try:
        for name, _, old, new, expect in BUGS:
            if good.count(old) != 1:
                failures.append(f"bug '{name}': the reference text is gone from {MIRROR}; update BUGS")
                continue
            mirror.write_text(good.replace(old, new))
            build(b, "flashstep_grade")
            rc, out, _ = grade(b, work, name.replace(" ", "_"))
            if rc != 1 or "verdict: FAIL" not in out:
                failures.append(f"bug '{name}': the grader did not fail (exit {rc})")
            elif expect not in out:
                failures.append(f"bug '{name}': the report does not say '{expect}'")
            else:
                print(f"course: planted bug '{name}' caught: report says '{expect}'")
    finally:
        mirror.write_text(good)
    failures += paste_backward(b, work, student_bw)
    return failures


def paste_backward(b, work, student_bw):
    """The backward assignment: the pasted core passes, each planted bug is named."""
    failures = []
    rc, out, report = grade(b, work, "pasted_backward", STUDENT_BW, backward=True)
    if rc != 0 or "verdict: PASS" not in out or not report.exists():
        failures.append(f"the pasted backward core should pass flashstep_grade --backward (exit {rc})")
    mirror = student_bw / MIRROR_BW
    good = mirror.read_text()
    try:
        for name, _, old, new, expect in BUGS_BW:
            if good.count(old) != 1:
                failures.append(f"bug '{name}': the reference text is gone from {MIRROR_BW}; update BUGS_BW")
                continue
            mirror.write_text(good.replace(old, new))
            build(b, "flashstep_grade")
            rc, out, _ = grade(b, work, name.replace(" ", "_").replace(":", ""), STUDENT_BW,
                               backward=True)
            if rc != 1 or "verdict: FAIL" not in out:
                failures.append(f"bug '{name}': the grader did not fail (exit {rc})")
            elif expect not in out:
                failures.append(f"bug '{name}': the report does not say '{expect}'")
            else:
                print(f"course: planted bug '{name}' caught: report says '{expect}'")
    finally:
        mirror.write_text(good)
        build(b, "flashstep_grade")
    return failures


def starters(a, work):
    src = work / "src-starters"
    folders = []
    for ref in STARTERS:
        out = src / f"98_starter_{ref}"
        if run([sys.executable, HERE / "starter.py", ref, out, "--force"]).returncode:
            sys.exit(f"starter.py {ref} failed")
        folders.append(out)
    out = src / "98_starter_05_backward"
    if run([sys.executable, HERE / "starter.py", "05", out, "--part", "backward", "--force"]).returncode:
        sys.exit("starter.py 05 --part backward failed")
    folders.append(out)
    b = work / "build-starters"
    # Only the starters' own libraries: they must compile; they are not linked
    # into a registry here (their tests would fail: the cores are missing).
    configure(a, b, folders, REFERENCE)
    build(b, *[f"stage_{f.name}" for f in folders])
    return []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("check", choices=["paste", "starters"])
    ap.add_argument("--source", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--generator", default="Ninja")
    ap.add_argument("--cuda-compiler", default="")
    a = ap.parse_args()
    work = pathlib.Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    failures = paste(a, work) if a.check == "paste" else starters(a, work)
    print(f"course.{a.check}: {time.time() - t0:.0f} s")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
