"""Schedules as data: every action once, dependencies respected, bubble and memory bounds."""

from __future__ import annotations

import pytest

from disttrain.comm.errors import UsageError
from disttrain.parallel.pipeline import SCHEDULES
from disttrain.parallel.pipeline.schedule import (
    Action,
    Grid,
    bubble_fraction,
    build,
    gpipe,
    in_flight,
    none,
    one_f_one_b,
    render,
    replay,
    replay_kind,
    stage_actions,
)

SIZES = [(m, p) for m in (1, 2, 3, 4, 8, 16) for p in (1, 2, 3, 4)]


def _ticks_of(grid: Grid) -> dict[tuple[str, int, int], int]:
    out: dict[tuple[str, int, int], int] = {}
    for t, row in enumerate(grid):
        for s, a in enumerate(row):
            if a is not None:
                assert a.stage == s
                key = (a.kind, a.microbatch, s)
                assert key not in out, f"{key} scheduled twice"
                out[key] = t
    return out


@pytest.mark.parametrize("schedule", [gpipe, one_f_one_b])
@pytest.mark.parametrize(("m", "p"), SIZES)
def test_every_action_once_and_in_dependency_order(schedule, m: int, p: int) -> None:
    grid = schedule(m, p)
    ticks = _ticks_of(grid)
    assert len(ticks) == 2 * m * p
    for mb in range(m):
        for s in range(p):
            if s > 0:
                assert ticks[("F", mb, s - 1)] < ticks[("F", mb, s)]
            if s < p - 1:
                assert ticks[("B", mb, s + 1)] < ticks[("B", mb, s)]
            assert ticks[("F", mb, s)] < ticks[("B", mb, s)]


@pytest.mark.parametrize("schedule", [gpipe, one_f_one_b])
@pytest.mark.parametrize(("m", "p"), SIZES)
def test_length_and_bubble_match_the_formula(schedule, m: int, p: int) -> None:
    grid = schedule(m, p)
    assert len(grid) == 2 * (m + p - 1)
    assert bubble_fraction(grid) == pytest.approx((p - 1) / (m + p - 1))


@pytest.mark.parametrize(("m", "p"), SIZES)
def test_1f1b_bounds_activations_gpipe_holds_all(m: int, p: int) -> None:
    g, o = gpipe(m, p), one_f_one_b(m, p)
    for s in range(p):
        assert in_flight(g, s) == m
        assert in_flight(o, s) == min(m, p - s)


def test_gpipe_fills_then_drains() -> None:
    grid = gpipe(4, 3)
    assert [str(a) for a in (grid[t][0] for t in range(4))] == ["F1", "F2", "F3", "F4"]
    assert all(grid[t][0] is None for t in range(4, 8))
    assert grid[6][2] == Action("B", 0, 2)


def test_none_is_one_microbatch_walking_through_the_stages() -> None:
    grid = none(8, 3)
    assert len(grid) == 6
    assert build("none", 8, 3) == grid
    assert bubble_fraction(grid) == pytest.approx(2 / 3)


def test_render_is_the_time_diagram() -> None:
    text = render(gpipe(2, 2))
    assert text.splitlines() == [
        "tick      1  2  3  4  5  6",
        "stage 1  F1 F2  .  . B1 B2",
        "stage 2   . F1 F2 B1 B2  .",
    ]
    seed_style = render(gpipe(2, 2), by="microbatch").splitlines()
    assert seed_style[1].split() == ["mb", "1", "F1", "F2", ".", "B2", "B1", "."]


def test_bad_sizes_and_names() -> None:
    with pytest.raises(ValueError, match="microbatches"):
        gpipe(0, 2)
    with pytest.raises(ValueError, match="stages"):
        one_f_one_b(2, 0)
    with pytest.raises(UsageError, match="unknown pipeline schedule"):
        build("zigzag", 2, 2)


def _orders(grid: Grid, f: float = 1.0, b: float = 1.0) -> list[list[tuple[str, int, float]]]:
    """Each stage's actions in grid order, F taking ``f`` and B ``b`` seconds."""
    return [
        [(a.kind, a.microbatch, f if a.kind == "F" else b) for _, a in stage_actions(grid, s)]
        for s in range(len(grid[0]))
    ]


@pytest.mark.parametrize("schedule", [gpipe, one_f_one_b])
@pytest.mark.parametrize(("m", "p"), [(1, 2), (4, 2), (16, 2), (8, 3), (3, 4)])
def test_replay_of_unit_ticks_is_the_grid(schedule, m: int, p: int) -> None:
    grid = schedule(m, p)
    window, busy = replay(_orders(grid))
    assert window == len(grid) == 2 * (m + p - 1)
    assert busy == [2 * m] * p
    assert sum(1 - x / window for x in busy) / p == pytest.approx(bubble_fraction(grid))


