"""Pipeline schedules as plain data: a tick x rank grid of forward/backward actions.

A schedule is ``grid[tick][rank]``: the :class:`Action` that ``rank`` runs
during ``tick``, or ``None`` when the rank idles (the bubble). With one stage
per rank (GPipe, 1F1B, ZB-H1/H2) rank and stage are the same; interleaved
schedules cut the model into P·V stages and rank p holds stages p, p+P, ...
Every schedule is built by one small simulation: each rank has a fixed *order*
of actions, and at each tick runs its next one as soon as its inputs exist:

    F(m, s) needs F(m, s-1) done at an earlier tick (the activation),
    B(m, s) needs B(m, s+1) done at an earlier tick (the gradient) and F(m, s),
    W(m, s) needs B(m, s) (zero-bubble schedules split the backward: B is the
    input gradient only, W the weight gradient; elsewhere B is the whole backward).

Each schedule is one registered :class:`ScheduleKind` (``SCHEDULES``): its
grid builder, its bubble and activation-memory formulas, and its diagram.
New ones live in their own file (``interleaved.py``, ``zerobubble.py``).

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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from disttrain.registry import Registry

__all__ = [
    "SCHEDULES",
    "Action",
    "Grid",
    "ScheduleKind",
    "bubble_fraction",
    "build",
    "deps",
    "gpipe",
    "in_flight",
    "none",
    "one_f_one_b",
    "render",
    "replay",
    "simulate",
    "stage_actions",
]

Kind = Literal["F", "B", "W"]


@dataclass(frozen=True, order=True)
class Action:
    """One unit of work: forward ``F``, backward ``B`` (input gradient only where a ``W``
    follows) or weight gradient ``W`` of a micro-batch on a (model) stage."""

    kind: Kind
    microbatch: int
    stage: int

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch + 1}"


Grid = list[list[Action | None]]
#: (kind, micro-batch, stage) -> its dependencies, for a model of ``stages`` stages
Key = tuple[str, int, int]


def deps(kind: str, m: int, s: int, stages: int) -> list[Key]:
    """The actions that must end before ``kind`` of micro-batch ``m`` on stage ``s`` starts."""
    if kind == "F":
        return [("F", m, s - 1)] if s > 0 else []
    if kind == "W":
        return [("B", m, s)]
    return [("F", m, s)] + ([("B", m, s + 1)] if s < stages - 1 else [])


def _check(microbatches: int, stages: int) -> None:
    if microbatches < 1:
        raise ValueError(f"microbatches must be >= 1, got {microbatches}")
    if stages < 1:
        raise ValueError(f"stages must be >= 1, got {stages}")


def simulate(orders: list[list[Action]]) -> Grid:
    """Run each rank's ``order`` greedily under the data dependencies; return the grid.

    ``orders[r]`` is rank r's actions; a model of S stages on P ranks puts stage s
    on rank s mod P (one stage per rank when S = P).
    """
    ranks = len(orders)
    stages = 1 + max((a.stage for order in orders for a in order), default=-1)
    done: dict[Key, int] = {}  # (kind, m, s) -> tick it ran
    nxt = [0] * ranks
    grid: Grid = []
    tick = 0
    while any(nxt[r] < len(orders[r]) for r in range(ranks)):
        row: list[Action | None] = [None] * ranks
        for r in range(ranks):
            if nxt[r] >= len(orders[r]):
                continue
            a = orders[r][nxt[r]]
            if all(
                d in done and done[d] < tick for d in deps(a.kind, a.microbatch, a.stage, stages)
            ):
                row[r] = a
        for r, ran in enumerate(row):
            if ran is not None:
                done[(ran.kind, ran.microbatch, ran.stage)] = tick
                nxt[r] += 1
        if all(a is None for a in row):
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
    return simulate(orders)


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
    return simulate(orders)


def none(microbatches: int, stages: int) -> Grid:
    """Plain layer placement: the whole batch as one micro-batch, each stage waiting its turn."""
    del microbatches  # the point of this baseline: no micro-batching at all
    return gpipe(1, stages)


@dataclass(frozen=True)
class ScheduleKind:
    """One ``--schedule``: how to build its grid and what theory says of it.

    ``grid(M, P, V)`` builds the tick grid; ``bubble(M, P, V)`` is the idle share
    of the ranks' time with every action one tick (what :func:`replay` of equal
    durations must reproduce); ``held(M, P, V, rank)`` the most micro-batches'
    activations a rank holds at once, in units of one *stage's* activations (an
    interleaved chunk is 1/V of one). ``splits_backward``: B and W are separate
    actions; ``virtual``: reads ``--virtual-stages``; ``check(M, P, V)`` returns
    why the sizes are refused ('' when accepted); ``recv_ahead``: the runner posts
    each receive one action early (measured: ``runner.recv_ahead_default``);
    ``torch_anchor``: the ``torch.distributed.pipelining`` schedule class the benchmarks
    measure it against ('' none; :func:`torch_schedule_class`).
    """

    grid: Callable[[int, int, int], Grid]
    bubble: Callable[[int, int, int], float]
    held: Callable[[int, int, int, int], float]
    summary: str
    splits_backward: bool = False
    virtual: bool = False
    check: Callable[[int, int, int], str] = lambda m, p, v: ""
    recv_ahead: bool = False
    torch_anchor: str = ""


#: ``--schedule NAME`` -> its :class:`ScheduleKind`; a new schedule is one ``SCHEDULES.add``.
SCHEDULES = Registry[ScheduleKind]("pipeline schedule", flag="--schedule")
SCHEDULES.add(
    "gpipe",
    ScheduleKind(
        grid=lambda m, p, v: gpipe(m, p),
        bubble=lambda m, p, v: (p - 1) / (m + p - 1),
        held=lambda m, p, v, r: m,
        summary="fill then drain: (P-1)/(M+P-1) idle, every stage holds all M micro-batches",
        recv_ahead=True,
        torch_anchor="ScheduleGPipe",
    ),
)
SCHEDULES.add(
    "1f1b",
    ScheduleKind(
        grid=lambda m, p, v: one_f_one_b(m, p),
        bubble=lambda m, p, v: (p - 1) / (m + p - 1),
        held=lambda m, p, v, r: min(m, p - r),
        summary="one forward, one backward: (P-1)/(M+P-1) idle, stage s holds P-s",
        torch_anchor="Schedule1F1B",
    ),
)
SCHEDULES.add(
    "none",
    ScheduleKind(
        grid=lambda m, p, v: none(m, p),
        bubble=lambda m, p, v: (p - 1) / p,
        held=lambda m, p, v, r: 1,
        summary="the whole batch walks through the stages: (P-1)/P idle",
        recv_ahead=True,
    ),
)


def build(name: str, microbatches: int, stages: int, virtual: int = 1) -> Grid:
    """The grid of the schedule called ``name`` for M micro-batches on P ranks (V chunks each)."""
    kind = SCHEDULES.get(name)
    _check(microbatches, stages)
    why = kind.check(microbatches, stages, virtual)
    if why:
        raise ValueError(why)
    return kind.grid(microbatches, stages, virtual)


def replay(
    actions: list[list[tuple[str, int, float]]], virtual: int = 1
) -> tuple[float, list[float]]:
    """The step time and each rank's busy time if every hand-off were instant.

    ``actions[r]`` is rank r's actions in the order it ran them, as (kind,
    micro-batch, measured seconds) with kind ``F``, ``B`` or ``W``; with
    ``virtual`` V > 1 the kind carries the chunk (``F1`` is a forward of rank r's
    second chunk, stage r + P). Each action starts when its rank is free and its
    dependencies (:func:`deps`) have ended. With every action one tick this gives
    the grid's length; with measured durations, what it leaves above the
    schedule's bubble is the stages' unequal compute, and what a measured step
    has above it is communication.
    """
    ranks = len(actions)
    stages = ranks * virtual
    done: dict[Key, float] = {}
    free = [0.0] * ranks
    nxt = [0] * ranks
    while any(nxt[r] < len(actions[r]) for r in range(ranks)):
        progressed = False
        for r in range(ranks):
            if nxt[r] >= len(actions[r]):
                continue
            kind, m, seconds = actions[r][nxt[r]]
            s = r + ranks * (int(kind[1:]) if len(kind) > 1 else 0)
            need = deps(kind[0], m, s, stages)
            if any(d not in done for d in need):
                continue  # an input is not computed yet
            start = max([free[r], *(done[d] for d in need)])
            free[r] = done[(kind[0], m, s)] = start + seconds
            nxt[r] += 1
            progressed = True
        if not progressed:
            raise ValueError("the stages' action orders wait on each other (not a schedule)")
    return max(free, default=0.0), [sum(a[2] for a in acts) for acts in actions]


def stage_actions(grid: Grid, rank: int) -> list[tuple[int, Action]]:
    """The (tick, action) pairs of one rank, in time order."""
    return [(t, row[rank]) for t, row in enumerate(grid) if row[rank] is not None]  # type: ignore[misc]


def replay_kind(a: Action, ranks: int) -> str:
    """The kind :func:`replay` reads for ``a``: ``F``, or ``F1`` for a rank's second chunk."""
    chunk = a.stage // ranks
    return a.kind + (str(chunk) if chunk else "")


