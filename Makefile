# Two commands do all the set-up: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo install test check docs lint protos bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The image build runs `make install VENV=/opt/plugproxy INSTALL_SPEC=.` (not editable).
INSTALL_SPEC ?= -e .

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet $(INSTALL_SPEC)
	touch $@

$(VENV)/.dev-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@ $(VENV)/.installed

## install: create the venv and install plugproxy into it (the Dockerfile runs this too)
install: $(VENV)/.installed

## demo: install and run the volume lifecycle through the proxy
demo: install
	$(BIN)/plugproxy demo

## test: install with dev tools, check generated descriptors, lint, type-check, run the suite
test: $(VENV)/.dev-installed check
	$(BIN)/pytest -q

check: $(VENV)/.dev-installed
	$(BIN)/python tools/gen_descriptors.py --check
	$(BIN)/python tools/gen_docs.py --check
	$(BIN)/ruff check src tests tools bench
	$(BIN)/ruff format --check src tests tools bench
	$(BIN)/mypy

## docs: regenerate docs/configuration.md and the generated sections of docs/*.md
docs: $(VENV)/.dev-installed
	$(BIN)/python tools/gen_docs.py

## protos: regenerate src/plugproxy/descriptors from protos/
protos: $(VENV)/.dev-installed
	$(BIN)/python tools/gen_descriptors.py

## bench: the quick benchmark (see docs/performance.md for the full run)
bench: $(VENV)/.dev-installed
	$(BIN)/python bench/run.py --quick

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
