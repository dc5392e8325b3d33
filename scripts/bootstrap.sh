#!/usr/bin/env bash
# Create .venv (if missing) and install kprof-callbacks into it, editable, with the extras named in $1.
# torch is installed first, on its own, so a CPU-only machine never pulls multi-GB CUDA wheels:
#   - KPROF_TORCH="torch==2.5.1" (or a wheel path/URL) overrides the choice below;
#   - a machine with nvidia-smi gets PyPI's default (CUDA) build;
#   - otherwise a local CPU wheel that pip's find-links offers, else PyTorch's CPU index.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-dev}"
py="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$py" -m venv .venv
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)

if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if [ -n "${KPROF_TORCH:-}" ]; then
    "${pip[@]}" install "$KPROF_TORCH"
  elif command -v nvidia-smi >/dev/null 2>&1; then
    echo "installing torch (CUDA build from PyPI)..."
    "${pip[@]}" install torch
  else
    tag="cp$(.venv/bin/python -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')"
    links="${PIP_FIND_LINKS:-$(.venv/bin/python -m pip config get global.find-links 2>/dev/null || true)}"
    wheel=""
    for d in $links; do
      wheel=$(ls "$d"/torch-*+cpu-"$tag"-*.whl 2>/dev/null | sort -V | tail -n 1 || true)
      [ -n "$wheel" ] && break
    done
    if [ -n "$wheel" ]; then
      echo "installing torch (local CPU wheel $(basename "$wheel"))..."
      "${pip[@]}" install "$wheel"
    else
      echo "installing torch (CPU build from download.pytorch.org)..."
      "${pip[@]}" install torch --index-url https://download.pytorch.org/whl/cpu
    fi
  fi
fi
echo "installing kprof-callbacks[$extras]..."
"${pip[@]}" install -e ".[$extras]"
