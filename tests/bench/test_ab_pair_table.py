#!/usr/bin/env python3
"""ab_pair_table.py without a GPU: synthetic rounds of both sides (or of a base
and its variants) in, the table out; and ab_pair.sh's and ab_trees.sh's
refusals of bad arguments, which come before they build anything, and the CLI
each round runs (ab_common.sh's ab_run and ab_cli: checked in the first round
only).
Prints a line per check and exits 1 if any failed."""
import csv
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
FIELDS = ["stage", "pass", "dtype", "check", "median ms", "B", "H", "Nq", "Nk", "d", "causal"]


def row(ms, n=4096, check="ok", passname="bwd", stage="07_tensor_core"):
    return {"stage": stage, "pass": passname, "dtype": "bf16", "check": check,
            "median ms": str(ms), "B": str(16384 // n), "H": "16", "Nq": str(n), "Nk": str(n),
            "d": "128", "causal": "0"}


def table(rounds, sides=()):
    """ab_pair_table.py's exit status and lines on {file name: rows}; sides: the
    reference and the other sides, as ab_trees.sh passes them (none: new ÷ old)."""
    with tempfile.TemporaryDirectory() as folder:
        for name, rows in rounds.items():
            with open(os.path.join(folder, name), "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=FIELDS)
                w.writeheader()
                w.writerows(rows)
        p = subprocess.run([sys.executable, os.path.join(HERE, "ab_pair_table.py"), folder,
                            *sides], capture_output=True, text=True)
    return p.returncode, p.stdout.splitlines()


def script(name, *args, env=None):
    """An A/B script's exit status and stderr lines (env: variables added)."""
    p = subprocess.run(["bash", os.path.join(HERE, name), *args], capture_output=True, text=True,
                       env={**os.environ, **(env or {})})
    return p.returncode, p.stderr.splitlines()


# A stand-in timing script: runs the CLI it is given with its other flags
# and writes what the CLI printed to --out.
FAKE_SCRIPT = """import subprocess, sys
a = sys.argv[1:]
named = {a[i]: a[i + 1] for i in range(len(a) - 1) if a[i] in ("--flashstep", "--out")}
rest = [x for i, x in enumerate(a) if x not in named and x not in named.values()]
run = subprocess.run([named["--flashstep"], *rest], capture_output=True, text=True)
open(named["--out"], "w").write(run.stdout)
"""


def round_cli(round_number):
    """The flags a round's run (ab_common.sh's ab_run, through ab_cli) hands
    the CLI, as a stand-in CLI prints them."""
    with tempfile.TemporaryDirectory() as folder:
        fake = os.path.join(folder, "flashstep")
        with open(fake, "w") as f:
            f.write('#!/bin/sh\necho "$@"\n')
        os.chmod(fake, 0o755)
        with open(os.path.join(folder, "script.py"), "w") as f:
            f.write(FAKE_SCRIPT)
        shell = (f'source {os.path.join(HERE, "ab_common.sh")}; logs={folder}; who=test; '
                 f'rounds=2; script={folder}/script.py; extra=(--no-peers); '
                 f'ab_run base {round_number} {fake} --N 4096 >/dev/null; '
                 f'cat {folder}/base_{round_number}.csv')
        p = subprocess.run(["bash", "-c", shell], capture_output=True, text=True)
    return p.stdout.split()


def main():
    rc, lines = table({"new_1.csv": [row(2.2), row(9.0, n=16384), row(1.0, passname="fwd+bwd"),
                                     row(0.5, n=1024)],
                       "new_2.csv": [row(2.0), row(9.5, n=16384)],
                       "old_1.csv": [row(2.5), row(10.0, n=16384), row(0.6, n=1024)],
                       "old_2.csv": [row(2.6), row(10.4, n=16384)]})
    bad_rc, bad = table({"new_1.csv": [row(2.0, check="FAIL")], "old_1.csv": [row(2.5)]})
    empty_rc, empty = table({"new_1.csv": [row(2.0)]})
    trees_rc, trees = table({"base_1.csv": [row(2.5)], "b1_1.csv": [row(2.0)],
                             "b2_1.csv": [row(3.0)], "b2_2.csv": [row(2.75)]}, ("base", "b1", "b2"))
    prefix_rc, prefix = table({"base_1.csv": [row(2.5)], "b1_1.csv": [row(2.0)],
                               "b1_frag_1.csv": [row(1.5)]}, ("base", "b1", "b1_frag"))
    checks = [
        ("the best median of each side over the rounds, and new ÷ old",
         "07_tensor_core bf16 4 16 4096 4096 128 0 | 2.0 | 2.5 | ×0.800 | ok" in lines
         and "07_tensor_core bf16 1 16 16384 16384 128 0 | 9.0 | 10.0 | ×0.900 | ok" in lines),
        ("only the backward pass of backward16's rows",
         len(lines) == 4 and not any("| 1.0 |" in x for x in lines)),
        ("problems sorted as numbers (B = 4 before B = 16)",
         [x.split(" ")[2] for x in lines[1:]] == ["1", "4", "16"]),
        ("exit 0 when every point passed", rc == 0),
        ("a failed check is shown and exits 1", bad_rc == 1 and any("FAIL" in x for x in bad)),
        ("a side without rows exits 1 with one line",
         empty_rc == 1 and empty == [empty[0]] and "no timed rows for old" in empty[0]),
        ("several variants against a base: each one's best and ÷ base",
         trees_rc == 0 and trees[0].endswith("| b1 ms | b2 ms | base ms | b1 ÷ base | b2 ÷ base | checks")
         and "07_tensor_core bf16 4 16 4096 4096 128 0 | 2.0 | 2.75 | 2.5 | ×0.800 | ×1.100 | ok"
         in trees),
        ("a name that starts another's takes only its own rounds (b1 is not b1_frag)",
         prefix_rc == 0
         and "07_tensor_core bf16 4 16 4096 4096 128 0 | 2.0 | 1.5 | 2.5 | ×0.800 | ×0.600 | ok"
         in prefix),
        ("the first round's CLI checks every point",
         round_cli(1) == ["--no-peers", "--N", "4096"]),
        ("later rounds' CLI only times (--no-check)",
         round_cli(2) == ["--no-peers", "--N", "4096", "--no-check"]),
    ]
    with tempfile.NamedTemporaryFile(suffix=".patch") as patch:
        refusals = [("ab_pair.sh", "no patch file",
                     script("ab_pair.sh", "/nonexistent.patch", "08_hopper", "forward")),
                    ("ab_pair.sh", "no such stage",
                     script("ab_pair.sh", patch.name, "99_nothing", "forward")),
                    ("ab_pair.sh", "an unknown kind",
                     script("ab_pair.sh", patch.name, "08_hopper", "sideways")),
                    ("ab_trees.sh", "no such stage",
                     script("ab_trees.sh", "99_nothing", "forward", f"b1={patch.name}")),
                    ("ab_trees.sh", "an unknown kind",
                     script("ab_trees.sh", "08_hopper", "sideways", f"b1={patch.name}")),
                    ("ab_trees.sh", "no variant", script("ab_trees.sh", "08_hopper", "forward")),
                    ("ab_trees.sh", "a variant without a patch",
                     script("ab_trees.sh", "08_hopper", "forward", "b1")),
                    ("ab_trees.sh", "a variant named base",
                     script("ab_trees.sh", "08_hopper", "forward", f"base={patch.name}")),
                    ("ab_trees.sh", "a name with a slash",
                     script("ab_trees.sh", "08_hopper", "forward", f"a/b={patch.name}")),
                    ("ab_trees.sh", "no patch file",
                     script("ab_trees.sh", "08_hopper", "forward", "b1=/nonexistent.patch")),
                    ("ab_trees.sh", "a GPU_TESTS other than 0 or 1",
                     script("ab_trees.sh", "08_hopper", "forward", f"b1={patch.name}",
                            env={"GPU_TESTS": "yes"}))]
    for name, what, (code, err) in refusals:
        prefix = name.split(".")[0] + ": "
        checks.append((f"{name}: {what} is refused with one line and exit 2",
                       code == 2 and len(err) == 1 and err[0].startswith(prefix)))
    for name, ok in checks:
        print(("ok   " if ok else "FAIL ") + name)
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
