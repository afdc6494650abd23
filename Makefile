# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.setup-stamp

.PHONY: setup demo test test-fast lint bench clean

$(STAMP): pyproject.toml requirements-dev.txt requirements-lock.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt -c requirements-lock.txt
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/mldbg demo

test: $(STAMP)
	bash scripts/ensure_chromium.sh
	$(PY) -m pytest -q -n 2

# The inner loop: no real models, no other Pythons, no browser (see the markers in pyproject.toml).
test-fast: $(STAMP)
	$(PY) -m pytest -q -n 2 -m "not slow and not browser"

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks scripts
	$(VENV)/bin/ruff format --check src tests benchmarks scripts
	$(VENV)/bin/mypy
	$(PY) scripts/ratchets.py

bench: $(STAMP)
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/parity.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
