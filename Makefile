# Two commands do all set-up on a fresh machine:  `make demo` (main job) and `make test` (test suite).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt "torch==2.13.0" -e ".[test]"
	touch $@

.PHONY: install demo test sb3-suite contrib-slow
install: $(VENV)/.installed

# HalfCheetah-v5, 120k steps on one CPU thread; prints the pass mark and exits 1 below it (docs/examples.md)
demo: $(VENV)/.installed
	OMP_NUM_THREADS=1 $(PY) examples/quickstart.py

test: $(VENV)/.installed
	$(PY) -m pytest -n 2 --durations=15 tests

# SB3's own tests that use PPO, with ScalablePPO swapped in (~570 tests; not part of `make test`)
sb3-suite: $(VENV)/.installed
	bash tests/upstream/run_sb3_ppo_suite.sh

# sb3-contrib's own learning-performance tests with the Scalable classes (~15 min with -n 2; tests/contrib/)
contrib-slow: $(VENV)/.installed
	SB3_PPO_SCALE_CONTRIB_SLOW=1 OMP_NUM_THREADS=1 $(PY) -m pytest -n 2 -m slow tests/contrib