def bubble_fraction(grid: Grid) -> float:
    """Idle share of all rank-ticks: (P-1)/(M+P-1) for GPipe and 1F1B with equal ticks."""
    cells = sum(len(row) for row in grid)
    idle = sum(a is None for row in grid for a in row)
    return idle / cells if cells else 0.0


def in_flight(grid: Grid, rank: int) -> float:
    """The most micro-batches' activations ``rank`` holds at once, in stages' worth.

    A micro-batch's activations on a stage are held from its forward to its last
    backward action (W where the backward is split). An interleaved rank holds V
    stages of 1/V the size each: a chunk counts 1/V.
    """
    ranks = len(grid[0]) if grid else 1
    chunks = 1 + max((a.stage for row in grid for a in row if a is not None), default=0) // ranks
    split = any(a is not None and a.kind == "W" for row in grid for a in row)
    live = peak = 0
    for _, a in stage_actions(grid, rank):
        if a.kind == "F":
            live += 1
        elif a.kind == ("W" if split else "B"):
            live -= 1
        peak = max(peak, live)
    return peak / chunks


def render(grid: Grid, by: Literal["stage", "microbatch"] = "stage") -> str:
    """The time diagram: one row per rank (F3 = forward of micro-batch 3; an interleaved
    rank's chunks are told apart by a letter: F3a, F3b), or, as in the seed text, one row
    per micro-batch naming the stage that works on it at each tick."""
    ticks = len(grid)
    ranks = len(grid[0]) if grid else 0
    chunks = 1 + max((a.stage for row in grid for a in row if a is not None), default=0) // max(
        ranks, 1
    )

    def label(a: Action) -> str:
        return str(a) + ("abcdefgh"[a.stage // ranks] if chunks > 1 else "")

    width = max(3, len(str(ticks)) + 1, 5 if chunks > 1 else 0)
    lines = ["tick    " + "".join(f"{t + 1:>{width}}" for t in range(ticks))]
    if by == "stage":
        for s in range(ranks):
            cells = [label(row[s]) if row[s] is not None else "." for row in grid]  # type: ignore[arg-type]
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


def torch_schedule_class(name: str) -> Any:
    """The ``torch.distributed.pipelining`` class schedule ``name`` is measured against (its
    kind's ``torch_anchor``); ValueError if it has none."""
    import torch.distributed.pipelining as pipelining

    anchor = SCHEDULES.get(name).torch_anchor
    if not anchor:
        raise ValueError(f"--schedule {name} has no torch counterpart")
    return getattr(pipelining, anchor)
