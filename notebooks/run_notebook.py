#!/usr/bin/env python3
"""Executes one notebook headlessly for CTest; the committed file is never rewritten.

    run_notebook.py NOTEBOOK OUTPUT_DIR [--timeout S]

Runs `jupyter nbconvert --to notebook --execute` with the notebook's own folder as
the working directory (so ../docs/results and ../build resolve) and writes the
executed copy to OUTPUT_DIR. A cell that raises fails the run (nbconvert exits
non-zero). Exits 77 (CTest's SKIP_RETURN_CODE) when jupyter-nbconvert is not
installed; a missing kernel or library is a failure, not a skip.

    check-stripped NOTEBOOK...   fails if any committed notebook holds outputs
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

SKIP = 77
PACKAGES = "jupyter-nbconvert python3-ipykernel python3-matplotlib python3-numpy"


def check_stripped(paths):
    bad = []
    for p in paths:
        nb = json.loads(Path(p).read_text())
        for i, cell in enumerate(nb["cells"]):
            if cell["cell_type"] == "code" and (cell.get("outputs") or cell.get("execution_count")):
                bad.append(f"{p}: cell {i} has outputs or an execution count")
    for b in bad:
        print(b)
    if bad:
        print("strip them: jupyter nbconvert --clear-output --inplace notebooks/*.ipynb")
        return 1
    print(f"{len(paths)} notebooks, no outputs")
    return 0


def main(argv):
    if argv[:1] == ["check-stripped"]:
        return check_stripped(argv[1:])
    if len(argv) < 2:
        print(__doc__)
        return 2
    notebook, out_dir = Path(argv[0]).resolve(), Path(argv[1]).resolve()
    timeout = argv[argv.index("--timeout") + 1] if "--timeout" in argv else "120"
    jupyter = shutil.which("jupyter")
    if jupyter is None or subprocess.run([jupyter, "nbconvert", "--version"],
                                         capture_output=True).returncode != 0:
        print(f"SKIPPED: jupyter nbconvert is not installed (Debian: apt-get install {PACKAGES})")
        return SKIP
    out_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYDEVD_DISABLE_FILE_VALIDATION="1")
    env.pop("MPLBACKEND", None)  # the kernel's inline backend puts the figures in the executed copy
    cmd = [jupyter, "nbconvert", "--to", "notebook", "--execute",
           f"--ExecutePreprocessor.timeout={timeout}",
           "--output-dir", str(out_dir), "--output", notebook.name, str(notebook)]
    print(" ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=notebook.parent, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