@pytest.mark.parametrize(("m", "p"), [(1, 2), (4, 2), (16, 2), (8, 3)])
def test_gpipe_replay_with_slower_backward_keeps_the_formula(m: int, p: int) -> None:
    # equal stages with B = 2F: (M+P-1)(F+B) per step, (P-1)/(M+P-1) idle
    window, busy = replay(_orders(gpipe(m, p), f=1.0, b=2.0))
    assert window == pytest.approx((m + p - 1) * 3.0)
    assert sum(1 - x / window for x in busy) / p == pytest.approx((p - 1) / (m + p - 1))


def test_replay_of_a_slower_stage_idles_the_others_more() -> None:
    orders = _orders(gpipe(4, 2))
    orders[1] = [(k, mb, 1.5) for k, mb, _ in orders[1]]  # stage 1 takes 1.5x as long
    window, busy = replay(orders)
    # stage 0: F0..F3 (4), wait for stage 1's F3 (ends 1+4*1.5=7) and B0 (8.5), B0..B3
    # each after stage 1's: stage 1's B3 ends at 7+4*1.5=13, stage 0's B3 at 14
    assert window == pytest.approx(14.0)
    assert busy == [8.0, 12.0]


def test_replay_rejects_orders_that_wait_on_each_other() -> None:
    with pytest.raises(ValueError, match="wait on each other"):
        replay([[("B", 0, 1.0), ("F", 0, 1.0)], [("F", 0, 1.0), ("B", 0, 1.0)]])


# --- every registered schedule: the generic checks ------------------------------------
NEW = [("interleaved", 2), ("interleaved", 3), ("zb1", 1), ("zb2", 1)]
NEW_SIZES = [(m, p) for p in (2, 3, 4) for m in (p, 2 * p, 4 * p)]


def _all_ticks(grid: Grid) -> dict[tuple[str, int, int], int]:
    out: dict[tuple[str, int, int], int] = {}
    for t, row in enumerate(grid):
        for r, a in enumerate(row):
            if a is not None:
                assert a.stage % len(row) == r, "stage s runs on rank s mod P"
                key = (a.kind, a.microbatch, a.stage)
                assert key not in out, f"{key} scheduled twice"
                out[key] = t
    return out


@pytest.mark.parametrize(("name", "v"), NEW)
@pytest.mark.parametrize(("m", "p"), NEW_SIZES)
def test_new_schedules_run_every_action_once_after_its_inputs(name: str, v: int, m: int, p: int):
    kind = SCHEDULES.get(name)
    grid = build(name, m, p, v)
    ticks = _all_ticks(grid)
    kinds = "FBW" if kind.splits_backward else "FB"
    stages = p * v
    assert set(ticks) == {(k, mb, s) for k in kinds for mb in range(m) for s in range(stages)}
    for mb in range(m):
        for s in range(stages):
            if s > 0:
                assert ticks[("F", mb, s - 1)] < ticks[("F", mb, s)]
            if s < stages - 1:
                assert ticks[("B", mb, s + 1)] < ticks[("B", mb, s)]
            assert ticks[("F", mb, s)] < ticks[("B", mb, s)]
            if kind.splits_backward:
                assert ticks[("B", mb, s)] < ticks[("W", mb, s)]


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved", "zb1", "zb2"])
@pytest.mark.parametrize(("m", "p"), NEW_SIZES)
def test_each_schedule_holds_what_its_memory_formula_says(name: str, m: int, p: int) -> None:
    kind = SCHEDULES.get(name)
    grid = build(name, m, p, 2)
    v = 2 if kind.virtual else 1
    assert [in_flight(grid, r) for r in range(p)] == [kind.held(m, p, v, r) for r in range(p)]


def test_zb1_peak_is_1f1bs_and_zb2_and_interleaved_hold_more() -> None:
    for m, p in NEW_SIZES:
        o, z1, z2 = (build(n, m, p) for n in ("1f1b", "zb1", "zb2"))
        inter = build("interleaved", m, p, 2)
        # ZB-H1: stage 0, the pipeline's peak, holds what 1F1B's holds (P); the later
        # stages hold P too (1F1B: P-s): the price of delaying their Ws
        assert in_flight(z1, 0) == in_flight(o, 0) == min(m, p)
        assert max(in_flight(z1, r) for r in range(p)) == max(in_flight(o, r) for r in range(p))
        if m >= 2 * p - 2:
            assert in_flight(z2, 0) == min(m, 2 * p - 1) >= in_flight(o, 0)
        assert in_flight(inter, 0) >= in_flight(o, 0)


@pytest.mark.parametrize(("name", "v"), [("gpipe", 1), ("1f1b", 1), *NEW])
@pytest.mark.parametrize(("m", "p"), NEW_SIZES)
def test_replay_of_equal_durations_is_each_schedules_theoretical_bubble(
    name: str, v: int, m: int, p: int
) -> None:
    # every action (F, B or W; a chunk's for interleaved) takes one second
    kind = SCHEDULES.get(name)
    grid = build(name, m, p, v)
    orders = [
        [(replay_kind(a, p), a.microbatch, 1.0) for _, a in stage_actions(grid, r)]
        for r in range(p)
    ]
    window, busy = replay(orders, virtual=v)
    assert window == len(grid)
    idle = sum(1 - b / window for b in busy) / p
    assert idle == pytest.approx(kind.bubble(m, p, v), abs=1e-12)


