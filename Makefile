# Two entry points (see README "Quick start"):
#   make demo   set up .venv and run `nanguard demo`
#   make test   set up .venv and run lint, types and the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.nanguard-installed

.PHONY: setup demo test lint typecheck pytest clean

setup: $(STAMP)

$(STAMP): pyproject.toml requirements-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -r requirements-dev.txt
	$(BIN)/python -m pip install -q -e .
	touch $(STAMP)

demo: setup
	$(BIN)/nanguard demo

lint: setup
	$(BIN)/ruff check src tests benchmarks

typecheck: setup
	$(BIN)/mypy

pytest: setup
	$(BIN)/pytest -q

test: lint typecheck pytest

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
