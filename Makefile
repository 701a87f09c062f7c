# Two commands do all the set-up: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo install test check docs lint protos bench image clean

# pip runs quietly; a line before each long step says what is going on meanwhile.
$(BIN)/python:
	@echo "creating the virtualenv $(VENV) and upgrading its pip ..."
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The image build runs `make install VENV=/opt/plugproxy INSTALL_SPEC=.` (not editable).
INSTALL_SPEC ?= -e .

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	@echo "installing plugproxy and its dependencies into $(VENV) (a minute or two the first time) ..."
	$(BIN)/pip install --quiet $(INSTALL_SPEC)
	touch $@

$(VENV)/.dev-installed: pyproject.toml | $(BIN)/python
	@echo "installing plugproxy and the dev tools (pytest, ruff, mypy, grpcio-tools, ...) into $(VENV) (a few minutes the first time) ..."
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

## image: build the container image plugproxy:<version> (docs/injecting.md, "The image")
VERSION = $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' pyproject.toml)
IMAGE ?= plugproxy:$(VERSION)
# Chosen once, on first use: docker where its engine answers, else podman.
ENGINE ?= $(eval ENGINE := $(shell docker info >/dev/null 2>&1 && echo docker \
	|| (command -v podman >/dev/null && echo podman)))$(ENGINE)
# debian: bases built here from Debian packages (tools/build-bases.sh), no registry needed;
# pull: the Dockerfile's default bases, pulled from their registries.
BASES ?= debian
BASES_ID = $(shell sha256sum tools/build-bases.sh | cut -c1-12)
DEBIAN_BUILD_BASE = localhost/plugproxy-base-build:bookworm-$(BASES_ID)
DEBIAN_RUNTIME_BASE = localhost/plugproxy-base-runtime:bookworm-$(BASES_ID)
# A CA bundle pip trusts during the build only (a proxy's); never stored in the image.
BUILD_CA ?= $(wildcard /etc/ssl/certs/ca-certificates.crt)
comma := ,

image:
	$(if $(ENGINE),,$(error make image: needs podman, or docker with a running engine))
	$(if $(filter debian pull,$(BASES)),,$(error make image: BASES is debian or pull, not '$(BASES)'))
	$(if $(BUILD_CA),$(if $(wildcard $(BUILD_CA)),,$(error make image: BUILD_CA $(BUILD_CA) does not exist)))
ifeq ($(BASES),debian)
	tools/build-bases.sh $(ENGINE) $(DEBIAN_BUILD_BASE) $(DEBIAN_RUNTIME_BASE)
endif
	$(ENGINE) build --tag $(IMAGE) \
	  $(if $(filter debian,$(BASES)),--build-arg BUILD_BASE=$(DEBIAN_BUILD_BASE) --build-arg RUNTIME_BASE=$(DEBIAN_RUNTIME_BASE)) \
	  $(if $(BUILD_CA),--secret id=build-ca$(comma)src=$(BUILD_CA)) .

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