def test_bubbles_shrink_as_the_papers_say() -> None:
    # in one F's time units (F = B = W): 1F1B idles 3(P-1) (its fused backward is B + W),
    # zb1 and zb2 P-1 (ZB-H1: (P-1)(F+B-W), a third of 1F1B's), interleaved (P-1)(F+B)/V
    m, p = 8, 4
    idle = {n: SCHEDULES.get(n).bubble(m, p, 2) for n in ("1f1b", "interleaved", "zb1", "zb2")}
    ticks = {n: len(build(n, m, p, 2)) for n in ("1f1b", "zb1", "zb2")}
    assert ticks["1f1b"] * 3 // 2 - 3 * m == 3 * (p - 1)  # a 1F1B tick is F or B+W: 1.5 F's
    assert ticks["zb1"] - 3 * m == ticks["zb2"] - 3 * m == p - 1
    assert idle["zb2"] == idle["zb1"] < idle["1f1b"]
    assert idle["interleaved"] < idle["1f1b"]
    assert idle["interleaved"] == pytest.approx((p - 1) / (m * 2 + p - 1))


def _replayed_idle(name: str, m: int, p: int, v: int, d: dict[str, float]) -> float:
    """Idle seconds per rank of ``name``'s grid, every action of a kind taking ``d[kind]``."""
    grid = build(name, m, p, v)
    orders = [
        [(replay_kind(a, p), a.microbatch, d[a.kind]) for _, a in stage_actions(grid, r)]
        for r in range(p)
    ]
    window, busy = replay(orders, virtual=v)
    return window - busy[0]


# (F, B, W) seconds: equal, the paper's usual W < B, a heavy forward, all in the regime
# W <= B <= F + W, W <= F where the closed forms below hold exactly
RATIOS = [(1.0, 1.0, 1.0), (1.0, 1.5, 0.6), (1.0, 1.2, 0.8), (2.0, 1.0, 1.0), (1.3, 1.9, 0.7)]


@pytest.mark.parametrize(("f", "b", "w"), RATIOS)
@pytest.mark.parametrize(("m", "p"), [(p * k, p) for p in (2, 3, 4, 5) for k in (2, 3, 4)])
def test_replay_at_other_durations_gives_the_papers_formulas(
    f: float, b: float, w: float, m: int, p: int
) -> None:
    d = {"F": f, "B": b, "W": w}
    # ZB-H1 (Qi et al. 2024, table 3): (P-1)(T_F + T_B - T_W)
    assert _replayed_idle("zb1", m, p, 1, d) == pytest.approx((p - 1) * (f + b - w))
    # ZB-H2 in a synchronous step: (P-1)(T_F + max(0, T_B - 2 T_W)) (paper: no max, no T_F
    # once the optimizer step is not waited for); M >= 2P-1
    assert _replayed_idle("zb2", m, p, 1, d) == pytest.approx((p - 1) * (f + max(0, b - 2 * w)))
    # 1F1B with the fused backward B + W; interleaved with chunk actions: (P-1)(F+B) each
    fused = {"F": f, "B": b + w}
    assert _replayed_idle("1f1b", m, p, 1, fused) == pytest.approx((p - 1) * (f + b + w))
    chunk = {"F": f / 2, "B": (b + w) / 2}
    assert _replayed_idle("interleaved", m, p, 2, chunk) == pytest.approx((p - 1) * (f + b + w) / 2)


def test_interleaved_and_zb_refuse_what_they_cannot_run() -> None:
    with pytest.raises(ValueError, match="multiple of the 4 stages"):
        build("interleaved", 6, 4, 2)
    with pytest.raises(ValueError, match="at least 2 pipeline stages"):
        build("interleaved", 4, 1, 2)
    with pytest.raises(ValueError, match="at least as many micro-batches as stages"):
        build("zb2", 2, 4)


def test_render_names_chunks_and_weight_passes() -> None:
    inter = render(build("interleaved", 2, 2, 2)).splitlines()
    assert inter[1].split()[2:6] == ["F1a", "F2a", "F1b", "F2b"]
    zb = render(build("zb1", 2, 2)).splitlines()
    assert "W1" in zb[1].split() and "W2" in zb[2].split()


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_each_torch_anchor_is_a_torch_pipelining_schedule(name: str) -> None:
    """The one map from our schedules to torch's (the benchmarks' anchors): each named class
    exists in torch.distributed.pipelining and is one of its schedules."""
    from torch.distributed.pipelining.schedules import _PipelineSchedule

    from disttrain.parallel.pipeline.schedule import torch_schedule_class

    kind = SCHEDULES.get(name)
    if not kind.torch_anchor:
        with pytest.raises(ValueError, match="no torch counterpart"):
            torch_schedule_class(name)
        return
    assert issubclass(torch_schedule_class(name), _PipelineSchedule)
