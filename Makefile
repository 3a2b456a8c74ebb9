# orderflow: two commands on a fresh machine — `make demo` and `make test`. Both set everything up.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
ORDERS ?= 50
SEED ?= 1

.PHONY: setup demo lint test test-fast bench clean

$(VENV)/.installed: requirements.txt requirements-dev.txt constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt -c constraints.txt
	touch $@

node_modules/.installed: package.json
	npm install --no-audit --no-fund --silent
	touch $@

setup: $(VENV)/.installed node_modules/.installed

demo: setup
	$(PY) -m devhost demo --orders $(ORDERS) --seed $(SEED)

lint: setup
	$(PY) -m ruff check .

test: lint
	$(PY) -m pytest

test-fast: setup
	$(PY) -m pytest -m "not slow"

bench: setup
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) node_modules .devhost .demo .pytest_cache
