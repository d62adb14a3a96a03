#!/usr/bin/env python3
"""ablation.py --backward and tables.py's ablation16 block without a GPU.

A stand-in `ncu` on PATH prints ncu-style CSV for the kernels its -k filter
selects (stage 07's atomic or deterministic backward by the program's --stage,
or FlashAttention-2's `flash_bwd` kernels) and refuses one counter, as an
older ncu would; a stand-in Python answers the torch version. ablation.py
writes ablation16.csv from that; tables.py renders it. Prints a line per check
and exits 1 if any failed. The numbers are made up: only the plumbing and the
rendering are under test."""
import csv
import os
import stat
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from ablation import COLUMNS, STEPS  # noqa: E402
from tables import ablation16_body  # noqa: E402

# ncu's "Kernel Name" and gpu__time_duration.sum (ns) of each launch, in launch order.
ATOMIC = [("void flashstep::tensor_core::bwd::prepare_kernel<__nv_bfloat16>", 100_000),
          ("void flashstep::tensor_core::bwd::dkdv_kernel<__nv_bfloat16, 64>", 3_700_000),
          ("void flashstep::tensor_core::bwd::convert_dq_kernel<__nv_bfloat16>", 200_000)]
DETERMINISTIC = [ATOMIC[0], ("void flashstep::tensor_core::bwd::dkdv_kernel<__nv_bfloat16, 64>",
                             1_900_000),
                 ("void flashstep::tensor_core::bwd::dq_kernel<__nv_bfloat16, 64>", 1_500_000)]
FA2 = [("void flash::flash_bwd_dot_do_o_kernel<true, Flash_bwd_kernel_traits<64>>", 100_000),
       ("void flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64>>",
        2_000_000),
       ("void flash::flash_bwd_convert_dq_kernel<Flash_bwd_kernel_traits<64>>", 100_000)]
UNKNOWN = "l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum"  # the counter the stand-in refuses
RED_SECTORS = 1_250_000  # lts__t_sectors_op_red.sum of every launch

FAKE_NCU = f'''#!{sys.executable}
import csv, sys
args = sys.argv[1:]
kernel, metrics = args[args.index("-k") + 1], args[args.index("--metrics") + 1].split(",")
launches = int(args[args.index("-c") + 1])
if {UNKNOWN!r} in metrics:
    sys.exit(print("==ERROR== Failed to find metric {UNKNOWN}", file=sys.stderr) or 1)
program = " ".join(args[args.index("--metrics") + 2:])
if "flash_bwd" in kernel:
    runs = {FA2!r}
elif "deterministic" in program:
    runs = {DETERMINISTIC!r}
else:
    runs = {ATOMIC!r}
print("==PROF== Connected to process")
w = csv.writer(sys.stdout, quoting=csv.QUOTE_ALL, lineterminator="\\n")
w.writerow(["ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value"])
for i, (name, ns) in enumerate(runs[:launches]):
    for m in metrics:
        value = {{"gpu__time_duration.sum": f"{{ns:,}}",
                 "lts__t_sectors_op_red.sum": f"{{{RED_SECTORS}:,}}"}}.get(m, "7")
        w.writerow([i, name + "(flashstep::BackwardParams<__nv_bfloat16>)", m, "", value])
'''
FAKE_PYTHON = "#!/bin/sh\necho 2.99.0\n"


def stand_in(folder, name, text):
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


def read_csv(path):
    """(header, rows) of the CSV at `path`; ([], []) when it was not written."""
    if not os.path.exists(path):
        return [], []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        return reader.fieldnames, rows


