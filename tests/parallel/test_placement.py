"""Placement: balanced partitions, explicit lists, bad input."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from disttrain.comm.errors import UsageError
from disttrain.parallel.placement import (
    check_sequential,
    param_costs,
    parse_balance,
    partition,
    split,
    time_costs,
)


def _brute(costs: list[float], stages: int) -> float:
    n, best = len(costs), float("inf")
    for cuts in itertools.combinations(range(1, n), stages - 1):
        bounds = [0, *cuts, n]
        best = min(best, max(sum(costs[a:b]) for a, b in itertools.pairwise(bounds)))
    return best


@pytest.mark.parametrize("stages", [1, 2, 3, 4, 5])
def test_partition_is_the_minimax_split(stages: int) -> None:
    gen = torch.Generator().manual_seed(stages)
    costs = [float(v) for v in torch.randint(1, 100, (9,), generator=gen)]
    sizes = partition(costs, stages)
    assert len(sizes) == stages and sum(sizes) == 9 and min(sizes) >= 1
    bounds = [0, *itertools.accumulate(sizes)]
    worst = max(sum(costs[a:b]) for a, b in itertools.pairwise(bounds))
    assert worst == _brute(costs, stages)


def test_equal_layers_split_evenly_by_params() -> None:
    model = nn.Sequential(*(nn.Linear(8, 8) for _ in range(8)))
    assert partition(param_costs(list(model)), 4) == [2, 2, 2, 2]


def test_split_keeps_names_and_shares_layers() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    a, b = split(model, [2, 1])
    assert list(b.state_dict()) == ["2.weight", "2.bias"]
    assert b[0] is model[2] and a[0] is model[0]
    with pytest.raises(UsageError, match="add up to 3"):
        split(model, [1, 1])


def test_time_costs_measure_every_layer() -> None:
    model = nn.Sequential(nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, 2))
    costs = time_costs(list(model), torch.randn(32, 16))
    assert len(costs) == 3 and all(c > 0 for c in costs)
    assert all(p.grad is None for p in model.parameters())


def test_parse_balance_and_sequential_check() -> None:
    assert parse_balance("params") == "params"
    assert parse_balance("2/3/3") == parse_balance("2,3,3") == [2, 3, 3]  # a spec writes /
    assert parse_balance("2, 3,3") == [2, 3, 3]
    with pytest.raises(UsageError, match="at least one layer"):
        parse_balance("2,0")
    with pytest.raises(UsageError, match="params, time"):
        parse_balance("fast")
    with pytest.raises(UsageError, match=r"nn\.Sequential"):
        check_sequential(nn.Linear(2, 2), "pipeline")
