"""`disttrain bench pipeline`: the schedule printout, bad input, the measured bubble."""

from __future__ import annotations

import argparse

import pytest

from disttrain.cli import main
from disttrain.lab.bench import pipeline as bench_pipeline
from disttrain.parallel.pipeline import schedule
from tests.harness import run_world


def test_show_schedule_prints_both_diagrams(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["bench", "pipeline", "--show-schedule", "--stages", "3", "--microbatches", "4"]) == 0
    )
    out = capsys.readouterr().out
    assert "gpipe  M=4 P=3  bubble 0.333" in out
    assert "stage 1  F1 F2 F3 F4  .  .  .  . B1 B2 B3 B4" in out
    assert "stage 1  F1 F2 F3  .  . B1 F4 B2  . B3  . B4" in out  # 1F1B


def test_bad_numbers_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "pipeline", "--stages", "8"]) == 2
    assert "--stages 8" in capsys.readouterr().err
    assert main(["bench", "pipeline", "--microbatches", "3", "--batch", "16"]) == 2


def _ideal_times(grid: schedule.Grid, tick: float = 0.01) -> list[dict[str, float]]:
    """Each stage's StepTimes fields for ``grid`` run with every action taking one tick."""
    stages = []
    for s in range(len(grid[0])):
        ticks = [t for t, _ in schedule.stage_actions(grid, s)]
        compute = len(ticks) * tick
        end = (ticks[-1] + 1) * tick  # a stage's own step ends with its last action
        acts = [(a.kind, a.microbatch, tick) for _, a in schedule.stage_actions(grid, s)]
        stages.append(
            {
                "start": 0.0,
                "end": end,
                "step": end,
                "compute": compute,
                "compute_cpu": compute,
                "actions": acts,
            }
        )
    return stages


@pytest.mark.parametrize(("m", "p"), [(1, 2), (4, 2), (16, 2), (8, 3)])
def test_bubble_of_ideal_timings_is_the_formula(m: int, p: int) -> None:
    grid = schedule.gpipe(m, p)
    steps = _ideal_times(grid)
    got = bench_pipeline.bubble([[steps[s]] * 3 for s in range(p)])  # 3 identical steps
    assert got["measured"] == pytest.approx((p - 1) / (m + p - 1))
    assert got["instant_hand_offs"] == pytest.approx(got["measured"])
    assert got["preempted"] == 0.0
    # each stage's own step ends early on the last stages: that measure reads lower
    assert got["own_step"] < got["measured"]


def test_bubble_counts_preempted_compute() -> None:
    a = {
        "start": 0.0,
        "end": 1.0,
        "step": 1.0,
        "compute": 0.8,
        "compute_cpu": 0.6,
        "actions": [("F", 0, 0.3), ("B", 0, 0.5)],
    }
    b = {
        "start": 0.1,
        "end": 0.9,
        "step": 0.8,
        "compute": 0.4,
        "compute_cpu": 0.4,
        "actions": [("F", 0, 0.1), ("B", 0, 0.3)],
    }
    got = bench_pipeline.bubble([[a], [b]])
    # replayed: F0 on 0 (0.3), F0 on 1 (to 0.4), B0 on 1 (to 0.7), B0 on 0 (to 1.2)
    assert got["instant_hand_offs"] == pytest.approx(((1 - 0.8 / 1.2) + (1 - 0.4 / 1.2)) / 2)
    assert got["window"] == pytest.approx(1.0)
    assert got["measured"] == pytest.approx(((1 - 0.8) + (1 - 0.4)) / 2)
    assert got["preempted"] == pytest.approx(0.2 / 2)
    assert got["own_step"] == pytest.approx(((1 - 0.8) + (1 - 0.4 / 0.8)) / 2)


def _ours_small() -> dict[str, object]:
    a = argparse.Namespace(layers_per_stage=1, width=16, batch=8, repeats=3, unequal=False)
    return bench_pipeline._ours(a, "gpipe", 4)


def test_ours_reports_each_timed_step_on_one_clock() -> None:
    per_rank = run_world(_ours_small, 2, timeout=120)
    for r in per_rank:
        assert len(r["steps"]) == 3  # the two warm-up steps are left out
        for t in r["steps"]:
            assert t["start"] < t["end"] and 0 < t["compute"] <= t["end"] - t["start"]
            assert t["compute_cpu"] >= 0
            assert sorted(k for k, _, _ in t["actions"]) == ["B"] * 4 + ["F"] * 4
    got = bench_pipeline.bubble([r["steps"] for r in per_rank])
    assert 0 < got["measured"] < 1


def test_show_schedule_draws_the_new_schedules_with_their_theory(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [
        "bench",
        "pipeline",
        "--show-schedule",
        "--schedule",
        "interleaved,zb1,zb2",
        "--stages",
        "2",
        "--microbatches",
        "4",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "interleaved  M=4 P=2 V=2  bubble 0.111 (theory 0.111)" in out
    assert "zb1  M=4 P=2  bubble 0.077 (theory 0.077)  activations held per rank 2, 2" in out
    assert "stage 2   . F1 B1 F2 B2 W1 F3 B3 W2 F4 B4 W3 W4" in out
    assert main([*argv[:4], "interleaved", "--stages", "2", "--microbatches", "3"]) == 2
