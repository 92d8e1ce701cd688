"""``disttrain train`` on a user's own workload: ``--dataset``, ``--model``, ``--loss``
``module:function`` (examples/workloads.py), read through torch's DataLoader.

- a regression from a CSV file with the user's MSE, through every registered strategy
  (its first mode, from its own declaration) on 2 workers: the strategies that compute
  allreduce's mathematics end within 2 % of its held-out loss, the others learn it
  (under 20 % of the targets' variance); no accuracy is reported for float targets;
- transformers' GPT-2 on byte-level text, dict batches and the model's own loss:
  ZeRO-3 with ``--loader-workers 2`` ends at allreduce's held-out loss (same batches,
  same mathematics) within 1e-5 relative.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.modes import first_modes
from tests.test_cli import run_cli

# one xdist worker runs the module: its shared worlds (and fixtures) once, not once a worker
pytestmark = pytest.mark.xdist_group("user-workload")

REGRESSION = [
    "--dataset", "examples.workloads:regression", "--model", "examples.workloads:regressor",
    "--loss", "examples.workloads:mse", "--optimizer", "adam", "--lr", "0.01",
    "--epochs", "3", "--batch-size", "32", "--workers", "2", "--no-progress",
]  # fmt: skip
SAME = {"allreduce", "zero", "pipeline", "tensor", "hybrid", "ps"}  # ps's first mode: sync
VARIANCE = 10.5  # of the CSV's targets (examples/workloads.py: x @ w, 8 unit features)


def _train(tmp: Path, *argv: str) -> dict[str, Any]:
    out = tmp / "out"
    done = run_cli("train", *argv, "--out", str(out), timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return summary


@pytest.fixture(scope="module")
def allreduce_regression(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _train(tmp_path_factory.mktemp("allreduce"), *REGRESSION)


#: in make test; the other strategies' runs are make test-long's (their step is the same
#: code on this data path: tests/api/test_every_strategy.py runs every mode in make test)
FAST = {"allreduce", "zero", "diloco", "ps", "pipeline"}


@pytest.mark.parametrize(
    "strategy",
    [s if s in FAST else pytest.param(s, marks=pytest.mark.slow) for s in sorted(first_modes())],
)
def test_every_strategy_trains_a_csv_regression(
    strategy: str, allreduce_regression: dict[str, Any], tmp_path: Path
) -> None:
    words = first_modes()[strategy]
    if strategy == "allreduce" and not words:  # the anchor is this very command: one run
        got = allreduce_regression
    else:
        got = _train(tmp_path, *REGRESSION, "--strategy", strategy, *words)
    assert got["strategy"] == strategy
    anchor = allreduce_regression["final_test_loss"]
    assert anchor < 0.05 * VARIANCE and got["final_accuracy"] is None
    loss = got["final_test_loss"]
    if strategy in SAME and got is not allreduce_regression:
        assert abs(loss - anchor) <= 0.02 * anchor, f"{strategy}: {loss:.4f} vs {anchor:.4f}"
    else:
        assert loss < 0.2 * VARIANCE, f"{strategy}: MSE {loss:.4f} (allreduce {anchor:.4f})"


def test_gpt2_dict_batches_zero3_with_loader_workers_equals_allreduce(tmp_path: Path) -> None:
    common = [
        "--dataset", "examples.workloads:byte_text", "--model", "examples.workloads:gpt2",
        "--optimizer", "adam", "--lr", "0.003", "--max-steps", "4", "--batch-size", "16",
        "--workers", "2", "--no-progress",
    ]  # fmt: skip
    plain = _train(tmp_path / "a", *common)
    sharded = _train(
        tmp_path / "z", *common, "--strategy", "zero", "--zero-stage", "3", "--loader-workers", "2"
    )
    a, z = plain["final_test_loss"], sharded["final_test_loss"]
    assert abs(a - z) <= 1e-5 * a, (a, z)
    assert plain["final_accuracy"] is None  # a language model's output.loss: no accuracy


IMAGES = [
    "--dataset", "examples.workloads:image_folder", "--model", "examples.workloads:resnet",
    "--optimizer", "adam", "--lr", "0.01", "--epochs", "2", "--batch-size", "16",
    "--workers", "2", "--loader-workers", "2", "--no-progress",
]  # fmt: skip


@pytest.mark.parametrize("strategy", [["allreduce"], ["diloco"]], ids=lambda s: s[0])
def test_a_batchnorm_vision_model_on_an_image_folder(strategy: list[str], tmp_path: Path) -> None:
    """transformers' ResNet (BatchNorm in every block) on PNG files read with PIL, a random
    flip in the loader's 2 worker processes: held-out accuracy from the model's logits."""
    got = _train(tmp_path, *IMAGES, "--strategy", *strategy)
    assert got["final_accuracy"] >= 0.9, got["final_accuracy"]


def test_pipeline_refuses_a_model_that_is_no_sequential_in_one_line(tmp_path: Path) -> None:
    done = run_cli("train", *IMAGES, "--strategy", "pipeline", "--out", str(tmp_path / "o"))
    assert done.returncode == 2
    line = done.stderr.strip().splitlines()
    assert len(line) == 1 and "nn.Sequential" in line[0], done.stderr
