#!/usr/bin/env bash
# The sanitizer step of CI: builds `train` and the CPU tests (the config fuzzer included) with
# AddressSanitizer and UndefinedBehaviorSanitizer into ./build-asan and runs the `cpu` label
# there. Any report fails the step. README "Sanitizer build and config fuzzing" says more.
# Extra arguments go to the configure step (e.g. -DPA_WERROR=OFF).
set -euo pipefail
cd "$(dirname "$0")/.."

# -O1: compiles about as fast as -O0 and runs the tests several times faster; asserts stay on.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g1" "-DCMAKE_C_FLAGS_DEBUG=-O1 -g1" \
      -DPA_SANITIZE=ON -DPA_BUILD_BENCH=OFF -DPA_BUILD_PYTHON=OFF "$@" >/dev/null
cmake --build build-asan -j"$(nproc)" --target train cpu_tests

# Reports end the process with a nonzero status (UBSan's through -fno-sanitize-recover); the
# config fuzzer also fails on any report in a child's stderr.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:check_initialization_order=1:strict_init_order=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
ctest --test-dir build-asan -L cpu --output-on-failure -j"$(nproc)"
