# Two commands on a fresh clone: `make demo` and `make test`. Both create .venv first;
# the demo installs only the CLI extra, the tests the whole dev toolchain.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.demo-installed

.PHONY: demo test lint typecheck docs unit model-check bench bench-quick clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The demo needs the library and its CLI only. After `make demo`, `make test` still
# installs the dev toolchain: its stamp is its own.
$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[cli]'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/intention-kernel demo

lint: $(STAMP)
	$(BIN)/ruff check src tests examples docs/_hooks
	$(BIN)/ruff format --check src tests examples docs/_hooks

typecheck: $(STAMP)
	$(BIN)/mypy

# The documentation site, built into build/site (open build/site/index.html). The
# strict build fails on a broken link or anchor and on a docstring it cannot render
# (never with --quiet: it hides the warnings from --strict, which then passes).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The unit suite on PYTEST_WORKERS processes (pytest-xdist, --dist=loadgroup from
# pyproject.toml). It mostly waits on fsync, child processes and PostgreSQL, so it runs
# more workers than the machine has cores. PYTEST_WORKERS=0 runs it in one process.
# Tests marked ``serial`` run after it, in one process (the OpenAPI fuzz file).
# The suite writes bytecode caches even where PYTHONDONTWRITEBYTECODE is set. Without
# them, each pytest worker rewrote every test module's asserts, and each child process
# compiled the library and the test helpers from source.
PYTEST_WORKERS ?= 6
unit: export PYTHONDONTWRITEBYTECODE =
unit: $(STAMP)
	$(BIN)/pytest -n $(PYTEST_WORKERS) -m 'not serial'
	$(BIN)/pytest -n 0 -m serial

# The turn protocol, model-checked with SPIN (models/turn_protocol.pml): the exhaustive
# verification and every mutant, pan built in build/model-check/ (needs spin and cc).
# `make test` runs the same runs once, inside the unit suite (tests/test_protocol_model.py).
model-check:
	$(PYTHON) models/check_protocol.py

test: lint typecheck docs unit

# Benchmarks against the hand-written floor, LangGraph and DBOS (needs PostgreSQL at
# $$INTENTION_KERNEL_POSTGRES_DSN, default postgresql://postgres@127.0.0.1:5432/test).
BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python -m bench

bench-quick: $(BENCH_STAMP)
	$(BIN)/python -m bench --quick

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis build/model-check build/site
