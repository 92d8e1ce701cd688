# Two entry points, each doing its own set-up: `make train` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: train test test-long test-times lint setup gpu-proof shape

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

# -n 3: the suite's processes wait on each other (start-up, timeouts, barriers) for about
# half of each test, so three at once keep 2 cores busy; --dist loadgroup keeps the tests
# marked xdist_group together in one worker. -rs: every skipped test says why, in CI too.
# --durations=40: the slowest tests, printed on every run.
XDIST := -n 3 --dist loadgroup
# Live shrink and grow (test_shrink, test_grow, test_membership), whose subject is how long
# survivors wait for one another, run beside the others: liveness is decided by heartbeats,
# not by a 3 s answer window (they passed at load 8-12 in a -n 3 run, 2026-12-02), so the
# second, one-at-a-time phase they had until then is gone (about 100 s of wall).

# The suite writes bytecode even where PYTHONDONTWRITEBYTECODE is set: each of its
# processes would otherwise compile disttrain's modules again, and each pytest process
# rewrite and compile every test file's asserts (about 2 s of CPU a collection).
# mypy runs beside the tests (one core for about 25 s, in a run that keeps
# both busy: it shortens the wall by what it overlaps); its output follows theirs.
test: export PYTHONDONTWRITEBYTECODE =
test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples
	@$(BIN)/mypy src > .mypy.out 2>&1 & mypy=$$!; \
	echo "$(BIN)/mypy src (beside the tests)"; \
	$(BIN)/pytest -q -rs $(XDIST) -m "not slow" --durations=40; tests=$$?; \
	wait $$mypy; types=$$?; cat .mypy.out; rm -f .mypy.out; \
	[ $$tests -eq 0 ] && [ $$types -eq 0 ]

# Measurements too slow for CI, each guarded in `make test` by a fast sibling (README).
test-long: $(STAMP)
	$(BIN)/pytest -q -rs -m slow

# CPU and wall seconds per test file, costliest first, and the costliest tests (test-times.txt;
# as root on Linux a test's CPU is its whole process tree's, through a cpuacct cgroup).
test-times: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST) -m "not slow" -p tests.timing  # -m: the repo root on sys.path

# The code's shape against issue 37's targets: plugin bases' members, long functions,
# trainer.py's lines, '# fmt: skip' markers, RESULTS.md's lines (reads the source only).
shape: $(STAMP)
	$(BIN)/python benchmarks/shape.py

# On a GPU machine only (the device tool): the CUDA tests with every candidate let through,
# the one-GPU benchmark, and the rows for docs/gpu.md. Uses the machine's own torch.
gpu-proof:
	bash benchmarks/gpu_proof.sh
