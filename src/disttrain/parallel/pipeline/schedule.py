"""Pipeline schedules as plain data: a tick x stage grid of forward/backward actions.

A schedule is ``grid[tick][stage]``: the :class:`Action` that ``stage`` runs
during ``tick``, or ``None`` when the stage idles (the bubble). Both schedules
are built by one small simulation: each stage has a fixed *order* of actions,
and at each tick runs its next one as soon as its inputs exist, i.e.

    F(m, s) needs F(m, s-1) done at an earlier tick (the activation),
    B(m, s) needs B(m, s+1) done at an earlier tick (the gradient) and F(m, s).

GPipe (Huang et al., 2019) orders all forwards, then all backwards ("fill,
then drain"); every stage holds the activations of all M micro-batches.
1F1B (PipeDream-flush, Narayanan et al., 2021) lets stage s run P-1-s warm-up
forwards, then alternate one forward with one backward, so it never holds more
than P-s micro-batches' activations. Both take 2(M+P-1) ticks for 2M busy ticks
per stage: the idle share of each stage is (P-1)/(M+P-1).

GPipe, M=4, P=3 (``render``)::

    tick      1  2  3  4  5  6  7  8  9 10 11 12
    stage 1  F1 F2 F3 F4  .  .  .  . B1 B2 B3 B4
    stage 2   . F1 F2 F3 F4  .  . B1 B2 B3 B4  .
    stage 3   .  . F1 F2 F3 F4 B1 B2 B3 B4  .  .
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "SCHEDULES",
    "Action",
    "Grid",
    "bubble_fraction",
    "build",
    "gpipe",
    "in_flight",
    "none",
    "one_f_one_b",
    "render",
    "replay",
    "stage_actions",
]


@dataclass(frozen=True, order=True)
class Action:
    """One unit of work: the forward (``F``) or backward (``B``) of a micro-batch on a stage."""

    kind: Literal["F", "B"]
    microbatch: int
    stage: int

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch + 1}"


Grid = list[list[Action | None]]


def _check(microbatches: int, stages: int) -> None:
    if microbatches < 1:
        raise ValueError(f"microbatches must be >= 1, got {microbatches}")
    if stages < 1:
        raise ValueError(f"stages must be >= 1, got {stages}")


def _simulate(orders: list[list[Action]]) -> Grid:
    """Run each stage's ``order`` greedily under the data dependencies; return the grid."""
    stages = len(orders)
    done: dict[tuple[str, int, int], int] = {}  # (kind, m, s) -> tick it ran
    nxt = [0] * stages
    grid: Grid = []
    tick = 0
    while any(nxt[s] < len(orders[s]) for s in range(stages)):
        row: list[Action | None] = [None] * stages
        for s in range(stages):
            if nxt[s] >= len(orders[s]):
                continue
            a: Action = orders[s][nxt[s]]
            if a.kind == "F":
                deps = [("F", a.microbatch, s - 1)] if s > 0 else []
            else:
                deps = [("F", a.microbatch, s)]
                if s < stages - 1:
                    deps.append(("B", a.microbatch, s + 1))
            if all(d in done and done[d] < tick for d in deps):
                row[s] = a
        for s, ran in enumerate(row):
            if ran is not None:
                done[(ran.kind, ran.microbatch, s)] = tick
                nxt[s] += 1
        if all(a is None for a in row):  # pragma: no cover  (orders are always feasible)
            raise RuntimeError("schedule deadlocked: an order violates the dependencies")
        grid.append(row)
        tick += 1
    return grid


def gpipe(microbatches: int, stages: int) -> Grid:
    """GPipe: every forward (fill), then every backward (drain), micro-batches in order."""
    _check(microbatches, stages)
    orders = [
        [Action("F", m, s) for m in range(microbatches)]
        + [Action("B", m, s) for m in range(microbatches)]
        for s in range(stages)
    ]
    return _simulate(orders)


def one_f_one_b(microbatches: int, stages: int) -> Grid:
    """1F1B (PipeDream-flush): warm-up forwards, then alternate F and B, then cool-down Bs."""
    _check(microbatches, stages)
    orders: list[list[Action]] = []
    for s in range(stages):
        warmup = min(stages - 1 - s, microbatches)
        order = [Action("F", m, s) for m in range(warmup)]
        f, b = warmup, 0
        while b < microbatches:
            if f < microbatches:
                order.append(Action("F", f, s))
                f += 1
            order.append(Action("B", b, s))
            b += 1
        orders.append(order)
    return _simulate(orders)


