"""`disttrain bench pipeline-schedules`: bad input, and the replayed bubble of ideal timings."""

from __future__ import annotations

import pytest

from disttrain.cli import main
from disttrain.lab.bench import pipeline_schedules as bench
from disttrain.parallel.pipeline import SCHEDULES, schedule


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--stages", "5"], "use 2 to 4"),
        (["--schedules", "zigzag"], "unknown pipeline schedule"),
        (["--microbatches", "3"], "multiple of --stages 2"),
    ],
)
def test_bad_input_is_one_line(argv: list[str], match: str, capsys: pytest.CaptureFixture[str]):
    assert main(["bench", "pipeline-schedules", *argv]) == 2
    assert match in capsys.readouterr().err


@pytest.mark.parametrize("name", ["1f1b", "interleaved", "zb1", "zb2"])
def test_equal_measured_durations_replay_to_the_theory(name: str) -> None:
    p, v, m = 2, 2, 8
    vv = v if SCHEDULES.get(name).virtual else 1
    grid = schedule.build(name, m, p, vv)
    steps = [
        [
            (schedule.replay_kind(a, p), a.microbatch, 0.01)
            for _, a in schedule.stage_actions(grid, r)
        ]
        for r in range(p)
    ]
    per_rank = [{name: {"actions": [steps[r]] * 3, "step": 1.0, "peak": 0}} for r in range(p)]
    (row,) = bench._bubble_rows(per_rank, [name], m, p, v)
    assert row["replay_measured"] == pytest.approx(row["theory"])
    assert row["replay_means"] == pytest.approx(row["theory"])
