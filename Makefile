# Two commands do all set-up on a fresh machine:  `make demo` (main job) and `make test` (test suite).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt "torch==2.13.0" -e ".[test]"
	touch $@

.PHONY: install demo test
install: $(VENV)/.installed

# HalfCheetah-v5, 120k steps on one CPU thread; prints the pass mark and exits 1 below it (docs/examples.md)
demo: $(VENV)/.installed
	OMP_NUM_THREADS=1 $(PY) examples/quickstart.py

test: $(VENV)/.installed
	$(PY) -m pytest -n 2 --durations=15 tests