def none(microbatches: int, stages: int) -> Grid:
    """Plain layer placement: the whole batch as one micro-batch, each stage waiting its turn."""
    del microbatches  # the point of this baseline: no micro-batching at all
    return gpipe(1, stages)


#: ``--schedule NAME`` -> the function building its grid from (microbatches, stages).
SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b, "none": none}


def build(name: str, microbatches: int, stages: int) -> Grid:
    """The grid of the schedule called ``name`` (``gpipe``, ``1f1b`` or ``none``)."""
    try:
        return SCHEDULES[name](microbatches, stages)
    except KeyError:
        choices = ", ".join(SCHEDULES)
        raise ValueError(f"unknown schedule {name!r}; choose one of {choices}") from None


def replay(actions: list[list[tuple[str, int, float]]]) -> tuple[float, list[float]]:
    """The step time and each stage's busy time if every hand-off were instant.

    ``actions[s]`` is stage s's actions in the order it ran them, as (``F`` or
    ``B``, micro-batch, measured seconds). F(m) on s starts when s is free and
    F(m) on s-1 has ended; B(m) on s when s is free and B(m) on s+1 has ended.
    With every action one tick this gives the grid's 2(M+P-1) ticks; with
    measured durations, what it leaves above (P-1)/(M+P-1) is the stages'
    unequal compute, and what a measured step has above it is communication.
    """
    stages = len(actions)
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * stages
    nxt = [0] * stages
    while any(nxt[s] < len(actions[s]) for s in range(stages)):
        progressed = False
        for s in range(stages):
            if nxt[s] >= len(actions[s]):
                continue
            kind, m, seconds = actions[s][nxt[s]]
            dep = (kind, m, s - 1 if kind == "F" else s + 1)
            if 0 <= dep[2] < stages and dep not in done:
                continue  # its input is not computed yet
            free[s] = done[(kind, m, s)] = max(free[s], done.get(dep, 0.0)) + seconds
            nxt[s] += 1
            progressed = True
        if not progressed:
            raise ValueError("the stages' action orders wait on each other (not a schedule)")
    return max(free, default=0.0), [sum(a[2] for a in acts) for acts in actions]


def stage_actions(grid: Grid, stage: int) -> list[tuple[int, Action]]:
    """The (tick, action) pairs of one stage, in time order."""
    return [(t, row[stage]) for t, row in enumerate(grid) if row[stage] is not None]  # type: ignore[misc]


def bubble_fraction(grid: Grid) -> float:
    """Idle share of all stage-ticks: (P-1)/(M+P-1) for GPipe and 1F1B with equal ticks."""
    cells = sum(len(row) for row in grid)
    idle = sum(a is None for row in grid for a in row)
    return idle / cells if cells else 0.0


def in_flight(grid: Grid, stage: int) -> int:
    """The most micro-batches whose activations ``stage`` holds at once (forward done, not B)."""
    live = peak = 0
    for _, a in stage_actions(grid, stage):
        live += 1 if a.kind == "F" else -1
        peak = max(peak, live)
    return peak


def render(grid: Grid, by: Literal["stage", "microbatch"] = "stage") -> str:
    """The time diagram: one row per stage (F3 = forward of micro-batch 3), or, as in the
    seed text, one row per micro-batch naming the stage that works on it at each tick."""
    ticks = len(grid)
    stages = len(grid[0]) if grid else 0
    width = max(3, len(str(ticks)) + 1)
    lines = ["tick    " + "".join(f"{t + 1:>{width}}" for t in range(ticks))]
    if by == "stage":
        for s in range(stages):
            cells = [str(row[s]) if row[s] is not None else "." for row in grid]
            lines.append(f"stage {s + 1:<2}" + "".join(f"{c:>{width}}" for c in cells))
        return "\n".join(lines)
    micro = 1 + max((a.microbatch for row in grid for a in row if a is not None), default=-1)
    for m in range(micro):
        cells = []
        for row in grid:
            here = [a for a in row if a is not None and a.microbatch == m]
            cells.append(f"{here[0].kind}{here[0].stage + 1}" if here else ".")
        lines.append(f"mb {m + 1:<5}" + "".join(f"{c:>{width}}" for c in cells))
    return "\n".join(lines)
