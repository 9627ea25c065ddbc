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

# the suite with sb3-contrib's learning-performance test (tests/contrib/conftest.py), then SB3's own PPO tests with
# ScalablePPO swapped in (docs/testing.md)
test: $(VENV)/.installed
	SB3_PPO_SCALE_CONTRIB_SLOW=1 $(PY) -m pytest -n 2 --durations=15 tests
	bash tests/upstream/run_sb3_ppo_suite.sh

# SB3's own tests that use PPO, with ScalablePPO swapped in (121 tests, ~40 s; also run by `make test`)
sb3-suite: $(VENV)/.installed
	bash tests/upstream/run_sb3_ppo_suite.sh

# sb3-contrib's own learning-performance test with the Scalable classes alone (~4 min of one core; in `make test` too)
contrib-slow: $(VENV)/.installed
	SB3_PPO_SCALE_CONTRIB_SLOW=1 OMP_NUM_THREADS=1 $(PY) -m pytest -m slow tests/contrib
