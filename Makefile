# orderflow: two commands on a fresh machine — `make demo` and `make test`. Both set everything up.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
ORDERS ?= 50
SEED ?= 1

.PHONY: setup demo lint test test-fast bench clean

$(VENV)/.installed: requirements.txt requirements-dev.txt constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt -c constraints.txt 2>&1 \
		| { grep -v "^WARNING: Location 'file://" || true; }
	touch $@

node_modules/.installed: package.json
	npm install --no-audit --no-fund --silent
	touch $@

setup: $(VENV)/.installed node_modules/.installed

demo: setup
	$(PY) -m devhost demo --orders $(ORDERS) --seed $(SEED)

lint: setup
	$(PY) -m ruff check .
	$(PY) -m mypy

test: lint
	$(PY) -m pytest

test-fast: setup
	$(PY) -m pytest -m "not slow"

bench: setup
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) node_modules .devhost .demo .pytest_cache
