#!/usr/bin/env bash
# Installs what the build needs (Debian packages, as root) if anything is missing, then
# configures and builds everything into ./build. Safe to run again: it only does what is left.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each package and why it is here: README, "Dependencies".
packages=(cmake ninja-build g++ libyaml-cpp-dev libopenblas-openmp-dev libgtest-dev libbenchmark-dev
          llvm-14-dev libncurses-dev zlib1g-dev libcli11-dev nlohmann-json3-dev python3-dev
          libopenmpi-dev openmpi-bin)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "bootstrap: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The Python helpers of the tests (README "Dependencies"): pip, where they are missing. A machine
# without them still builds; the tests that need them are skipped with a message.
if ! python3 -c "import numpy, safetensors, yaml" 2>/dev/null; then
  echo "bootstrap: installing the Python test helpers numpy, safetensors, pyyaml"
  python3 -m pip install -q --disable-pip-version-check numpy safetensors pyyaml 2>/dev/null ||
    echo "bootstrap: pip could not install them; tests/interop/check_interop.py will be skipped"
fi
# The Python module (README "Python"): nanobind to build it, pytest and matplotlib to test it.
if ! python3 -c "import nanobind, pytest, matplotlib" 2>/dev/null; then
  echo "bootstrap: installing nanobind, pytest, matplotlib for the Python module"
  python3 -m pip install -q --disable-pip-version-check nanobind pytest matplotlib 2>/dev/null ||
    echo "bootstrap: pip could not install them; the Python module is not built and its tests are skipped"
fi

# The CUDA toolkit (nvcc, NVRTC headers) is optional for the CPU build; cmake/cuda.cmake says
# what it adds when it is found. Nothing links libcuda: the driver is loaded at run time.
export PATH="$PATH:/usr/local/cuda/bin"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build build -j"$(nproc)"
