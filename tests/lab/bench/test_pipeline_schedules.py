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
        (["--pairs", "zb1"], "write OURS/ANCHOR"),
        (["--pairs", "zb1/zigzag"], "unknown pipeline schedule"),
        (["--pairs", "gpipe/torch"], "torch has no counterpart of gpipe"),
    ],
)
def test_bad_input_is_one_line(argv: list[str], match: str, capsys: pytest.CaptureFixture[str]):
    assert main(["bench", "pipeline-schedules", *argv]) == 2
    assert match in capsys.readouterr().err


def _measured(name: str, m: int, p: int, v: int, seconds) -> list[dict]:
    """Three identical timed steps whose action a on rank r takes ``seconds(a, r, i)``
    (i: the action's position on its rank)."""
    grid = schedule.build(name, m, p, v)
    steps = [
        [
            (schedule.replay_kind(a, p), a.microbatch, seconds(a, r, i))
            for i, (_, a) in enumerate(schedule.stage_actions(grid, r))
        ]
        for r in range(p)
    ]
    return [{name: {"actions": [steps[r]] * 3, "step": 1.0, "peak": 0}} for r in range(p)]


@pytest.mark.parametrize("name", ["1f1b", "interleaved", "zb1", "zb2"])
def test_equal_measured_durations_replay_to_the_theory(name: str) -> None:
    p, v, m = 2, 2, 8
    vv = v if SCHEDULES.get(name).virtual else 1
    (row,) = bench._bubble_rows(_measured(name, m, p, vv, lambda a, r, i: 0.01), [name], m, p, v)
    for key in ("at_means", "stages", "replay", "per_step"):
        assert row[key] == pytest.approx(row["theory"]), key


def test_the_theory_to_compare_with_is_the_schedules_at_the_measured_ratio() -> None:
    # zb1 at F:B:W = 1:1.5:0.6 idles (P-1)(F+B-W) = 1.9 per rank (P = 2), not the F = B = W
    # share: @means is that formula, and the replay of such durations has no error
    p, m = 2, 8
    d = {"F": 1.0, "B": 1.5, "W": 0.6}
    (row,) = bench._bubble_rows(
        _measured("zb1", m, p, 1, lambda a, r, i: d[a.kind]), ["zb1"], m, p, 1
    )
    idle = (p - 1) * (d["F"] + d["B"] - d["W"])
    assert row["at_means"] == pytest.approx(idle / (idle + m * sum(d.values())))
    assert row["at_means"] != pytest.approx(row["theory"])
    assert row["replay"] == pytest.approx(row["at_means"])


def test_unequal_stages_and_jitter_are_told_apart() -> None:
    p, m = 2, 8

    def slow_last(a, r, i):  # rank 1 takes 1.3x; no jitter
        return 1.3 if r == 1 else 1.0

    (row,) = bench._bubble_rows(_measured("1f1b", m, p, 1, slow_last), ["1f1b"], m, p, 1)
    assert row["at_means"] == pytest.approx(row["theory"])  # F = B: the formula
    assert row["stages"] > row["at_means"]  # the imbalance
    assert row["replay"] == pytest.approx(row["stages"])  # no spread within a rank

    def jitter(a, r, i):  # equal ranks, every third action 1.5x: the same means per rank
        return 1.5 if i % 3 == 0 else 1.0

    (row,) = bench._bubble_rows(_measured("1f1b", m, p, 1, jitter), ["1f1b"], m, p, 1)
    assert row["stages"] == pytest.approx(row["at_means"], rel=0.05)
    assert row["replay"] > row["stages"]


def test_the_wall_bubble_is_measured_on_one_time_line_and_set_against_its_replay() -> None:
    # two ranks, one step: rank 0 computes F (1 s) from t=0, waits, B (1 s) ending at t=4.5;
    # rank 1 computes F and B (1 s each) from t=1.5 to t=3.5 (each hand-off 0.5 s late)
    wall = [
        [(0.0, 4.5, 2.0, [("F", 0, 1.0), ("B", 0, 1.0)])],
        [(1.5, 3.5, 2.0, [("F", 0, 1.0), ("B", 0, 1.0)])],
    ]
    per_rank = [{"1f1b": {"wall": w}} for w in wall]
    out = bench._wall(per_rank, "1f1b", 1)
    assert out["wall"] == pytest.approx(1 - 2 / 4.5)  # each rank computes 2 s of 4.5
    # with instant hand-offs: F0 0-1, F1 1-2, B1 2-3, B0 3-4: the late hand-offs are the rest
    assert out["wall_replay"] == pytest.approx(0.5)
