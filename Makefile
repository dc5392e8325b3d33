# Two commands do all set-up on a fresh machine (they create .venv and install what they need):
#   make demo   train a toy model under the profiler, write log/, print the summary and the tensorboard command
#   make test   run the test suite
PY := .venv/bin/python

.PHONY: demo test
demo: .venv/.installed
	$(PY) -m kprof_callbacks demo

test: .venv/.installed
	$(PY) -m pytest

.venv/.installed: pyproject.toml scripts/bootstrap.sh
	./scripts/bootstrap.sh dev
	touch $@
