"""``dt.distribute(strategy=...)`` takes a strategy object as well as a name.

A ``Strategy`` class a script defines (not registered yet) is registered as ``@register``
would and trains: its own hook runs; the registry's own entry for a name
(``strategies.get("localsgd")``) takes the same steps as the name; anything else, a class
without a name or one named as another strategy is, is one line. The runs train in a
one-rank world each (``run_world``): a run sets process-wide state (its group, the
collectives' checks), which must not leak into the test process; the refusals come before
any of it.
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
from tests.harness import run_world


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


def _own_class() -> tuple[bool, int, bool]:
    """In a rank: (registered as itself, its hook's count, equal to allreduce's steps)."""
    got = _steps(CountingAllReduce)
    registered = strategies.get(CountingAllReduce.name).runtime is CountingAllReduce
    after = CountingAllReduce.after
    same = all(torch.equal(a, b) for a, b in zip(got, _steps("allreduce"), strict=True))
    return registered, after, same and CountingAllReduce.after == after


def _kind_and_name() -> bool:
    by_kind, by_name = _steps(strategies.get("localsgd"), period=2), _steps("localsgd", period=2)
    return all(torch.equal(a, b) for a, b in zip(by_kind, by_name, strict=True))


def test_a_scripts_own_strategy_class_is_registered_and_trains() -> None:
    assert CountingAllReduce.name not in strategies.STRATEGIES.names()
    registered, after, same = run_world(_own_class, 1, timeout=120)[0]
    assert registered
    assert after == 3  # its own hook ran, once a step
    assert same  # allreduce's mathematics, and allreduce's own run does not call the hook


def test_the_registrys_entry_takes_the_steps_of_its_name() -> None:
    assert run_world(_kind_and_name, 1, timeout=120)[0]


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
