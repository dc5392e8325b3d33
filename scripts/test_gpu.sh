#!/usr/bin/env bash
# `make test-gpu`: the whole suite on a machine whose python3 already has a CUDA build of torch (the GPU tests,
# skipped elsewhere, run here). Missing packages come from .whl/ when it exists (offline machines: fill it with
# scripts/gpu_wheels.sh where pip reaches PyPI), else from PyPI. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
"$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'make test-gpu: torch sees no CUDA device')"
if [ -d .whl ]; then
  site="$(pwd)/.gpu-site"
  "$py" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" .whl/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  export PATH="$site/bin:$PATH"
fi
"$py" -m pip install -q --no-deps --no-build-isolation -e .  # kprof itself, with its TensorBoard entry point
workers=$("$py" -c "import os; print(min(8, os.cpu_count() or 1))")
# The tests marked serial start child processes that profile (the GPU, or pinned CPU cores); beside a dozen workers
# doing the same they ran past 300 s on the H100, so they run after the rest, one at a time.
# Exit status 5 (no test selected, e.g. a path without such tests) counts as success in either part.
status=0
"$py" -m pytest -n "$workers" --timeout 300 -m "not serial" "$@" || status=$?
[ "$status" -eq 5 ] && status=0
"$py" -m pytest --timeout 300 -m serial "$@" -n 0 || { rc=$?; [ "$rc" -eq 5 ] || status=$rc; }
exit "$status"
