# orderflow: two commands on a fresh machine — `make demo` and `make test`. Both set everything up.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The real worker library (azure-functions-runtime) needs Python >= 3.13: pyenv's newest 3.13, else python3.13.
WORKER_VENV := .venv-worker
PYTHON313 ?= $(shell PYENV_VERSION=$$(pyenv versions --bare 2>/dev/null | grep '^3\.13' | tail -1) \
	pyenv which python3.13 2>/dev/null || command -v python3.13 2>/dev/null)
ORDERS ?= 50
SEED ?= 1
# The three installs (.venv, .venv-worker, node_modules) and the lint run side by side on a fresh machine (about 40 s
# less than one after another). The installs are quiet, so nothing needs --output-sync (which would hold back the
# demo's progress bar and the tests' output).
MAKEFLAGS += --jobs=3

.PHONY: setup worker-env demo up down lint test test-fast bench clean drills drills-quick

# The project itself goes in editable, without dependencies (the requirements hold them): the `orderflow` command.
$(VENV)/.installed: requirements.txt requirements-dev.txt constraints.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt -c constraints.txt 2>&1 \
		| { grep -v "^WARNING: Location 'file://" || true; }
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

$(WORKER_VENV)/.installed: requirements.txt requirements-worker.txt constraints.txt
	@test -n "$(PYTHON313)" || { echo "Python 3.13 not found (pyenv or python3.13 on PATH): the real worker's indexing check needs it"; exit 1; }
	$(PYTHON313) -m venv $(WORKER_VENV)
	$(WORKER_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-worker.txt -c constraints.txt 2>&1 \
		| { grep -v "^WARNING: Location 'file://" || true; }
	touch $@

node_modules/.installed: package.json
	npm install --no-audit --no-fund --silent
	touch $@

setup: $(VENV)/.installed node_modules/.installed

worker-env: $(WORKER_VENV)/.installed

demo: setup
	$(PY) -m devhost demo --orders $(ORDERS) --seed $(SEED)

# The local system in the background (devhost, the Agent, the simulator; logs under .devhost/logs); see README.
up: setup
	$(PY) -m devhost up

down: setup
	$(PY) -m devhost down

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

# Three pytest-xdist workers on two cores: many tests wait on subprocesses (the drills, devhost, the Agent); with four,
# a timing-sensitive drill failed once on a loaded machine. A test file per worker, in file order (--dist loadfile):
# a module's tests share its fixtures, and some check what the tests above them did.
test: lint worker-env
	$(PY) -m pytest -n 3 --dist loadfile

test-fast: setup worker-env
	$(PY) -m pytest -n 3 --dist loadfile -m "not slow"

# Every failure drill on a fresh local system each, then reports/reliability.md and .json (lab/drills_report.py).
# Not part of `make test`; CI runs drills-quick (the subset, under 5 minutes) after the tests.
drills: setup
	$(PY) -m devhost drills

drills-quick: setup
	$(PY) -m devhost drills --quick

# The benchmarks, then ours against DBOS (benchmarks/compare.py), whose packages (dbos, matplotlib) live in
# requirements-bench.txt: installed into .venv by bench-deps, never by setup or test.
bench: setup bench-deps
	$(PY) -m benchmarks
	$(PY) -m benchmarks compare

.PHONY: bench-deps
bench-deps: $(VENV)/.bench-installed

$(VENV)/.bench-installed: $(VENV)/.installed requirements-bench.txt constraints.txt
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-bench.txt -c constraints.txt 2>&1 \
		| { grep -v "^WARNING: Location 'file://" || true; }
	touch $@

clean:
	rm -rf $(VENV) $(WORKER_VENV) node_modules .devhost .demo .pytest_cache
