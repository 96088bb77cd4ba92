#!/usr/bin/env python3
"""Times NVRTC on kernels written by `train --dump-kernels DIR`, each kernel compiled alone.

    python3 bench/nvrtc_time.py DIR [--arch sm_90a] [--jobs 1] [--threads] [--glob '*.cu'] [--list]
                                [--options="-lineinfo"]

Prints the count, the wall time, the summed compile time and the slowest kernel; --list adds
one line per kernel, slowest first. --jobs N compiles N at a time in processes (--threads: in
threads of one process). --options replaces the runner's -lineinfo with other NVRTC options
(for example --options=-default-device). The library is NVRTC_LIB, else libnvrtc.so.13 on the loader's path.
On some machines a program compiled before (in any process) compiles again in tens of
milliseconds (bench/RESULTS.md): time kernels that machine has not compiled yet.
"""
import argparse
import ctypes
import glob
import os
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

_lib = None


def nvrtc():
    global _lib
    if _lib is None:
        _lib = ctypes.CDLL(os.environ.get("NVRTC_LIB", "libnvrtc.so.13"))
    return _lib


def compile_one(job):
    path, arch, extra = job
    lib = nvrtc()
    source = open(path, "rb").read()
    prog = ctypes.c_void_p()
    start = time.perf_counter()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source, path.encode(), 0, None, None) != 0:
        return os.path.basename(path), -1, 0.0
    options = [f"--gpu-architecture={arch}".encode(), b"-std=c++17"]
    options += [o.encode() for o in (extra if extra is not None else ["-lineinfo"])]  # default: as the runner compiles
    rc = lib.nvrtcCompileProgram(prog, len(options), (ctypes.c_char_p * len(options))(*options))
    seconds = time.perf_counter() - start
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return os.path.basename(path), rc, seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--threads", action="store_true")
    ap.add_argument("--glob", default="*.cu")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--options", default=None,
                    help="NVRTC options after the architecture and -std=c++17, space-separated, instead of -lineinfo")
    a = ap.parse_args()
    files = sorted(glob.glob(os.path.join(a.dir, a.glob)))
    if not files:
        raise SystemExit(f"no kernels match {a.glob} in {a.dir}")
    nvrtc()
    pool = ThreadPoolExecutor if a.threads else ProcessPoolExecutor
    start = time.perf_counter()
    with pool(a.jobs) as ex:
        extra = a.options.split() if a.options is not None else None
        rows = list(ex.map(compile_one, [(f, a.arch, extra) for f in files]))
    wall = time.perf_counter() - start
    rows.sort(key=lambda r: -r[2])
    failed = [r[0] for r in rows if r[1] != 0]
    print(f"{len(rows)} kernels, {'threads' if a.threads else 'processes'} x{a.jobs}: wall {wall:.2f} s, "
          f"sum {sum(r[2] for r in rows):.2f} s, slowest {rows[0][2]:.3f} s ({rows[0][0]})"
          + (f"; {len(failed)} failed: {', '.join(failed[:5])}" if failed else ""))
    if a.list:
        for name, rc, seconds in rows:
            print(f"{seconds:8.3f} s  {'ok' if rc == 0 else 'rc=' + str(rc)}  {name}")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
