"""Reduce-scatter and all-gather (the allreduce's halves) of every algorithm, on 1-6 ranks.

Each rank's data is integer-valued, so every summation order gives the same
floats: results are compared exactly with torch's own collectives
(``dist.all_reduce`` then this rank's chunk; ``dist.all_gather`` of every rank's
data, then chunk r of rank r's), in fp32 and (up to 3 ranks) fp64. Lengths: empty,
fewer elements than ranks, one more than a multiple of n, and odd sizes (uneven
chunks). The meter must equal ``cost(..., op="reduce_scatter")`` / ``op="all_gather"``
exactly (length check off, so only the collective itself is counted).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from disttrain.collectives import ALGORITHMS
from tests.harness import run_world

DTYPES = [torch.float32, torch.float64]
#: The algorithms with halves of their own (their kinds say so); every other one goes through
#: the fallback.
OWN = tuple(n for n, kind in ALGORITHMS.items() if kind.shards)


def _lengths(n: int) -> list[int]:
    return sorted({0, 1, max(n - 1, 1), n + 1, 1001})


def _body(names: tuple[str, ...], lengths: tuple[int, ...]) -> list[str]:
    import torch.distributed as dist

    from disttrain import collectives
    from disttrain.collectives.chunks import chunk_bounds
    from disttrain.comm import meter

    collectives.set_length_check(False)
    me, n = dist.get_rank(), dist.get_world_size()
    checked = []
    for name in names or tuple(a for a in collectives.ALGORITHMS if a not in OWN):
        algo = collectives.get(name)
        for length in lengths or _lengths(n):
            for dtype in DTYPES if name in OWN and n <= 3 else DTYPES[:1]:
                gen = torch.Generator().manual_seed(length * 31 + me)
                x = torch.randint(-9, 10, (length,), generator=gen).to(dtype)
                a, b = chunk_bounds(length, n)[me]
                where = f"{name} n={n} length {length} {dtype}"
                # reduce-scatter: this rank's chunk of torch's allreduce
                expected = x.clone()
                dist.all_reduce(expected)
                meter.reset()
                got = algo.reduce_scatter(x.clone())
                assert torch.equal(got, expected[a:b]), where
                size = x.element_size()
                cost = algo.cost(length * size, n, me, size, op="reduce_scatter")
                sent = (meter.bytes_sent, meter.messages_sent)
                assert sent == (cost.bytes_sent, cost.messages), f"{where}: {sent} != {cost}"
                # all-gather: chunk r of rank r's data, from torch's all_gather of all data
                everyone = [torch.empty_like(x) for _ in range(n)]
                dist.all_gather(everyone, x)
                full = torch.cat(
                    [t[c:d] for t, (c, d) in zip(everyone, chunk_bounds(length, n), strict=True)]
                )
                mine = torch.full_like(x, float("nan"))  # the others' chunks must be filled
                mine[a:b] = x[a:b]
                meter.reset()
                algo.all_gather(mine)
                assert torch.equal(mine, full), where
                cost = algo.cost(length * size, n, me, size, op="all_gather")
                sent = (meter.bytes_sent, meter.messages_sent)
                assert sent == (cost.bytes_sent, cost.messages), f"{where}: {sent} != {cost}"
                checked.append(where)
    return checked


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
def test_halves_match_torch_and_their_cost(n: int) -> None:
    results: list[Any] = run_world(_body, n, args=(OWN, ()), timeout=120)
    assert len(results[0]) == len(_lengths(n)) * len(OWN) * (len(DTYPES) if n <= 3 else 1)


def test_fallback_halves_of_every_other_algorithm() -> None:
    # through the algorithm's own allreduce: the same results, an allreduce's cost each
    results: list[Any] = run_world(_body, 3, args=((), (2, 37)), timeout=120)
    assert len(results[0]) >= 2


def test_ring_halves_are_the_allreduce_cost() -> None:
    # reduce-scatter + all-gather = the allreduce, byte for byte over the ranks (the
    # halves give rank r chunk r; the allreduce's reduce-scatter leaves it chunk r+1)
    from disttrain import collectives

    ring = collectives.get("ring")
    for n in (2, 3, 5):
        for numel in (1, 7, 1001):
            whole = sum(ring.cost(numel * 4, n, r, 4).bytes_sent for r in range(n))
            halves = sum(
                ring.cost(numel * 4, n, r, 4, op="reduce_scatter").bytes_sent
                + ring.cost(numel * 4, n, r, 4, op="all_gather").bytes_sent
                for r in range(n)
            )
            assert halves == whole


def test_halves_refuse_a_tensor_that_is_not_flat() -> None:
    from disttrain import collectives

    with pytest.raises(ValueError, match="1-D contiguous"):
        collectives.get("ring").reduce_scatter(torch.zeros(2, 2))
