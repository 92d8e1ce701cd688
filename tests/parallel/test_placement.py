"""Placement: balanced partitions, explicit lists, bad input."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from disttrain.comm.errors import UsageError
from disttrain.parallel.placement import (
    check_every_rank_trains,
    check_sequential,
    idle_ranks,
    owns_parameters,
    param_costs,
    parse_balance,
    partition,
    partition_layers,
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


def _flat_mlp() -> nn.Sequential:
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(4, 8),
        nn.ReLU(),
        nn.Linear(8, 8),
        nn.ReLU(),
        nn.Linear(8, 8),
        nn.ReLU(),
        nn.Linear(8, 2),
    )


def test_automatic_cuts_never_leave_a_stage_without_parameters() -> None:
    """A first Linear measured as slow as all the rest (a noisy timing) made the layer
    minimax give the Flatten a stage of its own, and rank 0 an empty optimizer."""
    owns = owns_parameters(list(_flat_mlp()))
    costs = [1e-6, 10.0, 1e-6, 1.0, 1e-6, 1.0, 1e-6, 1.0]
    assert idle_ranks(owns, partition(costs, 3), 3) == [0]  # what the plain minimax did
    for stages in (2, 3, 4):
        sizes = partition_layers(costs, owns, stages)
        assert sum(sizes) == 8 and idle_ranks(owns, sizes, stages) == []
    assert partition_layers(costs, owns, 3) == [3, 2, 3]  # the best of the cuts before Linears
    every = [True] * 8  # every layer owns parameters: the plain layer partition
    assert partition_layers(costs, every, 3) == partition(costs, 3)


def test_explicit_balance_with_an_idle_rank_is_refused_naming_one_that_trains() -> None:
    layers = list(_flat_mlp())
    with pytest.raises(UsageError, match=r"leaves rank 0 only .* try --balance 3,2,3"):
        check_every_rank_trains(layers, 3, 1, [1, 3, 4], "1,3,4")
    check_every_rank_trains(layers, 3, 1, [2, 3, 3], "2,3,3")
    # interleaved: rank 0 holds stages 0 and 2; a parameterless stage 0 is fine beside stage 2
    assert idle_ranks(owns_parameters(layers), [1, 2, 2, 3], 2) == []
    with pytest.raises(UsageError, match="4 layers with parameters for 5 pipeline ranks"):
        check_every_rank_trains(layers, 5, 1, "params", "params")
    # 2 ranks x 4 chunks of 8 layers: every cut, and rank 0 holds Flatten and three ReLUs;
    # params' own split cannot help, so the line names the count to lower, not a --balance
    with pytest.raises(UsageError, match="use at most 2 virtual stages"):
        check_every_rank_trains(layers, 2, 4, "params", "params")
    check_every_rank_trains(layers, 2, 2, "params", "params")
