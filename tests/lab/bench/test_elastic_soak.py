"""The soak bench's pure parts: its seeded event schedule and its every-step-once check."""

from __future__ import annotations

import pytest

from disttrain.lab.bench.elastic_soak import KINDS, Event, schedule, step_errors


def test_the_schedule_is_seeded_spaced_and_draws_both_kinds() -> None:
    plan = schedule(7, 50, 10)
    assert plan == schedule(7, 50, 10)  # the same seed, the same events
    assert plan != schedule(8, 50, 10)
    assert len(plan) == 50 and all(10 <= e.after <= 20 for e in plan)
    assert {e.kind for e in plan} == set(KINDS)
    assert schedule(0, 0, 10) == []
    assert isinstance(plan[0], Event)


@pytest.mark.parametrize(("events", "gap"), [(-1, 10), (3, 0)])
def test_a_bad_schedule_is_refused(events: int, gap: int) -> None:
    with pytest.raises(ValueError, match="events >= 0 and gap >= 1"):
        schedule(0, events, gap)


def test_step_errors_names_the_missing_and_the_repeated_steps() -> None:
    assert step_errors([1, 2, 3, 4], 4) == ([], [])
    assert step_errors([1, 2, 4], 4) == ([3], [])
    assert step_errors([1, 2, 2, 3, 4], 4) == ([], [2])
    assert step_errors([1, 2, 3, 4, 5], 4) == ([], [5])  # a step past the end is wrong too
    assert step_errors([], 2) == ([1, 2], [])
