"""One real ``disttrain compare`` run whose output three test files check, each its own claims.

tests/lab/test_compare.py (the report's rows, the terminal table, runs.json, plots, run
folders), tests/lab/test_compare_user_workload.py (the user's own workload's figures) and
tests/train/test_trackers.py (one TensorBoard run per spec, each with its own figures).
A compare costs a launcher and its workers per spec: one run of 7 specs instead of three
runs of 3, 5 and 3 (about 29 CPU-s instead of 55). The workload is the user's own
(examples/workloads.py: the CSV regression, its MSE, Adam), over every strategy whose
figures one of the tests reads.

The run is made once per process (``_cache``): the tests that use it carry
``@pytest.mark.xdist_group(GROUP)``, so that ``--dist loadgroup`` sends them all to one
worker; the first of them pays for the run, hence their timeout of :data:`TIMEOUT`.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.test_cli import run_cli

SPECS = [
    "allreduce:ring",
    "zero:3",
    "localsgd:period=2",
    "diloco",
    "ps:async",
    "decentralized:onebit",
    "pipeline",
]
GROUP = "shared-compare"
STEPS = 4
TIMEOUT = 600  # the test that runs the compare: its 7 runs, each under --run-timeout


@dataclass(frozen=True)
class Compared:
    out: Path  # compare's --out: report.md, runs.json, the plots, runs/run-NN
    board: Path  # --tensorboard: one run folder per spec
    done: subprocess.CompletedProcess[str]


_cache: dict[str, Compared] = {}


def compared(factory: pytest.TempPathFactory) -> Compared:
    """The shared run (made on first use), asserted to have exited 0 for every test that
    reads it (a failed compare fails each of them with its output)."""
    if "run" not in _cache:
        root = factory.mktemp("shared-compare")
        done = run_cli(
            "compare", "--strategies", ",".join(SPECS), "--workers", "2",
            "--dataset", "examples.workloads:regression", "--model", "examples.workloads:regressor",
            "--loss", "examples.workloads:mse", "--optimizer", "adam", "--lr", "0.01",
            "--max-steps", str(STEPS), "--batch-size", "32", "--target", "0.01",
            "--tensorboard", str(root / "tb"), "--out", str(root / "cmp"),
            "--run-timeout", "300", "--no-progress",
            timeout=TIMEOUT - 60,
        )  # fmt: skip
        _cache["run"] = Compared(root / "cmp", root / "tb", done)
    run = _cache["run"]
    assert run.done.returncode == 0, _failed(run.done)
    return run


def _failed(done: subprocess.CompletedProcess[str]) -> str:
    return f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
