"""Zero-bubble pipelines (Qi et al., 2024): the backward split into B and W.

B is the gradient with respect to a stage's input (what stage s-1 waits for),
W the gradient with respect to its weights (nobody waits for it). Running W
later fills ticks that 1F1B leaves idle. Both schedules here are built by one
greedy simulation with every action one tick: at each tick a stage runs its
next B if its gradient has arrived, else its next F if its memory allows and
its activation has arrived, else its oldest pending W.

``zb1`` (ZB-H1's memory): at most P-s micro-batches between F and W on stage
s, exactly 1F1B's activations (a micro-batch's tensors are freed by its W);
the step is 3M + 2(P-1) ticks for 3M busy ones: an idle share of
2(P-1)/(3M+2(P-1)), two thirds of 1F1B's (P-1)(F+B+W) idle time. (The paper's
ZB-H1 reaches one third by counting a micro-batch waiting for W as holding less
than one waiting for B; here both hold all its saved tensors.)

``zb2`` (ZB-H2's memory): at most P-s micro-batches waiting for B and 2P-1-s
waiting for W (about twice 1F1B's activations on stage 0); the step is
3M + P - 1 ticks for M >= P, an idle share of (P-1)/(3M+P-1), the least a
synchronous step allows (the last stage cannot start before P-1 forwards have
reached it). The paper's "zero" bubble needs the next step to start before this
one's optimizer step (its post-validation), which a synchronous step does not do.

zb1, M=4, P=3 (``disttrain bench pipeline --show-schedule --schedule zb1``)::

    tick      1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 16
    stage 1  F1 F2 F3  .  . B1 W1 F4 B2 W2  . B3 W3  . B4 W4
    stage 2   . F1 F2  . B1 W1 F3 B2 W2 F4 B3 W3  . B4 W4  .
    stage 3   .  . F1 B1 W1 F2 B2 W2 F3 B3 W3 F4 B4 W4  .  .

zb2, M=4, P=3::

    tick      1  2  3  4  5  6  7  8  9 10 11 12 13 14
    stage 1  F1 F2 F3  .  . B1 F4 B2 W1 B3 W2 W3 B4 W4
    stage 2   . F1 F2  . B1 F3 B2 F4 B3 W1 W2 B4 W3 W4
    stage 3   .  . F1 B1 F2 B2 F3 B3 W1 F4 B4 W2 W3 W4
"""

from __future__ import annotations

from collections.abc import Callable

from disttrain.parallel.pipeline.schedule import (
    SCHEDULES,
    Action,
    Grid,
    Key,
    ScheduleKind,
    deps,
    simulate,
)

__all__ = ["zb1", "zb2", "zero_bubble"]

Limit = Callable[[int, int], int]  # (P, stage) -> micro-batches


def zero_bubble(microbatches: int, stages: int, until_b: Limit, until_w: Limit) -> Grid:
    """The greedy split-backward schedule holding at most ``until_b(P, s)`` micro-batches
    between F and B and ``until_w(P, s)`` between F and W on stage s."""
    m_count, p = microbatches, stages
    done: dict[Key, int] = {}
    nxt = [{"F": 0, "B": 0, "W": 0} for _ in range(p)]
    orders: list[list[Action]] = [[] for _ in range(p)]
    tick = 0
    while any(n["W"] < m_count for n in nxt):
        row: list[Action | None] = [None] * p
        for s, n in enumerate(nxt):

            def ready(kind: str, s: int = s, n: dict[str, int] = n, tick: int = tick) -> bool:
                m = n[kind]
                return m < m_count and all(
                    d in done and done[d] < tick for d in deps(kind, m, s, p)
                )

            if ready("B"):
                row[s] = Action("B", n["B"], s)
            elif n["F"] - n["B"] < until_b(p, s) and n["F"] - n["W"] < until_w(p, s) and ready("F"):
                row[s] = Action("F", n["F"], s)
            elif n["W"] < n["B"]:
                row[s] = Action("W", n["W"], s)
        for s, a in enumerate(row):
            if a is not None:
                done[(a.kind, a.microbatch, s)] = tick
                nxt[s][a.kind] += 1
                orders[s].append(a)
        tick += 1
    return simulate(orders)  # the same grid, re-derived from the orders alone (a cross-check)


def zb1(microbatches: int, stages: int) -> Grid:
    """ZB-H1's memory: 1F1B's P-s micro-batches from F to W on stage s."""
    return zero_bubble(microbatches, stages, lambda p, s: p - s, lambda p, s: p - s)


def zb2(microbatches: int, stages: int) -> Grid:
    """ZB-H2's memory: P-s micro-batches waiting for B, 2P-1-s waiting for W, on stage s."""
    return zero_bubble(microbatches, stages, lambda p, s: p - s, lambda p, s: 2 * p - 1 - s)


SCHEDULES.add("zb1", ScheduleKind(
    grid=lambda m, p, v: zb1(m, p),
    bubble=lambda m, p, v: 2 * (p - 1) / (3 * m + 2 * (p - 1)),
    held=lambda m, p, v, r: min(m, p - r),
    summary="B and W apart, 1F1B's memory: 2(P-1)/(3M+2(P-1)) idle (F = B = W)",
    splits_backward=True,
))  # fmt: skip


def _check_zb2(m: int, p: int, v: int) -> str:
    if m < p:
        return f"--schedule zb2 needs at least as many micro-batches as stages ({p}), got {m}"
    return ""


SCHEDULES.add("zb2", ScheduleKind(
    grid=lambda m, p, v: zb2(m, p),
    bubble=lambda m, p, v: (p - 1) / (3 * m + p - 1),
    held=lambda m, p, v, r: min(m, 2 * p - 1 - r),
    summary="B and W apart, up to 2P-1-s held: (P-1)/(3M+P-1) idle (F = B = W, M >= P)",
    splits_backward=True,
    check=_check_zb2,
))  # fmt: skip
