# The two commands a newcomer types: `make run` and `make test`.
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-done
# Only folders that exist: git keeps no empty ones, and ruff fails on a missing path.
LINT_PATHS := $(wildcard runtime backend tests examples)
# Test files run on this many pytest workers (pytest-xdist), a file's tests on one worker (their module fixtures: an
# API server, a worker, a browser page); most suites wait on processes they start, so two overlap well on 2 cores.
TEST_WORKERS ?= 2
PYTEST_PAR := -n $(TEST_WORKERS) --dist loadfile

.PHONY: run test test-fast lint install gpu-test clean mutate

$(STAMP): pyproject.toml scripts/setup.sh
	scripts/setup.sh
	touch $(STAMP)

install: $(STAMP)

## make run: the workbench on embedded defaults (SQLite, a private Redis, one local worker) at http://127.0.0.1:8000
## (another port or data folder: SLIDEDP_PORT=8080 SLIDEDP_DATA_DIR=/path/to/data make run)
run: install
	@if [ -f frontend/package.json ]; then scripts/build_frontend.sh; fi
	@echo "run: starting the workbench ($(BIN)/slidedp serve; Ctrl-C stops it) ..."
	@$(BIN)/slidedp serve

## make test: everything CI runs (lint, runtime, backend, browser, fault and fuzz suites)
test: install
	SETUP_BROWSER=1 scripts/setup.sh
	$(BIN)/ruff check $(LINT_PATHS)
	cd frontend && { [ -d node_modules ] || npm ci --no-audit --no-fund --loglevel=error; } && npm test --silent
	$(BIN)/python -m pytest -q $(PYTEST_PAR) --durations=25 -m "not gpu" tests

## make test-fast: the quick subset for iteration (no browser, no slow suites)
test-fast: install
	$(BIN)/python -m pytest -q $(PYTEST_PAR) -m "not gpu and not e2e and not slow" tests

## make gpu-test: the GPU suite, on the GPU machine (torch with CUDA, no web stack needed)
gpu-test:
	NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=runtime:. \
		python3 -m pytest -q -m gpu tests/gpu tests/runtime

## make mutate: mutation testing of the optimizer's schedule and clip rule, health, the memory cap, path guards, DELETE
## and export (slow, not part of make test; one target: make mutate TARGETS=clip; docs/testing.md)
mutate: install
	$(BIN)/python scripts/mutate.py $(TARGETS)

lint: install
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)

clean:
	rm -rf $(VENV) frontend/node_modules frontend/dist
