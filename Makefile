# Two entry points, each doing its own set-up: `make train` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: train test lint setup gpu-proof

setup: $(STAMP)

# --no-deps: the lock file lists every package, so pip never resolves a newer
# torch (with its CUDA packages) on its own.
$(STAMP): requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check --no-deps -r requirements.lock
	$(BIN)/pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

train: $(STAMP)
	$(BIN)/disttrain train

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples
	$(BIN)/mypy src

test: lint
	$(BIN)/pytest -q -rs  # -rs: every skipped test says why, in CI too

# On a GPU machine only (the device tool): the CUDA tests with every candidate let through,
# the one-GPU benchmark, and the rows for docs/gpu.md. Uses the machine's own torch.
gpu-proof:
	bash benchmarks/gpu_proof.sh
