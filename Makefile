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

# plugproxy is installed as a regular copy, its hot path compiled by mypyc where a C
# compiler and Python's headers are present, pure Python where not (setup.py says which,
# in one line). A change under src/ reinstalls it on the next make; meanwhile
# `PYTHONPATH=src .venv/bin/pytest ...` runs the sources as they are, interpreted.
INSTALL_SPEC ?= .
SOURCES := setup.py pyproject.toml $(wildcard src/plugproxy/*.py src/plugproxy/*/*.py \
	src/plugproxy/*/*/*.py src/plugproxy/descriptors/*.binpb)
# pip -v for the one line setup.py writes; the rest of its output only when it fails.
define pip_install
	@log=$$(mktemp); if $(BIN)/pip install -v $(1) >$$log 2>&1; then \
	  grep -E '^ *plugproxy: (compiling|building)' $$log | sed 's/^ *//'; rm -f $$log; \
	else tail -n 60 $$log; rm -f $$log; exit 1; fi
endef

$(VENV)/.installed: $(SOURCES) | $(BIN)/python
	@echo "installing plugproxy and its dependencies into $(VENV), compiling its hot path (a few minutes the first time) ..."
	$(call pip_install,$(INSTALL_SPEC))
	@$(BIN)/plugproxy --version
	touch $@

# The dev tools on top of the same install (plugproxy is compiled once, by .installed).
$(VENV)/.dev-installed: $(VENV)/.installed
	@echo "installing the dev tools (pytest, ruff, mypy, grpcio-tools, ...) into $(VENV) (a few minutes the first time) ..."
	$(BIN)/python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['dev'], sep='\n')" > $(VENV)/dev-requirements.txt \
	  && $(BIN)/pip install --quiet -r $(VENV)/dev-requirements.txt
	touch $@

## install: create the venv and install plugproxy into it (the Dockerfile runs this too)
install: $(VENV)/.installed

## demo: install and run the volume lifecycle through the proxy
demo: install
	$(BIN)/plugproxy demo

# Run again on the sources, interpreted: the relay's conformance and abuse suites, the
# stage chain, and the legitimate-traffic and fault suites (the build a machine without a
# C compiler gets).
INTERPRETED_TESTS = tests/test_build.py tests/test_relay*.py tests/test_pipeline.py \
	tests/test_api.py tests/integration/test_relay_limits.py tests/integration/test_faults.py \
	tests/integration/test_validation_legitimate.py

# Test processes (pytest-xdist). Most tests wait on sockets and child processes, so two
# share even one core well; a test module's tests stay in one process (--dist loadfile).
TEST_WORKERS ?= 2

## test: install (compiled) with dev tools, check generated files, lint, type-check, run the
## suite; then the relay's suites and a fast subset again on the interpreted sources
test: $(VENV)/.dev-installed check
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile
	@echo "the relay's suites and a fast subset again, interpreted (PYTHONPATH=src) ..."
	PYTHONPATH=src PLUGPROXY_EXPECT_BUILD=interpreted $(BIN)/pytest -q -p no:cacheprovider \
	  -n $(TEST_WORKERS) --dist loadfile $(INTERPRETED_TESTS)

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
