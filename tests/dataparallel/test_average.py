"""The one average helper: flatten -> sum -> divide -> copy back, bit for bit the plain formula."""

from __future__ import annotations

import pytest
import torch

from tests.harness import SharedWorlds


def _tensors(rank: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(10 + rank)
    return [
        torch.randn(3, 5, generator=g),
        torch.randn(7, generator=g),
        torch.randn(2, 2, 2, generator=g),
    ]


def _average(algorithm: str) -> list[torch.Tensor]:
    import torch.distributed as dist

    from disttrain.dataparallel.average import average

    mine = _tensors(dist.get_rank())
    shapes = [t.shape for t in mine]
    average(mine, algorithm)
    assert [t.shape for t in mine] == shapes  # copied back in place, shapes kept
    return mine


ALGORITHMS = ("native", "ring")
#: both in one world of 2 ranks (1 spawn instead of 2)
RUNS = SharedWorlds({a: (2, _average, (a,)) for a in ALGORITHMS}, timeout=120)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_average_is_the_sum_over_ranks_divided_by_their_number(algorithm: str) -> None:
    results = RUNS.get(algorithm)
    ranks = [_tensors(0), _tensors(1)]
    for i, got in enumerate(results[0]):
        # two addends: the sum is exact whatever the order, so the mean is bit-identical
        expected = (ranks[0][i] + ranks[1][i]) / 2
        assert torch.equal(got, expected)
        assert torch.equal(results[1][i], got)


def test_one_rank_or_nothing_is_left_alone() -> None:
    from disttrain.dataparallel.average import average

    t = [torch.ones(3)]
    average(t, world_size=1)  # no process group needed
    average([], world_size=4)
    assert torch.equal(t[0], torch.ones(3))
