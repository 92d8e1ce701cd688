"""``dt.distribute(strategy=...)`` takes a strategy object as well as a name.

A ``Strategy`` class a script defines (not registered yet) is registered as ``@register``
would and trains: its own hook runs; the registry's own entry for a name
(``strategies.get("localsgd")``) takes the same steps as the name; anything else, a class
without a name or one named as another strategy is, is one line. One process each: a run
alone needs no launcher (a private store), and what is checked is the name's resolution.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import disttrain as dt
from disttrain import strategies
from disttrain.comm.errors import UsageError
from disttrain.strategies.allreduce import AllReduce


class CountingAllReduce(AllReduce):
    """An out-of-tree strategy: allreduce that counts its after-steps."""

    name: ClassVar[str] = "counting-allreduce"
    after: ClassVar[int] = 0

    def after_step(self, *args: Any, **kwargs: Any) -> Any:
        CountingAllReduce.after += 1
        return super().after_step(*args, **kwargs)


def _steps(strategy: object, **settings: Any) -> list[torch.Tensor]:
    """The parameters after 3 SGD steps of a small model on fixed data."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = dt.distribute(model, opt, strategy=strategy, **settings)  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        run.step(
            (torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g)),
            F.cross_entropy,
        )
    finished = run.finish()
    assert finished is not None
    return [p.detach().clone() for p in finished.parameters()]


@pytest.fixture
def _forget_counting() -> Any:
    yield
    strategies.STRATEGIES.remove(CountingAllReduce.name)


def test_a_scripts_own_strategy_class_is_registered_and_trains(_forget_counting: None) -> None:
    assert CountingAllReduce.name not in strategies.STRATEGIES.names()
    CountingAllReduce.after = 0
    got = _steps(CountingAllReduce)
    assert strategies.get(CountingAllReduce.name).runtime is CountingAllReduce
    assert CountingAllReduce.after == 3  # its own hook ran, once a step
    for a, b in zip(got, _steps("allreduce"), strict=True):  # and it is allreduce's mathematics
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert CountingAllReduce.after == 3  # allreduce's own run does not call it


def test_the_registrys_entry_takes_the_steps_of_its_name() -> None:
    by_kind, by_name = _steps(strategies.get("localsgd"), period=2), _steps("localsgd", period=2)
    for a, b in zip(by_kind, by_name, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_strategy_class_named_as_another_is_refused() -> None:
    class Impostor(AllReduce):
        name: ClassVar[str] = "zero"

    with pytest.raises(UsageError, match="named 'zero', which another strategy is registered as"):
        _steps(Impostor)


@pytest.mark.parametrize("given", [42, nn.Linear, object()])
def test_anything_else_is_one_line(given: object) -> None:
    with pytest.raises(
        UsageError, match="strategy must be a registered name or a Strategy class, got"
    ):
        _steps(given)