def main():
    with tempfile.TemporaryDirectory() as tmp:
        stand_in(tmp, "ncu", FAKE_NCU)
        python = stand_in(tmp, "python-with-torch", FAKE_PYTHON)
        out = os.path.join(tmp, "ablation16.csv")
        env = dict(os.environ, PATH=tmp + os.pathsep + os.environ["PATH"])
        proc = subprocess.run([sys.executable, os.path.join(HERE, "ablation.py"), "--backward",
                               "--flashstep", "flashstep", "--out", out, "--d", "64",
                               "--python", python, "--commit", "0123456789abcdef"],
                              env=env, capture_output=True, text=True)
        _, rows = read_csv(out)
        # The forward ladder's run, as before: a row per step, the first launch only
        # (the stand-in answers its filter with the atomic backward's launches).
        ladder_out = os.path.join(tmp, "ablation.csv")
        ladder = subprocess.run([sys.executable, os.path.join(HERE, "ablation.py"),
                                 "--flashstep", "flashstep", "--out", ladder_out, "--d", "64",
                                 "--no-peer"], env=env, capture_output=True, text=True)
        ladder_columns, ladder_rows = read_csv(ladder_out)
    by_stage = {s: [r["kernel"] for r in rows if r["stage"] == s]
                for s in ("07_tensor_core", "07_tensor_core_deterministic", "sdpa_flash_bf16")}
    body = ablation16_body(rows)
    atomic = "| 07_tensor_core (dQ by atomics) |"
    checks = [
        ("ablation.py --backward exits 0", proc.returncode == 0),
        ("a row per kernel of each backward, in launch order, named as ncu names it",
         by_stage == {"07_tensor_core": ["flashstep::tensor_core::bwd::prepare_kernel",
                                         "flashstep::tensor_core::bwd::dkdv_kernel",
                                         "flashstep::tensor_core::bwd::convert_dq_kernel"],
                      "07_tensor_core_deterministic": [
                          "flashstep::tensor_core::bwd::prepare_kernel",
                          "flashstep::tensor_core::bwd::dkdv_kernel",
                          "flashstep::tensor_core::bwd::dq_kernel"],
                      "sdpa_flash_bf16": ["flash::flash_bwd_dot_do_o_kernel",
                                          "flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel",
                                          "flash::flash_bwd_convert_dq_kernel"]}),
        ("the refused counter is dropped, named, and left empty",
         all(r["note"] == "ncu does not know: local_st_sectors" and r["local_st_sectors"] == ""
             and r["duration_ns"] for r in rows)),
        ("the forward ladder keeps its columns and a row per step",
         ladder.returncode == 0 and ladder_columns == COLUMNS
         and [r["stage"] for r in ladder_rows] == list(STEPS)
         and {r["kernel"] for r in ladder_rows} == {"flashstep::tensor_core::bwd::prepare_kernel"}),
        ("the torch version on the peer's rows only",
         {r["torch"] for r in rows if r["stage"] == "sdpa_flash_bf16"} == {"2.99.0"}
         and {r["torch"] for r in rows if r["stage"] != "sdpa_flash_bf16"} == {""}),
        ("each kernel's time and share of its backward's (dkdv 3.7 of 4 ms)",
         f"{atomic} dkdv_kernel | 3.7 | 92.5% | 1.25 M |" in body),
        ("a total row per backward: time and summed reductions",
         f"{atomic} **total** | **4** | 100% | 3.75 M |" in body),
        ("each backward's total beside FlashAttention-2's",
         "- d = 64, 07_tensor_core (dQ by atomics): 4 ms in all; FlashAttention-2's 2.2 ms: "
         "×0.55 its speed" in body
         and "- d = 64, 07_tensor_core_deterministic: 3.5 ms in all; FlashAttention-2's "
         "2.2 ms: ×0.63 its speed" in body),
        ("the dropped counter is said, and has no column",
         "ncu does not know: local_st_sectors" in body and "local st sectors" not in body),
        ("the peer's torch version in the provenance", "PyTorch 2.99.0" in body),
        ("a backward ncu could not read: one row saying why",
         "counters unavailable: no ncu here |" in ablation16_body(
             [{**rows[0], "kernel": "", "duration_ns": "", "note": "no ncu here"}])),
        ("no CSV: says how to record it",
         "not recorded yet" in ablation16_body([]) and "build ablation16" in ablation16_body([])),
    ]
    failed = 0
    for what, ok in checks:
        print(("ok   " if ok else "FAIL ") + what)
        failed += not ok
    if failed:
        print(proc.stderr)
        print(body)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
