"""The four modes' rules, driven by a simulated clock (no processes, no sockets)."""

from __future__ import annotations

import heapq

import pytest

from disttrain.ps.consistency import Consistency, RelativeStaleness, staleness_lr_scale


def simulate(cons: Consistency, step_time: dict[int, float], budget: int) -> list[list[int]]:
    """Workers push after ``step_time[w]`` seconds of compute; return each update's workers."""
    cons.budget = budget
    events = [(t, w) for w, t in step_time.items()]
    heapq.heapify(events)
    updates: list[list[int]] = []
    while events and not cons.stopped:
        now, w = heapq.heappop(events)
        cons.receive(w)
        while (batch := cons.take_batch()) is not None:
            updates.append([e.worker for e in batch.entries])
        for r in cons.releasable():
            heapq.heappush(events, (now + step_time[r], r))
    while (batch := cons.take_batch()) is not None:  # the stop flushes what is buffered
        updates.append([e.worker for e in batch.entries])
    return updates


def test_sync_applies_one_mean_of_all_workers_per_round_with_zero_staleness() -> None:
    cons = Consistency("sync", (0, 1, 2))
    updates = simulate(cons, {0: 1.0, 1: 1.5, 2: 4.0}, budget=30)
    assert updates == [[0, 1, 2]] * 10
    assert dict(cons.staleness) == {0: 30}
    assert dict(cons.clock_gap) == {0: 30}


def test_sync_round_waits_for_the_slowest() -> None:
    cons = Consistency("sync", (0, 1))
    cons.receive(0)
    assert cons.take_batch() is None and cons.releasable() == []
    cons.receive(1)
    batch = cons.take_batch()
    assert batch is not None and [e.worker for e in batch.entries] == [0, 1]
    assert cons.releasable() == [0, 1]


def test_async_mean_staleness_is_close_to_n_minus_1_for_equal_workers() -> None:
    for n in (2, 4, 6):
        cons = Consistency("async", tuple(range(n)))
        # equal workers, slightly different phases so arrivals interleave
        simulate(cons, {w: 1.0 + 0.001 * w for w in range(n)}, budget=200 * n)
        total = sum(cons.staleness.values())
        mean = sum(k * v for k, v in cons.staleness.items()) / total
        assert abs(mean - (n - 1)) < 0.1, (n, dict(cons.staleness))


def test_ssp_never_lets_the_clock_gap_exceed_the_bound_but_async_does() -> None:
    times = {0: 1.0, 1: 1.0, 2: 1.0, 3: 4.0}  # worker 3 is a 4x straggler
    for bound in (0, 1, 3):
        cons = Consistency("ssp", (0, 1, 2, 3), staleness_bound=bound)
        simulate(cons, times, budget=200)
        assert max(cons.clock_gap) == bound  # reached, never exceeded
    free = Consistency("async", (0, 1, 2, 3))
    simulate(free, times, budget=200)
    assert max(free.clock_gap) > 3


def test_ssp_with_bound_zero_holds_everyone_until_the_round_is_complete() -> None:
    cons = Consistency("ssp", (0, 1), staleness_bound=0)
    cons.receive(0)
    assert cons.take_batch() is not None  # applied at once, as in async
    assert cons.releasable() == []  # but held: worker 1 has not pushed clock 0
    cons.receive(1)
    cons.take_batch()
    assert cons.releasable() == [0, 1]


def test_softsync_averages_exactly_s_gradients_per_update() -> None:
    for s in (1, 2, 3):
        cons = Consistency("softsync", (0, 1, 2, 3), softsync=s)
        updates = simulate(cons, {0: 1.0, 1: 1.3, 2: 1.7, 3: 4.0}, budget=120)
        assert all(len(u) == s for u in updates[:-1]), (s, updates)
        assert sum(len(u) for u in updates) == 120
        assert cons.version == len(updates)


def test_softsync_zero_means_all_workers_and_shrinks_to_the_live_ones() -> None:
    cons = Consistency("softsync", (0, 1, 2), softsync=0)
    for w in (0, 1):
        cons.receive(w)
    assert cons.take_batch() is None
    cons.drop(2)  # the third worker died: two gradients now make an update
    batch = cons.take_batch()
    assert batch is not None and len(batch.entries) == 2
    assert cons.lost == [2]


def test_staleness_lr_divides_by_the_mean_staleness_at_least_one() -> None:
    assert staleness_lr_scale([]) == 1.0
    assert staleness_lr_scale([0]) == 1.0
    assert staleness_lr_scale([1]) == 1.0
    assert staleness_lr_scale([4]) == 0.25
    assert staleness_lr_scale([2, 6]) == 0.25  # mean 4
    assert staleness_lr_scale([0, 1]) == 1.0  # mean 0.5 -> at least 1
    assert staleness_lr_scale([3, 3, 3]) == pytest.approx(1 / 3)


def test_a_dropped_worker_no_longer_holds_ssp_back() -> None:
    cons = Consistency("ssp", (0, 1), staleness_bound=0)
    cons.receive(0)
    cons.take_batch()
    assert cons.releasable() == []
    cons.drop(1)
    assert cons.releasable() == [0]
    with pytest.raises(ValueError):
        cons.receive(1)


def test_budget_stops_everyone_and_discards_late_gradients() -> None:
    cons = Consistency("async", (0, 1), budget=3)
    for w in (0, 1, 0):
        cons.receive(w)
        cons.take_batch()
    assert cons.stopped and cons.version == 3
    assert cons.receive(1) is None and cons.discarded == 1
    assert cons.take_batch() is None and cons.releasable() == [0, 1]


def test_rejected_gradient_ticks_the_clock_but_is_never_applied() -> None:
    cons = Consistency("sync", (0, 1))
    assert cons.receive(0, valid=False) is None
    cons.receive(1)
    batch = cons.take_batch()
    assert batch is not None and [e.worker for e in batch.entries] == [1]
    assert cons.releasable() == [0, 1] and cons.clocks == {0: 1, 1: 1}


def test_relative_staleness_keeps_the_mean_step_whatever_the_load() -> None:
    """async/ssp under --staleness-lr: the factors' mean stays 1 (the share applies on top)
    when every gradient gets staler together, and a stale push gets less than a fresh one."""
    quiet, loaded = RelativeStaleness(8), RelativeStaleness(8)
    for rel, base in ((quiet, 2), (loaded, 6)):  # load: every staleness three times as high
        got = [rel.factor([s]) for s in [base, base, base, 4 * base] * 4]
        assert got[-1] < got[-2]  # the straggler's stale push moves less
        assert sum(got[-8:]) / 8 == pytest.approx(1.0, rel=0.05)
    plain = [staleness_lr_scale([s]) for s in (2, 6)]
    assert plain[1] < plain[0] / 2  # the plain rule's steps shrank with the load
