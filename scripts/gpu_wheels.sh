#!/usr/bin/env bash
# Download, into .whl/, the wheels a stock PyTorch GPU machine without internet lacks for `make test-gpu`:
# kprof's own dependencies that such images leave out (torch-tb-profiler, msgspec), the test tools, and Liger-Kernel
# (the bench extra: kprof bench's Liger columns) and Cut Cross-Entropy (kprof bench --ops linear_cross_entropy).
# Run it where pip reaches PyPI; copy (or carry) .whl/ to the GPU machine. PYVER picks the GPU machine's Python.
set -euo pipefail
cd "$(dirname "$0")/.."
pyver="${PYVER:-3.12}"
platforms=()
for n in 17 27 28; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
wheels=(torch-tb-profiler==0.4.3 msgspec liger-kernel cut-cross-entropy pytest pytest-timeout pytest-xdist execnet psutil iniconfig pluggy packaging)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
  "${platforms[@]}" -d .whl "${wheels[@]}"
ls .whl
