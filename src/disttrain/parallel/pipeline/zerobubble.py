"""Zero-bubble pipelines (Qi et al., 2024): the backward split into B and W.

B is the gradient with respect to a stage's input (what stage s-1 waits for),
W the gradient with respect to its weights (nobody waits for it), so W can be
run later, in ticks that 1F1B leaves idle. Both schedules here are 1F1B's
order of F and B (``warmup`` forwards, then one F and one B in turn) with each
W put ``delay`` micro-batches after its B: stage s runs W(j) right after
B(j + delay), and the last ``delay`` Ws at the end, where the stage would
otherwise wait for the gradients coming back (:func:`split_order`). A stage
then holds ``warmup + 1 + delay`` micro-batches between F and W.

``zb1`` (ZB-H1): warm-up P-1-s, delay s. Every stage holds min(M, P)
micro-batches, stage 0 exactly 1F1B's P, so the pipeline's peak is 1F1B's
(stage s > 0 holds more than 1F1B's P-s, s of them only waiting for W: of
those the runner keeps only what W reads, the paper's M_W < M_B, ``split.py``). The step is
3M + P - 1 ticks for M >= P (3M busy), the paper's (P-1)(T_F + T_B - T_W)
idle at T_F = T_B = T_W: a third of 1F1B's 3(P-1). For M < P it is
2M + 2P - 1 (the last micro-batch's way there and back bounds it). With other
durations (W <= B <= F + W, W <= F, M >= P) the idle time per stage is
(P-1)(T_F + T_B - T_W), the paper's formula (``tests/.../test_schedule.py``).
No order with at most P-s micro-batches on stage s can do better than
3M + 2(P-1): the last stage, holding one, must run F B W F B W ..., and its
last B still has P-1 stages to go back through.

``zb2`` (ZB-H2): warm-up 2(P-1-s), delay 2s: min(M, 2P-1) held on every
stage (about twice 1F1B's on stage 0). Extra forwards fill stage 0's wait for
its first gradient and the last stage's W-tail covers the others' drain: a
parallelogram. In a synchronous step (the optimizer waits for every stage)
the last stage still cannot start before P-1 forwards have reached it, so the
step is 3M + P - 1 ticks at equal durations, as zb1's; what the extra memory
buys is the step at other durations: idle (P-1)(T_F + max(0, T_B - 2T_W))
against zb1's (P-1)(T_F + T_B - T_W) (M >= 2P-1). The paper's "zero" needs
the next step to start before this one's optimizer step (its post-validation).
For M < 2P-2 the extra forwards cannot all be placed; zb2 then runs zb1's order.

zb1, M=4, P=3 (``disttrain bench pipeline --show-schedule --schedule zb1``)::

    tick      1  2  3  4  5  6  7  8  9 10 11 12 13 14
    stage 1  F1 F2 F3  .  . B1 W1 F4 B2 W2 B3 W3 B4 W4
    stage 2   . F1 F2  . B1 F3 B2 W1 F4 B3 W2 B4 W3 W4
    stage 3   .  . F1 B1 F2 B2 F3 B3 W1 F4 B4 W2 W3 W4

zb2, M=6, P=3::

    tick      1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 16 17 18 19 20
    stage 1  F1 F2 F3 F4 F5 B1 W1 F6 B2 W2 B3 W3 B4 W4 B5 W5 B6 W6  .  .
    stage 2   . F1 F2 F3 B1 F4 B2 F5 B3 W1 F6 B4 W2 B5 W3 B6 W4 W5 W6  .
    stage 3   .  . F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 W1 F6 B6 W2 W3 W4 W5 W6
"""

from __future__ import annotations

from collections.abc import Callable

from disttrain.parallel.pipeline.schedule import SCHEDULES, Action, Grid, ScheduleKind, simulate

__all__ = ["split_order", "zb1", "zb2"]

Count = Callable[[int, int], int]  # (P, stage) -> micro-batches


def split_order(microbatches: int, stages: int, warmup: Count, delay: Count) -> Grid:
    """1F1B's F/B order on stage s (``warmup(P, s)`` forwards first) with W(j) right after
    B(j + ``delay(P, s)``) and the remaining Ws last; the grid of these orders."""
    m_count, p = microbatches, stages
    orders: list[list[Action]] = []
    for s in range(p):
        lag = delay(p, s)
        order = [Action("F", m, s) for m in range(min(warmup(p, s), m_count))]
        f = len(order)
        for j in range(m_count):
            if f < m_count:
                order.append(Action("F", f, s))
                f += 1
            order.append(Action("B", j, s))
            if j >= lag:
                order.append(Action("W", j - lag, s))
        order += [Action("W", k, s) for k in range(max(m_count - lag, 0), m_count)]
        orders.append(order)
    return simulate(orders)


def zb1(microbatches: int, stages: int) -> Grid:
    """ZB-H1: 1F1B's warm-up, W delayed by s on stage s; min(M, P) held on every stage."""
    return split_order(microbatches, stages, lambda p, s: p - 1 - s, lambda p, s: s)


def zb2(microbatches: int, stages: int) -> Grid:
    """ZB-H2: warm-up 2(P-1-s), W delayed by 2s; min(M, 2P-1) held (zb1's order if M < 2P-2)."""
    if microbatches < 2 * stages - 2:
        return zb1(microbatches, stages)
    return split_order(microbatches, stages, lambda p, s: 2 * (p - 1 - s), lambda p, s: 2 * s)


def _zb1_bubble(m: int, p: int, v: int) -> float:
    """(P-1) idle ticks for M >= P; the last micro-batch's round trip adds P-M below."""
    idle = p - 1 + max(0, p - m)
    return idle / (3 * m + idle)


SCHEDULES.add(
    "zb1",
    ScheduleKind(
        grid=lambda m, p, v: zb1(m, p),
        bubble=_zb1_bubble,
        held=lambda m, p, v, r: min(m, p),
        summary=(
            "B and W apart, 1F1B's peak (P on stage 0): (P-1)/(3M+P-1) idle (F = B = W, M >= P)"
        ),
        splits_backward=True,
        torch_anchor="ScheduleInterleavedZeroBubble",  # torch's ZB-H1 over interleaved stages
    ),
)


def _check_zb2(m: int, p: int, v: int) -> str:
    if m < p:
        return f"--schedule zb2 needs at least as many micro-batches as stages ({p}), got {m}"
    return ""


SCHEDULES.add(
    "zb2",
    ScheduleKind(
        grid=lambda m, p, v: zb2(m, p),
        bubble=lambda m, p, v: (p - 1) / (3 * m + p - 1),
        held=lambda m, p, v, r: min(m, 2 * p - 1) if m >= 2 * p - 2 else min(m, p),
        summary="B and W apart, up to 2P-1 held: (P-1)/(3M+P-1) idle at F = B = W, "
        "(P-1)(F + max(0, B-2W)) otherwise (M >= P)",
        splits_backward=True,
        check=_check_zb2,
        torch_anchor="ScheduleInterleavedZeroBubble",
    ),
)
