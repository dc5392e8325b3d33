# Two commands do all set-up on a fresh machine (they create .venv and install what they need):
#   make demo   train a toy model under the profiler, write log/, print the summary and the tensorboard command
#   make test   check the code with ruff (lint, import order, format), then run the test suite
# On a GPU machine whose python3 has a CUDA build of torch: `make test-gpu` (scripts/test_gpu.sh) runs the whole
# suite there, GPU tests included; an offline one takes its missing wheels from .whl/ (scripts/gpu_wheels.sh).
PY := .venv/bin/python

.PHONY: demo test test-gpu
demo: .venv/.installed
	$(PY) -m kprof_callbacks demo

test: .venv/.installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest

test-gpu:
	./scripts/test_gpu.sh

.venv/.installed: pyproject.toml scripts/bootstrap.sh
	./scripts/bootstrap.sh dev
	touch $@
