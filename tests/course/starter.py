#!/usr/bin/env python3
"""Starter code for an assignment: a reference stage with its core cut out.

    tests/course/starter.py REF OUTDIR [--part forward|backward] [--solution] [--force]

REF is a stage folder or its number (02 .. 06); OUTDIR's folder name (e.g.
stages/99_yours) becomes the stage's name and registry function
stages_<folder>(). The folder is a copy of stages/REF with:

- its names renamed: the registry entry and function, the C++ namespace
  (flashstep::course_<folder>), the "stage NN" in messages;
- every region of the chosen part between `// BEGIN ASSIGNMENT: <hint>` (or
  `// BEGIN ASSIGNMENT(backward): <hint>`) and `// END ASSIGNMENT` in the
  reference's sources replaced by `// TODO(student): <hint>`. The result
  compiles (it may warn about variables the core would use) and fails the
  tests until the core is written. --part picks the assignment: forward (the
  untagged regions, the default) or backward (stage 05's backward pass, its
  kernel and CPU mirror); the other part's regions stay whole;
- a README.md saying what to fill in and how to build, test and grade it.

--solution pastes the reference's core back in after cutting it (what CI
checks: the project's own stage, renamed, passes the student tests).

Then register it with no other edit:
    cmake -S . -B build -DFLASHSTEP_EXTRA_STAGES=stages/99_yours
"""
import argparse
import pathlib
import re
import shutil
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
STAGES = ROOT / "stages"
BEGIN = re.compile(r"^([ \t]*)// BEGIN ASSIGNMENT(?:\((\w+)\))?: (.*)\n", re.M)
PARTS = ("forward", "backward")  # untagged regions belong to the forward
END = re.compile(r"^[ \t]*// END ASSIGNMENT\n", re.M)
SOURCE_SUFFIXES = {".h", ".cuh", ".cu", ".cpp", ".txt"}
FOLDER_NAME = re.compile(r"^[A-Za-z0-9_]+$")


def find_reference(ref: str) -> pathlib.Path:
    if (STAGES / ref / "CMakeLists.txt").exists():
        return STAGES / ref
    prefix = ref.zfill(2) + "_"
    hits = [p for p in sorted(STAGES.iterdir()) if p.name.startswith(prefix) and (p / "CMakeLists.txt").exists()]
    if len(hits) != 1:
        known = ", ".join(p.name for p in sorted(STAGES.glob("0*_*")))
        sys.exit(f"starter.py: no single reference stage '{ref}' (known: {known})")
    return hits[0]


def regions(text: str, part=None):
    """(start, end, indent, hint, core) of each assignment region of `part` (every
    part when None), in order."""
    out, pos = [], 0
    while True:
        b = BEGIN.search(text, pos)
        if not b:
            return out
        e = END.search(text, b.end())
        if not e:
            raise SystemExit(f"starter.py: BEGIN ASSIGNMENT without END ASSIGNMENT near: {b.group(0)!r}")
        tag = b.group(2) or "forward"
        if tag not in PARTS:
            raise SystemExit(f"starter.py: unknown part '{tag}' in {b.group(0)!r} (parts: {PARTS})")
        if part is None or tag == part:
            out.append((b.start(), e.end(), b.group(1), b.group(3).strip(), text[b.end():e.start()]))
        pos = e.end()


def cut(text: str, part: str) -> str:
    """The regions of `part` cut to TODO lines; the other parts' markers dropped, their code kept."""
    for start, end, indent, hint, core in reversed(regions(text)):
        if (start, end, indent, hint, core) in regions(text, part):
            text = text[:start] + f"{indent}// TODO(student): {hint}\n" + text[end:]
        else:
            text = text[:start] + core + text[end:]
    return text


def paste(student: str, reference: str, part: str) -> str:
    """Puts the reference's cores (already renamed) back where the TODOs are."""
    cores = [core for *_, core in regions(reference, part)]
    todos = list(re.finditer(r"^[ \t]*// TODO\(student\): .*\n", student, re.M))
    if len(todos) != len(cores):
        raise SystemExit(f"starter.py: {len(todos)} TODOs but {len(cores)} reference cores")
    for m, core in reversed(list(zip(todos, cores))):
        student = student[:m.start()] + core + student[m.end():]
    return student


def rename(text: str, ref: str, folder: str, namespaces) -> str:
    number = ref[:2]
    for ns in namespaces:
        text = re.sub(rf"(?<=flashstep::){ns}\b", f"course_{folder}", text)
        text = re.sub(rf"\b(?<!::){ns}::", f"course_{folder}::", text)
    text = text.replace(ref, folder)  # registry names, stages_<ref>(), comments
    text = re.sub(rf"(?<=[Ss]tage ){number}\b", folder, text)
    return text


