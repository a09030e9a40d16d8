# Two commands on a fresh clone: `make demo` and `make test`. Both create .venv first;
# the demo installs only the CLI extra, the tests the whole dev toolchain.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.demo-installed

.PHONY: demo test lint typecheck unit bench bench-quick clean

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
	$(BIN)/ruff check src tests examples
	$(BIN)/ruff format --check src tests examples
	$(BIN)/mypy examples

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest

test: lint typecheck unit

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
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
