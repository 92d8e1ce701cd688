"""An α–β cost model of one training step for every strategy, from 2 to 10,000 nodes.

Why it is built so: a step is compute plus the communication that is not hidden
behind it (:mod:`disttrain.costing`: the shared terms). Each strategy's formula
lives in its own file (``Strategy.predict``); this module looks the strategy up
by name, so a new strategy with a ``predict`` is modelled here without an edit.

The API (the compare report and scripts call it)::

    from disttrain.lab import costmodel
    from disttrain.lab.calibration import Calibration

    net = costmodel.Network(alpha=5e-6, beta=8 / 25e9)      # 5 us, 25 Gbit/s
    work = costmodel.Workload(params=25_000_000, batch_size=8192)
    cal = Calibration.load(path)                             # or Calibration.defaults()
    p = costmodel.predict("allreduce:ring", work, nodes=256, network=net, calibration=cal)
    p.step_seconds, p.compute_seconds, p.comm_seconds, p.bytes_per_rank, p.reason
    costmodel.rank(costmodel.default_strategies(), work, 256, net, cal)   # fastest first

Strategies (``predict``'s first argument) are written in the one spec grammar of
``compare`` and ``advise`` (:mod:`disttrain.strategies.spec`), e.g.
``allreduce:ring``, ``ps:async:servers=4``, ``localsgd:8:algorithm=ring``,
``decentralized:topk:0.01`` (top-k at density 0.01), ``decentralized:onebit:density=0.01``
(one-bit's share of entries sent is set by the gradients, not by τ: the spec states it).
Only the settings a strategy's formula reads are accepted (its ``cost_settings``);
tensor parallelism and hybrids are not modelled (their errors say why).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from disttrain.comm.errors import UsageError
from disttrain.costing import (
    Network,
    Prediction,
    Rates,
    Workload,
    allreduce_seconds,
    bucket_sizes,
    compressed_bytes,
    compute_seconds,
)
from disttrain.strategies import STRATEGIES
from disttrain.strategies.spec import RunSpec, parse_one

__all__ = [
    "DEFAULT_STRATEGIES",  # noqa: F822  (computed when read: module __getattr__ below)
    "Network",
    "Prediction",
    "Workload",
    "allreduce_seconds",
    "bucket_sizes",
    "compressed_bytes",
    "compute_seconds",
    "default_strategies",
    "predict",
    "rank",
]


def default_strategies() -> tuple[str, ...]:
    """The specs ``disttrain advise`` ranks when none are named: each strategy's own rows."""
    return tuple(spec for _, cls in STRATEGIES.items() for spec in cls.advise_specs())


def __getattr__(name: str) -> Any:
    # DEFAULT_STRATEGIES is computed when read, so strategies and algorithms registered
    # later (plug-ins) are in it
    if name == "DEFAULT_STRATEGIES":
        return default_strategies()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def predict(
    strategy: str | RunSpec, work: Workload, nodes: int, network: Network, calibration: Rates
) -> Prediction:
    """The predicted step of ``strategy`` on ``nodes`` ranks; ValueError if it cannot be
    modelled (an unknown name or setting, or a strategy without a cost formula)."""
    if nodes < 1:
        raise ValueError(f"nodes must be at least 1, got {nodes}")
    label = strategy.label if isinstance(strategy, RunSpec) else strategy
    try:
        spec = strategy if isinstance(strategy, RunSpec) else parse_one(strategy, model=True)
        return STRATEGIES.get(spec.strategy).predict(spec, work, nodes, network, calibration)
    except (UsageError, ValueError) as exc:
        message = str(exc)  # one line naming the spec (the registry's names its strategy)
        named = repr(label) in message or message.startswith("--strategy ")
        raise ValueError(message if named else f"{label!r}: {message}") from None


def rank(
    strategies: Iterable[str | RunSpec],
    work: Workload,
    nodes: int,
    network: Network,
    calibration: Rates,
) -> list[Prediction]:
    """Every strategy's prediction, fastest step first."""
    preds = [predict(s, work, nodes, network, calibration) for s in strategies]
    return sorted(preds, key=lambda p: p.step_seconds)