README = """# {folder}: your stage (starter from {ref})

Made by `tests/course/starter.py {ref} {out}`; the reference solution is
[stages/{ref}](../../stages/{ref}/README.md) (read its README for the algorithm).

## The contract (stages/common/stage.h)

Row-major `Q [B,H,Nq,d]`, `K, V [B,H,Nk,d]` in; `O [B,H,Nq,d]` and, for a
stage with `writes_lse`, `L [B,H,Nq]` (natural-log logsumexp of the scaled
scores) out. Q, K, V and O are in the problem's element type (`p.dtype`;
`ForwardTensors` holds them as `void*`, cast where you read them) and L is fp32;
a stage runs in the types its registry entry lists (`Stage::dtypes`, fp32
unless it says more). Any `d` in 1..256 and any `Nq, Nk >= 1`. Causal: query `i` sees key
`j` iff `j <= i + Nk - Nq` (`Problem::visible_keys`). A row that sees no key
gives `O = 0`, `L = -inf`, never NaN. The tests poison `O` and `L` before each
run, so every element must be written. A CPU mirror (where the stage has one)
runs the same algorithm on the host and must count exactly what `model()` says.

## What to fill in

Every `// TODO(student): ...` line below marks code you write:

{todos}

## Build, test, grade

```sh
cmake -S . -B build -G Ninja -DFLASHSTEP_EXTRA_STAGES={out}
cmake --build build
(cd build && ctest -L student --output-on-failure)   # cpu.{folder}, gpu.{folder}, backward.{folder}
tests/course/grade.py --stage {folder} --build build --reference {ref}{grade_flags}   # report + JSON
build/stages/cli/flashstep --stage {folder},{number}                     # beside the reference
```
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ref", help="reference stage: folder name or number (02 .. 06)")
    ap.add_argument("out", help="new stage folder, e.g. stages/99_yours")
    ap.add_argument("--part", choices=PARTS, default="forward",
                    help="which assignment's regions to cut (default forward; backward: stage 05)")
    ap.add_argument("--solution", action="store_true", help="paste the reference core back in")
    ap.add_argument("--force", action="store_true", help="replace OUTDIR if it exists")
    a = ap.parse_args()
    ref_dir = find_reference(a.ref)
    ref = ref_dir.name
    out = pathlib.Path(a.out)
    folder = out.resolve().name
    if not FOLDER_NAME.match(folder) or folder.isdigit() or (STAGES / folder).resolve() == ref_dir:
        sys.exit(f"starter.py: '{folder}' cannot name a stage: use letters, digits and _, e.g. 99_yours")
    if (STAGES / folder).exists() and (STAGES / folder).resolve() != out.resolve():
        sys.exit(f"starter.py: '{folder}' is already a project stage; pick another name")
    if out.exists():
        if not a.force:
            sys.exit(f"starter.py: {out} exists (use --force to replace it)")
        shutil.rmtree(out)
    out.mkdir(parents=True)

    files = [p for p in sorted(ref_dir.iterdir()) if p.is_file() and p.suffix in SOURCE_SUFFIXES]
    namespaces = set()
    for p in files:
        namespaces |= set(re.findall(r"namespace flashstep::(\w+)", p.read_text()))
    todos, n_regions = [], 0
    for p in files:
        original = rename(p.read_text(), ref, folder, namespaces)
        text = cut(original, a.part)
        n_regions += len(regions(original, a.part))
        for m in re.finditer(r"// TODO\(student\): (.*)", text):
            todos.append(f"- `{p.name}`: {m.group(1)}")
        if a.solution:
            text = paste(text, original, a.part)
        (out / p.name).write_text(text)
    if n_regions == 0:
        shutil.rmtree(out)
        sys.exit(f"starter.py: {ref} has no // BEGIN ASSIGNMENT regions of the {a.part} part")
    display = a.out if not pathlib.Path(a.out).is_absolute() else str(out)
    (out / "README.md").write_text(README.format(
        folder=folder, ref=ref, out=display, number=ref[:2],
        grade_flags=" --backward" if a.part == "backward" else "",
        todos="\n".join(todos) if not a.solution else "(none: --solution pasted the reference core back in)"))
    print(f"wrote {out}/ from stages/{ref} ({n_regions} region(s) {'kept' if a.solution else 'to fill in'}); "
          f"register it with -DFLASHSTEP_EXTRA_STAGES={display}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
