#!/usr/bin/env python3
"""Fails when a source file includes a header from a folder above its own in the pipeline order
of shared/DESIGN.md (README "Layout"):

    common < graph, kernels < passes < codegen < runtime < frontend

graph and kernels sit side by side and may not include each other. tests/, bench/ and python/ (the
bindings, above frontend) may include
anything. Prints every offending include as file:line and exits 1; exits 0 when there is none.
`--self-test` checks the checker on a small tree with known offences (ctest runs both)."""
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


def self_test():
    """The check must catch an include against the order and pass one along it."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        root = pathlib.Path(d)
        for folder in RANK:
            (root / folder).mkdir()
        (root / "passes" / "ok.cpp").write_text('#include "graph/graph.h"\n#include "common/errors.h"\n')
        (root / "graph" / "bad.h").write_text('#include "runtime/session.h"\n')
        (root / "kernels" / "side.cuh").write_text('#include "graph/graph.h"\n')
        found = list(offences(root))
        want = ["graph/bad.h:1", "kernels/side.cuh:1"]
        if sorted(f.split(": ")[0] for f in found) != want:
            print("self-test failed:", found)
            return 1
    print("self-test: both offences found, the allowed includes passed")
    return 0


def main():
    if sys.argv[1:2] == ["--self-test"]:
        return self_test()
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
