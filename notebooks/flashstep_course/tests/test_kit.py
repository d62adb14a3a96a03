"""The course kit for this track (CPU): tests/course/py_starter.py's cut compiles
into a package that fails with its hints, the cores pasted back pass
tests/course/py_grade.py, and each planted bug fails it with a report that
says what is wrong."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
STARTER = ROOT / "tests" / "course" / "py_starter.py"
GRADER = ROOT / "tests" / "course" / "py_grade.py"
# (name, file, reference text, planted text, implementation, what the report must say)
BUGS = [
    ("missing rescale of O", "pytorch_flash.py",
     "O_i = alpha[..., None] * O_i + P_tilde", "O_i = O_i + P_tilde", "pytorch",
     "O differs from the fp64 reference"),
    ("D not subtracted in dS", "pytorch_flash.py",
     "dS_ij = P_ij * (dP_ij - D[:, q0:q1, None])", "dS_ij = P_ij * dP_ij", "pytorch",
     "likely cause (dQ, dK wrong)"),
    ("no guard for a row that has seen no key", "triton_flash.py",
     'm_safe = tl.where(m_new == float("-inf"), 0.0, m_new)', "m_safe = m_new", "triton",
     "has NaN"),
    ("dK without the softmax scale", "triton_flash.py",
     "_round_to(dk * scale, dK.dtype.element_ty, WIDEN)", "_round_to(dk, dK.dtype.element_ty, WIDEN)",
     "triton", "dK differs from the fp64 reference"),
]


def run(*args, env=None):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


def grade(package, impl):
    r = run(GRADER, "--package", package, "--impl", impl, "--device", "cpu", "--quick",
            "--dtype", "fp32")
    return r.returncode, r.stdout + r.stderr


def test_the_starter_fails_with_its_hints_until_written(tmp_path):
    out = tmp_path / "my_flash"
    r = run(STARTER, out)
    assert r.returncode == 0, r.stderr
    readme = (out / "README.md").read_text()
    assert readme.count("TODO") >= 1 and "triton_flash.py" in readme
    rc, text = grade(out, "pytorch")
    assert rc == 1 and "not written yet" in text and "verdict: FAIL" in text, text
    report = json.loads((out / "grade.json").read_text())
    assert report["pass"] is False and report["stages"][0]["mirror"]["graded"] is True
    assert {"problem", "causal", "pass", "max_abs_error_O", "max_abs_error_L", "problems",
            "count_mismatches"} <= set(report["stages"][0]["mirror"]["cases"][0])


@pytest.mark.triton
def test_the_pasted_cores_pass_and_each_planted_bug_is_reported(tmp_path):
    out = tmp_path / "pasted"
    assert run(STARTER, out, "--solution").returncode == 0
    for impl in ("pytorch", "triton"):
        rc, text = grade(out, impl)
        assert rc == 0 and "verdict: PASS" in text, text
    for name, file, old, new, impl, expect in BUGS:
        path = out / file
        good = path.read_text()
        assert good.count(old) == 1, f"bug '{name}': the reference text is gone from {file}"
        path.write_text(good.replace(old, new))
        try:
            rc, text = grade(out, impl)
        finally:
            path.write_text(good)
        assert rc == 1 and "verdict: FAIL" in text, f"bug '{name}' not caught:\n{text}"
        assert expect in text, f"bug '{name}': the report does not say '{expect}':\n{text}"
