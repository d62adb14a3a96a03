#!/usr/bin/env python3
"""Starter code for the PyTorch + Triton assignment: the course package with its cores cut out.

    tests/course/py_starter.py OUTDIR [--solution] [--force]

OUTDIR's folder name (e.g. notebooks/my_flash) becomes the package's name:
a copy of notebooks/flashstep_course (its modules, not its tests) in which every
region between `# BEGIN ASSIGNMENT: <hint>` and `# END ASSIGNMENT` is replaced
by one line that fails with the hint until you write the code:

- in a Triton kernel (a function under @triton.jit):
      tl.static_assert(False, "TODO(student): <hint>")
  which stops the compile (or the interpreter) with the hint;
- anywhere else:
      raise NotImplementedError("TODO(student): <hint>")

The copy imports, and fails the tests and the grader until the cores are
written. A README.md in it lists what to fill in and how to grade it.

--solution pastes the reference's cores back in after cutting them (what CI
checks: the project's own code, through the cut and paste, passes the grader).

    tests/course/py_grade.py --package notebooks/my_flash     # report + JSON
"""
import argparse
import pathlib
import re
import shutil
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCE = ROOT / "notebooks" / "flashstep_course"
BEGIN = re.compile(r"^([ \t]*)# BEGIN ASSIGNMENT: (.*)\n", re.M)
END = re.compile(r"^[ \t]*# END ASSIGNMENT\n", re.M)
TODO = re.compile(r"^[ \t]*.*TODO\(student\): .*\n", re.M)


def regions(text):
    """(start, end, indent, hint, core) of each assignment region, in order."""
    out, pos = [], 0
    while True:
        b = BEGIN.search(text, pos)
        if not b:
            return out
        e = END.search(text, b.end())
        if not e:
            raise SystemExit(f"py_starter.py: BEGIN ASSIGNMENT without END ASSIGNMENT near: "
                             f"{b.group(0)!r}")
        out.append((b.start(), e.end(), b.group(1), b.group(2).strip(), text[b.end():e.start()]))
        pos = e.end()


def in_triton_kernel(text, pos):
    """Whether the region at `pos` lies in a function decorated with @triton.jit."""
    defs = list(re.finditer(r"^((?:@[^\n]*\n)*)def \w+", text[:pos], re.M))
    return bool(defs) and "@triton.jit" in defs[-1].group(1)


def cut(text):
    for start, end, indent, hint, _ in reversed(regions(text)):
        message = repr(f"TODO(student): {hint}")
        line = (f"tl.static_assert(False, {message})" if in_triton_kernel(text, start)
                else f"raise NotImplementedError({message})")
        text = text[:start] + f"{indent}{line}\n" + text[end:]
    return text


def paste(student, reference):
    """Puts the reference's cores back where the TODO lines are."""
    cores = [core for *_, core in regions(reference)]
    todos = list(TODO.finditer(student))
    if len(todos) != len(cores):
        raise SystemExit(f"py_starter.py: {len(todos)} TODOs but {len(cores)} reference cores")
    for m, core in reversed(list(zip(todos, cores))):
        student = student[:m.start()] + core + student[m.end():]
    return student


README = """# {name}: your FlashAttention-2 in PyTorch and Triton

Made by `tests/course/py_starter.py {out}` from `notebooks/flashstep_course`
(the reference solution); the assignment is
[docs/assignments/07_pytorch_triton.md](../../docs/assignments/07_pytorch_triton.md).

## What to fill in

Each line below is a `raise NotImplementedError("TODO(student): ...")` (plain
Python) or a `tl.static_assert(False, "TODO(student): ...")` (inside a Triton
kernel) that you replace with the code it describes:

{todos}

## Test and grade

```sh
# on a machine without a GPU, the Triton kernels run under Triton's interpreter
tests/course/py_grade.py --package {out}                  # every case: report + {out}/grade.json
tests/course/py_grade.py --package {out} --impl pytorch   # only the PyTorch part
tests/course/py_grade.py --package {out} --quick          # the grid's small shapes only
```
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="new package folder, e.g. notebooks/my_flash")
    ap.add_argument("--solution", action="store_true", help="paste the reference cores back in")
    ap.add_argument("--force", action="store_true", help="replace OUTDIR if it exists")
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    name = out.resolve().name
    if not name.isidentifier() or name == SOURCE.name:
        sys.exit(f"py_starter.py: '{name}' cannot name a Python package: use letters, digits "
                 "and _ (not starting with a digit), e.g. my_flash")
    if out.resolve() == SOURCE.resolve():
        sys.exit("py_starter.py: OUTDIR is the reference package itself")
    if out.exists():
        if not a.force:
            sys.exit(f"py_starter.py: {out} exists (use --force to replace it)")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    todos, n_regions = [], 0
    for p in sorted(SOURCE.glob("*.py")):
        original = p.read_text()
        text = cut(original)
        n_regions += len(regions(original))
        for m in re.finditer(r"TODO\(student\): (.*?)['\"]\)$", text, re.M):
            todos.append(f"- `{p.name}`: {m.group(1)}")
        if a.solution:
            text = paste(text, original)
        (out / p.name).write_text(text)
    if n_regions == 0:
        sys.exit(f"py_starter.py: {SOURCE} has no # BEGIN ASSIGNMENT regions")
    shown = a.out if not out.is_absolute() else str(out)
    (out / "README.md").write_text(README.format(
        name=name, out=shown,
        todos="\n".join(todos) if not a.solution else "(none: --solution pasted the cores back)"))
    print(f"wrote {out}/ from notebooks/flashstep_course ({n_regions} region(s) "
          f"{'kept' if a.solution else 'to fill in'}); grade it with "
          f"tests/course/py_grade.py --package {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
