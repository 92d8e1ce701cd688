"""ZeRO's collectives on `native`: started without blocking, they equal the blocking halves
exactly and meter their cost; the layout's lengths, checked once at build, refuse ranks
whose groups differ (the steps' calls are not checked each).

Data are integer-valued, so every summation order gives the same floats (exact compare).
"""

from __future__ import annotations

from typing import Any

from tests.harness import run_world


def _started_equal_blocking() -> list[str]:
    import torch
    import torch.distributed as dist

    from disttrain import collectives
    from disttrain.collectives.chunks import chunk_bounds
    from disttrain.comm import meter

    native = collectives.get("native")
    me, n = dist.get_rank(), dist.get_world_size()
    checked = []
    for length in (1, n - 1, n + 1, 1001):  # fewer elements than ranks, uneven chunks
        gen = torch.Generator().manual_seed(length * 7 + me)
        x = torch.randint(-9, 10, (length,), generator=gen).float()
        blocking = native.reduce_scatter(x.clone(), checked=False)
        started = x.clone()
        meter.reset()
        assert isinstance(native, collectives.Starts)  # gloo's own threads run it
        work = collectives.start(native, "reduce_scatter", started, None)
        work.wait()
        cost = native.cost(length * 4, n, me, 4, op="reduce_scatter")
        assert (meter.bytes_sent, meter.messages_sent) == (cost.bytes_sent, cost.messages)
        lo, hi = chunk_bounds(length, n)[me]
        assert torch.equal(started[lo:hi], blocking), length
        mine = torch.full_like(x, float("nan"))
        mine[lo:hi] = x[lo:hi]
        want = native.all_gather(mine.clone(), checked=False)
        meter.reset()
        collectives.start(native, "all_gather", mine, None).wait()
        cost = native.cost(length * 4, n, me, 4, op="all_gather")
        assert (meter.bytes_sent, meter.messages_sent) == (cost.bytes_sent, cost.messages)
        assert torch.equal(mine, want) and not torch.isnan(mine).any(), length
        checked.append(f"length {length}")
    return checked


def test_started_halves_equal_the_blocking_ones_and_meter_their_cost() -> None:
    results: list[Any] = run_world(_started_equal_blocking, 3, timeout=120)
    assert results[0] == ["length 1", "length 2", "length 4", "length 1001"]


def _different_layouts() -> str:
    import torch
    import torch.distributed as dist
    from torch import nn

    from disttrain.comm import CollectiveMismatch
    from disttrain.dataparallel.zero import ZeroEngine

    width = 5 + dist.get_rank()  # rank 1 built another model
    params = [nn.Parameter(torch.zeros(width))]
    try:
        ZeroEngine([params], 2, "native", True, None)
    except CollectiveMismatch as exc:
        return str(exc)
    return ""


def test_ranks_with_different_groups_are_refused_when_the_engine_is_built() -> None:
    for message in run_world(_different_layouts, 2, timeout=120, collective_timeout=20):
        assert "zero-group/0 called with different lengths" in message
        assert "rank 0: 5" in message and "rank 1: 6" in message
