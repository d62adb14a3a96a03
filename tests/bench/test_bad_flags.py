#!/usr/bin/env python3
"""The benchmark scripts refuse a bad flag before running anything: exit 2 and
one line on stderr naming the flag, no traceback. No GPU needed: every case is
refused while the arguments are read. Prints a line per check and exits 1 if
any failed."""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run(script, *args):
    p = subprocess.run([sys.executable, os.path.join(HERE, script), *args],
                       capture_output=True, text=True, timeout=60)
    return p.returncode, p.stderr.splitlines()


def main():
    with tempfile.TemporaryDirectory(prefix="bad_flags_") as d:
        exe = os.path.join(d, "flashstep")  # an executable that is never run
        with open(exe, "w") as f:
            f.write("#!/bin/sh\nexit 1\n")
        os.chmod(exe, 0o755)
        out = os.path.join(d, "out.csv")
        base = ["--flashstep", exe, "--out", out]
        cases = [
            (script, extra, flag_text)
            for script, more in (("sweep.py", []), ("backward16.py", []),
                                 ("backward.py", ["--memory-out", os.path.join(d, "m.csv")]),
                                 ("gqa_prefill.py", []))
            for extra, flag_text in ((more + ["--N", "3000"], "--N 3000"),
                                     (more + ["--d", "0"], "--d 0"),
                                     (more + ["--d", "512"], "--d 512"))
        ] + [
            ("decode.py", ["--Nk", "0"], "--Nk 0"), ("decode.py", ["--B", "-1"], "--B -1"),
            ("decode.py", ["--Nq", "0"], "--Nq 0"), ("decode.py", ["--H-kv", "3"], "--H-kv 3"),
            ("decode.py", ["--max-kv-gb", "nan"], "--max-kv-gb nan"),
        ]
        checks = []
        for script, extra, flag_text in cases:
            rc, err = run(script, *base, *extra)
            checks.append((f"{script} {' '.join(extra)}: exit 2, one line naming {flag_text}",
                           rc == 2 and len(err) == 1 and flag_text in err[0]))
        for script, more in (("sweep.py", []), ("backward16.py", []), ("decode.py", []),
                             ("gqa_prefill.py", []),
                             ("backward.py", ["--memory-out", os.path.join(d, "m.csv")])):
            missing = os.path.join(d, "no-such-flashstep")
            rc, err = run(script, "--flashstep", missing, "--out", out, *more)
            checks.append((f"{script}: a --flashstep that is not there: exit 2, one line",
                           rc == 2 and len(err) == 1 and missing in err[0]))
        checks.append(("nothing was written", not os.path.exists(out)))
    for name, ok in checks:
        print(("ok   " if ok else "FAIL ") + name)
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
