#!/usr/bin/env python3
"""ab_decode_table.py without a GPU: a synthetic new run and record in, the
table out. Prints a line per check and exits 1 if any failed."""
import csv
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
FIELDS = ["stage", "dtype", "check", "median ms", "of copy", "B", "H", "H_kv", "Nq", "Nk", "d",
          "causal"]


def row(stage, ms, nk=32768, check="ok", dtype="bf16"):
    return {"stage": stage, "dtype": dtype, "check": check, "median ms": str(ms), "of copy": "0.5",
            "B": "1", "H": "32", "H_kv": "8", "Nq": "1", "Nk": str(nk), "d": "128", "causal": "0"}


def write(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)


def run(*args):
    p = subprocess.run([sys.executable, os.path.join(HERE, "ab_decode_table.py"), *args],
                       capture_output=True, text=True)
    return p.returncode, p.stdout.splitlines(), p.stderr.splitlines()


def main():
    with tempfile.TemporaryDirectory(prefix="ab_decode_") as d:
        new, rec = os.path.join(d, "new.csv"), os.path.join(d, "rec.csv")
        write(new, [row("09_split_kv", 0.1), row("09_split_kv", 0.3, nk=131072, check="FAIL"),
                    row("sdpa_flash_bf16", 0.05)])
        write(rec, [row("09_split_kv", 0.2), row("sdpa_flash_bf16", 0.08),
                    row("sdpa_cudnn_bf16", 0.07)])
        rc, out, _ = run(new, rec)
        missing = run(os.path.join(d, "none.csv"), rec)
        usage = run(new)
    body = "\n".join(out)
    checks = [
        ("exit 0, a header and one line per stage 09 row", rc == 0 and len(out) == 3),
        ("the new time beside the recorded one, their ratio and the best recorded SDPA",
         len(out) > 1 and out[1].split()[6:11] == ["0.1", "0.2", "0.50", "0.5", "0.07"]),
        ("a point not recorded shows '-', a failed check is named",
         len(out) > 2 and out[2].split()[7] == "-" and out[2].endswith("FAIL")),
        ("SDPA rows of the new run are not listed", "sdpa" not in body),
        ("no new rows: exit 1, one line", missing[0] == 1 and len(missing[2]) == 1),
        ("wrong arguments: exit 2, one line", usage[0] == 2 and len(usage[2]) == 1),
    ]
    for name, ok in checks:
        print(("ok   " if ok else "FAIL ") + name)
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
