#!/usr/bin/env python3
"""Fails when a source file includes a header from a folder above its own in the pipeline order
of shared/DESIGN.md (README "Layout"):

    common < graph, kernels < passes < codegen < runtime < frontend

graph and kernels sit side by side and may not include each other. tests/ and bench/ may include
anything. Prints every offending include as file:line and exits 1; exits 0 when there is none."""
import pathlib
import re
import sys

RANK = {"common": 0, "graph": 1, "kernels": 1, "passes": 2, "codegen": 3, "runtime": 4, "frontend": 5}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/')
SUFFIXES = {".h", ".cpp", ".cuh", ".cu", ".def", ".inc"}


def offences(root):
    for folder, rank in RANK.items():
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in SUFFIXES or not path.is_file():
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                m = INCLUDE.match(line)
                if not m or m.group(1) not in RANK:
                    continue
                target = m.group(1)
                if RANK[target] > rank or (RANK[target] == rank and target != folder):
                    yield f"{path.relative_to(root)}:{number}: {folder}/ includes {target}/ ({line.strip()})"


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
    found = list(offences(root))
    for line in found:
        print(line)
    if found:
        print(f"{len(found)} include(s) against the layer order common < graph, kernels < passes < codegen < runtime < frontend")
        return 1
    print("includes follow the layer order")
    return 0


if __name__ == "__main__":
    sys.exit(main())
