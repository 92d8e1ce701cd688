"""samples/s counts only the steps this process ran, over the seconds since it started.

After ``--resume`` at half way, counting the restored steps over this process's
seconds would report about twice the real rate. The figures are checked against
their own inputs (steps and seconds written next to them), not against another
run's timing, so the test holds on a loaded machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from disttrain.train.metrics import Throughput
from tests.test_cli import run_cli


def test_throughput_counts_the_steps_run_since_the_start() -> None:
    t = Throughput(batch_size=64, start=100.0)
    assert t.samples_per_second(10, 2.0) == pytest.approx(10 * 64 / 2.0)
    t.resumed_at(6)  # steps 1..6 were restored from a checkpoint
    assert t.steps_run(12) == 6
    assert t.samples_per_second(12, 2.0) == pytest.approx(6 * 64 / 2.0)
    assert t.elapsed(now=103.5) == pytest.approx(3.5)


COMMON = (
    "--model",
    "mlp",
    "--workers",
    "2",
    "--batch-size",
    "64",
    "--no-progress",
    "--timeout",
    "30",
)


@pytest.mark.timeout(300)  # two short training runs
def test_a_resumed_run_reports_the_rate_of_its_own_steps(tmp_path: Path) -> None:
    first, resumed = tmp_path / "first", tmp_path / "resumed"
    done = run_cli(
        "train", *COMMON, "--max-steps", "6", "--checkpoint-every", "6", "--out", str(first)
    )
    assert done.returncode == 0, done.stderr
    again = run_cli(
        "train", *COMMON, "--max-steps", "12", "--resume", str(first), "--out", str(resumed)
    )
    assert again.returncode == 0, again.stderr
    lines = [json.loads(x) for x in (resumed / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in lines if "loss" in r]
    assert [r["step"] for r in steps] == list(range(7, 13))
    for r in steps:  # samples/s x seconds = the samples of the steps run here (6 were restored)
        samples = r["samples_per_second"] * r["wall_seconds"]
        assert samples == pytest.approx((r["step"] - 6) * 64, rel=1e-6)
    summary = json.loads((resumed / "summary.json").read_text())
    train_seconds = summary["wall_seconds"] - summary["time_breakdown"]["eval"]
    # the restored steps would make this 12 x 64: twice the rate of the 6 steps run here
    assert summary["samples_per_second"] * train_seconds == pytest.approx(6 * 64, rel=1e-3)
