"""Interleaved 1F1B (Narayanan et al., 2021, Megatron-LM): V virtual stages per rank.

The model is cut into P·V stages; rank p holds stages p, p+P, ..., p+(V-1)P
(its V *chunks*). A micro-batch's forward visits every rank V times, so the
fill and drain cost a chunk's time (1/V of a stage's) per rank instead of a
whole stage's: with every chunk action one tick the step is 2(MV + P - 1)
ticks for 2MV busy ones, an idle share of (P-1)/(MV+P-1), i.e. (P-1)/(V·M) of
the ideal time (1F1B: (P-1)/M). The price: V times the point-to-point messages,
and a deeper warm-up: rank p runs 2(P-p-1) + (V-1)P chunk forwards before its
first backward, holding up to that many chunks plus one, each 1/V of a
stage's activations (:func:`held`; rank 0: (2(P-1) + (V-1)P + 1)/V stages'
worth, against 1F1B's P).

Megatron's order: forwards go through the chunks in groups of P micro-batches
(micro-batches 1..P on chunk a, then 1..P on chunk b, ..., then P+1..2P on
chunk a), backwards the same with the chunks reversed; so M must be a multiple
of P. M=4, P=2, V=2 (``disttrain bench pipeline --show-schedule --schedule
interleaved --virtual-stages 2 --stages 2 --microbatches 4``)::

    tick      1    2    3    4    5    6    7    8    9   10   11   12   13   14   15   16   17   18
    stage 1 F1a  F2a  F1b  F2b  F3a  B1b  F4a  B2b  F3b  B1a  F4b  B2a    .  B3b    .  B4b  B3a  B4a
    stage 2   .  F1a  F2a  F1b  B1b  F2b  B2b  F3a  B1a  F4a  B2a  F3b  B3b  F4b  B4b  B3a  B4a    .
"""

from __future__ import annotations

from disttrain.parallel.pipeline.schedule import SCHEDULES, Action, Grid, ScheduleKind, simulate

__all__ = ["interleaved"]


def _chunk_order(k: int, ranks: int, chunks: int, backward: bool) -> tuple[int, int]:
    """(micro-batch, chunk) of a rank's k-th forward (or backward) in Megatron's order."""
    group = k // (ranks * chunks)
    chunk = (k // ranks) % chunks
    if backward:
        chunk = chunks - 1 - chunk
    return group * ranks + k % ranks, chunk


def check(microbatches: int, ranks: int, chunks: int) -> str:
    if chunks < 1:
        return f"--virtual-stages must be >= 1, got {chunks}"
    if ranks < 2:
        return "--schedule interleaved needs at least 2 pipeline stages (ranks)"
    if microbatches % ranks:
        return (
            f"--schedule interleaved needs --microbatches a multiple of the {ranks} stages "
            f"(micro-batches go round the ranks in groups of {ranks}), got {microbatches}"
        )
    return ""


def interleaved(microbatches: int, ranks: int, chunks: int) -> Grid:
    """Megatron's interleaved 1F1B: each rank's warm-up, steady 1F1B, cool-down over chunks."""
    why = check(microbatches, ranks, chunks)
    if why:
        raise ValueError(why)
    total = microbatches * chunks
    orders: list[list[Action]] = []
    for p in range(ranks):
        warmup = min((ranks - p - 1) * 2 + (chunks - 1) * ranks, total)

        def act(kind: str, k: int, p: int = p) -> Action:
            m, c = _chunk_order(k, ranks, chunks, backward=kind == "B")
            return Action("F" if kind == "F" else "B", m, c * ranks + p)

        order = [act("F", k) for k in range(warmup)]
        f, b = warmup, 0
        while b < total:
            if f < total:
                order.append(act("F", f))
                f += 1
            order.append(act("B", b))
            b += 1
        orders.append(order)
    return simulate(orders)


def held(microbatches: int, ranks: int, chunks: int, rank: int) -> float:
    """Stages' worth of activations rank ``rank`` holds at most: its warm-up plus one
    chunk forwards, 2(P-p-1) + (V-1)P + 1 (at most MV), each 1/V of a stage's."""
    return min((ranks - rank - 1) * 2 + (chunks - 1) * ranks + 1, microbatches * chunks) / chunks


SCHEDULES.add(
    "interleaved",
    ScheduleKind(
        grid=interleaved,
        bubble=lambda m, p, v: (p - 1) / (m * v + p - 1),
        held=held,
        summary="V chunks per rank: (P-1)/(MV+P-1) idle, i.e. (P-1)/(VM) of the ideal time",
        virtual=True,
        check=check,
        torch_anchor="ScheduleInterleaved1F1B",
    ),
)
