# Two entry points (see README "Quick start"):
#   make demo   the smallest install that runs the demo (nanguard + CPU torch), then `nanguard demo`
#   make test   the rest of the dev stack on top, then lint, types and both test tiers
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
# what is installed: the demo's stamp stands for nanguard (numpy, rich) + torch, the dev stamp
# for requirements-dev.txt on top (TensorFlow, Lightning, transformers, the test tools)
DEMO_STAMP = $(VENV)/.nanguard-demo
DEV_STAMP  = $(VENV)/.nanguard-dev

# --no-compile: pip would byte-compile every file of torch and TensorFlow up front (most of
# the install time, measured: torch 50 s -> 17 s); Python compiles what is imported, when it is
PIP = $(BIN)/python -m pip install -q --no-compile

.PHONY: setup demo test lint typecheck pytest test-fast test-slow clean

setup: $(DEV_STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(DEMO_STAMP): pyproject.toml requirements-demo.txt | $(BIN)/python
	$(PIP) -r requirements-demo.txt -e .
	touch $@

$(DEV_STAMP): $(DEMO_STAMP) requirements-dev.txt
	$(PIP) -r requirements-dev.txt
	touch $@

demo: $(DEMO_STAMP)
	$(BIN)/nanguard demo

lint: $(DEV_STAMP)
	$(BIN)/ruff check src tests benchmarks

typecheck: $(DEV_STAMP)
	$(BIN)/mypy

# the default tier (core rules, adapters' fault injection, commands): a few minutes
test-fast: $(DEV_STAMP)
	$(BIN)/pytest -q

# the end-to-end tier (scenario suites, browser, DDP, benchmark smoke runs)
test-slow: $(DEV_STAMP)
	$(BIN)/pytest -q -m slow

pytest: test-fast test-slow

test: lint typecheck test-fast test-slow

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
