"""Call overhead of the two binding libraries the issue names (nanobind, pybind11), on the same
two functions (bench/python_overhead/): builds both with CMake in a temporary folder, times a
call with an int and one with a float32 NumPy array (median of 7 timeit repeats), and reports
the build time and the module size of each. README "Python" and bench/RESULTS.md quote it.
Usage: python3 bench/python_call_overhead.py"""
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python_overhead")


def main():
    build = tempfile.mkdtemp(prefix="pa-binding-bench-")
    subprocess.run(["cmake", "-S", HERE, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                    f"-DPython_EXECUTABLE={sys.executable}"], check=True, capture_output=True)
    times = {}
    for target in ("nb_probe", "pb_probe"):
        t0 = time.perf_counter()
        subprocess.run(["cmake", "--build", build, "--target", target, "-j1"], check=True, capture_output=True)
        times[target] = time.perf_counter() - t0
    sys.path.insert(0, build)
    import numpy as np
    import nb_probe
    import pb_probe
    a = np.ones(1024, np.float32)
    print("| library | int call (ns) | float32 array call (ns) | build (s, one core) | module (KiB) |")
    print("|---|---|---|---|---|")
    for name, mod in (("nanobind", nb_probe), ("pybind11", pb_probe)):
        def per_call(stmt):
            n = 200000
            runs = timeit.repeat(stmt, globals={"m": mod, "a": a}, number=n, repeat=7)
            return statistics.median(runs) / n * 1e9
        so = [f for f in os.listdir(build) if f.startswith(mod.__name__) and f.endswith(".so")][0]
        size = os.path.getsize(os.path.join(build, so)) / 1024
        target = mod.__name__
        print(f"| {name} | {per_call('m.noop(1)'):.0f} | {per_call('m.first(a)'):.0f} | {times[target]:.1f} | {size:.0f} |")


if __name__ == "__main__":
    main()
