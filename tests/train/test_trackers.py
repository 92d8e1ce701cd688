"""TensorBoard files that tensorboard's own reader loads, holding every figure of the run.

The reader is tensorboard's ``EventAccumulator`` (what TensorBoard's server uses),
not our writer: a tag missing or a value changed on the way fails here. The
end-to-end test reads the TensorBoard folder of tests/lab/shared_compare.py's
``compare`` (shared with two other files), whose specs include a run for each kind of
figure (compression from decentralized one-bit, staleness from the asynchronous
parameter server, the bubble from the pipeline).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from disttrain.train.trackers import TensorBoardTracker, flatten_numbers
from tests.lab.shared_compare import GROUP, SPECS, TIMEOUT, compared

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="tensorboard is in requirements.lock; install it with `make setup`",
)


def _scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    acc = event_accumulator.EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def test_flatten_numbers_keeps_every_finite_number_by_path() -> None:
    got = dict(flatten_numbers({"a": 1, "b": {"c": 2.5, "d": "x"}, "e": [3, 4], "f": math.nan}))
    assert got == {"a": 1.0, "b/c": 2.5, "e/0": 3.0, "e/1": 4.0}


def test_tensorboard_tracker_round_trips_through_tensorboards_reader(tmp_path: Path) -> None:
    tracker = TensorBoardTracker(str(tmp_path))
    tracker.scalars(1, {"step": 1, "epoch": 0, "loss": 2.0, "lr": 0.1})
    tracker.scalars(2, {"step": 2, "epoch": 0, "loss": 1.5, "lr": 0.1})
    tracker.scalars(2, {"step": 2, "test_loss": 1.25, "test_accuracy": 0.5, "bytes_sent": 9})
    tracker.finish(
        {
            "steps": 2,
            "pipeline": {"bubble_theory": 0.2},
            "time_breakdown": {"compute": 1.5},
            "memory_per_rank": {"peak_rss": [10, 11]},
        },
        is_main=True,
    )
    tracker.close()
    got = _scalars(tmp_path)
    assert got["train/loss"] == [(1, 2.0), (2, 1.5)]
    assert got["test/loss"] == [(2, 1.25)] and got["test/accuracy"] == [(2, 0.5)]
    assert got["summary/pipeline/bubble_theory"] == [(2, pytest.approx(0.2))]
    assert got["summary/memory_per_rank/peak_rss/1"] == [(2, 11.0)]
    assert got["time/compute_seconds"] == [(2, 1.5)]
    assert "train/step" not in got and "train/bytes_sent" not in got  # epoch-end: test only


@pytest.mark.xdist_group(GROUP)
@pytest.mark.timeout(TIMEOUT)
def test_compare_writes_one_tensorboard_run_per_spec_with_every_figure(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    shared = compared(tmp_path_factory)
    board = shared.board
    runs = sorted(p.name for p in board.iterdir())
    slugs = [s.replace(":", "_") for s in SPECS]
    assert runs == [f"{i}-{slug}" for i, slug in enumerate(slugs, 1)], runs
    every = {
        "train/loss",
        "train/lr",
        "train/samples_per_second",
        "train/bytes_sent",
        "test/loss",
        "summary/samples_per_second",
        "summary/memory_per_rank/peak_rss/0",
        "summary/bytes_sent_by_rank/1",
        "time/compute_seconds",
    }
    own = {
        "6-decentralized_onebit": {"train/payload_compression", "train/bytes_vs_dense_allreduce"},
        "5-ps_async": {"summary/staleness_mean", "summary/staleness_max"},
        "7-pipeline": {"summary/pipeline/bubble_theory"},
    }
    for run in runs:
        got = _scalars(board / run)
        missing = (every | own.get(run, set())) - set(got)
        assert not missing, (run, sorted(missing), sorted(got))
        steps = [s for s, _ in got["train/loss"]]
        assert steps == sorted(steps) and steps[-1] >= 1
        assert "test/accuracy" not in got  # the regression has none: no figure made up
        assert all(math.isfinite(v) for _, v in got["test/loss"])
