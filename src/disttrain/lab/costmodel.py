"""An α–β cost model of one training step for every strategy, from 2 to 10,000 nodes.

Why it is built so: a step is compute plus the communication that is not hidden
behind it (:mod:`disttrain.costing`: the shared terms). Each strategy's formula
lives in its own cost part (``StrategyCost.predict``); this module looks the strategy up
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
Only the settings a strategy's formulas read are accepted (its ``cost_settings``);
the step of tensor parallelism and hybrids is not modelled (their errors say why),
their memory is.

Memory per worker (``predict_memory``) is each strategy's own formula too
(``StrategyCost.predict_memory``: a whole replica by default), on the model's layers: the
real model, or :func:`equal_layers` built from a parameter count (on the meta device,
so no memory is allocated)::

    costmodel.predict_memory("zero:3", work, 8, costmodel.equal_layers(work.params, 10))
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from torch import nn

from disttrain.collectives.costs import pricing_layout
from disttrain.comm.errors import UsageError
from disttrain.costing import (
    Memory,
    Network,
    NotModelled,
    Prediction,
    Question,
    Rates,
    Workload,
    allreduce_seconds,
    bucket_sizes,
    compressed_bytes,
    compute_seconds,
)
from disttrain.parallel import chain as chains
from disttrain.strategies import STRATEGIES
from disttrain.strategies.spec import RunSpec, parse_one

__all__ = [
    "DEFAULT_STRATEGIES",  # noqa: F822  (computed when read: module __getattr__ below)
    "Memory",
    "Network",
    "NotModelled",
    "Prediction",
    "Row",
    "Workload",
    "allreduce_seconds",
    "assess",
    "bucket_sizes",
    "compressed_bytes",
    "compute_seconds",
    "default_strategies",
    "equal_layers",
    "fitting",
    "memory_strategies",
    "predict",
    "predict_memory",
    "rank",
]


def default_strategies() -> tuple[str, ...]:
    """The specs ``disttrain advise`` ranks when none are named: each strategy's own rows."""
    return tuple(
        spec for _, kind in STRATEGIES.items() for spec in kind.cost_model().advise_specs()
    )


def memory_strategies() -> tuple[str, ...]:
    """The specs ``disttrain advise`` lists for their memory alone (no step-time formula)."""
    return tuple(
        spec for _, kind in STRATEGIES.items() for spec in kind.cost_model().memory_specs()
    )


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
        with pricing_layout(work.ranks_per_host):  # the workload's hosts, not this shell's
            cost = STRATEGIES.get(spec.strategy).cost_model()
            return cost.predict(Question(spec, work, nodes, network, calibration))
    except (UsageError, ValueError) as exc:
        raise _named(exc, label) from None


def _named(exc: Exception, label: str) -> ValueError:
    """``exc`` as one line naming the spec (the registry's names its strategy already);
    a NotModelled stays one, so a caller can tell it from a bad spec."""
    message = str(exc)
    named = repr(label) in message or message.startswith("--strategy ")
    kind = NotModelled if isinstance(exc, NotModelled) else ValueError
    return kind(message if named else f"{label!r}: {message}")


def predict_memory(strategy: str | RunSpec, work: Workload, nodes: int, model: nn.Module) -> Memory:
    """The bytes one of ``nodes`` workers of ``strategy`` holds training ``model`` (the
    fullest worker; ``work.params`` parameters, ``work.optimizer``, ``work.precision``);
    ValueError naming the spec if it cannot run so (more stages than layers, ...)."""
    if nodes < 1:
        raise ValueError(f"nodes must be at least 1, got {nodes}")
    label = strategy.label if isinstance(strategy, RunSpec) else strategy
    try:
        spec = strategy if isinstance(strategy, RunSpec) else parse_one(strategy, model=True)
        return STRATEGIES.get(spec.strategy).cost_model().predict_memory(spec, work, nodes, model)
    except (UsageError, ValueError) as exc:
        raise _named(exc, label) from None


def equal_layers(params: int, layers: int, nodes: int = 1) -> nn.Sequential:
    """A stand-in model of ``params`` parameters: ``layers`` equal square Linear layers with
    a ReLU between, on the meta device (shapes only), their width a multiple of ``nodes``
    (so tensor slicing splits them on any divisor of it). Each strategy's memory formula
    scales its share of this model to ``params`` exactly."""
    width = math.isqrt(max(params // max(layers, 1), 1)) // nodes * nodes or nodes
    parts: list[nn.Module] = []
    for i in range(layers):
        parts += [nn.Linear(width, width, device="meta")] + ([nn.ReLU()] if i < layers - 1 else [])
    return nn.Sequential(*parts)


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


@dataclass(frozen=True)
class Row:
    """One spec's row: its step (None: not modelled), its memory per worker (None: it
    cannot run so), why either is missing, and whether it fits (None: no limit given)."""

    label: str
    step: Prediction | None
    memory: Memory | None
    why: str = ""
    fits: bool | None = None


def assess(
    specs: Iterable[RunSpec],
    work: Workload,
    nodes: int,
    network: Network,
    calibration: Rates,
    model: nn.Module,
    limit: int | None = None,
) -> list[Row]:
    """Every spec's step and memory per worker (fitting in ``limit`` bytes, if given): the
    modelled rows fastest first, then those with memory alone. ValueError for a bad spec."""
    rows = []
    # the layers' work: what a pipeline's --balance list cuts (dense layers: work ∝ params;
    # an embedding's lookup does no arithmetic per parameter), and their paths, where its
    # --split-points cut
    layers, paths = _layers(model)
    sizes = tuple(_dense_params(layer) for layer in layers)
    work = replace(work, layer_params=sizes, layer_paths=paths)
    for spec in specs:
        why = ""
        try:
            step: Prediction | None = predict(spec, work, nodes, network, calibration)
        except NotModelled as exc:  # the cost part's own reason, without the spec's name
            reason = str(exc).removeprefix(f"{spec.label!r}: ")
            step, why = None, reason
        try:
            mem: Memory | None = predict_memory(spec, work, nodes, model)
        except ValueError as exc:  # it cannot run so: more stages than layers, ...
            message = str(exc).removeprefix(f"{spec.label!r}: ")
            # and so it has no step either (a pipeline's time assumes the stages exist)
            mem, step, why = None, None, f"cannot run so: {message}"
        fits = None if limit is None else mem is not None and mem.total <= limit
        rows.append(Row(spec.label, step, mem, why, fits))
    return sorted(rows, key=lambda r: (r.step is None, r.step.step_seconds if r.step else 0.0))


def _dense_params(layer: nn.Module) -> int:
    """Parameters of ``layer`` outside its embeddings (a tied head's are counted: it is a
    matrix product)."""
    looked_up = {
        id(p) for m in layer.modules() if isinstance(m, nn.Embedding) for p in m.parameters()
    }
    return sum(p.numel() for p in layer.parameters() if id(p) not in looked_up)


def _layers(model: nn.Module) -> tuple[list[nn.Module], tuple[str, ...] | None]:
    """The layers a pipeline cuts, and their paths: the model as a chain (an nn.Sequential,
    a transformers causal LM: parallel/chain.py), else its children (no paths)."""
    try:
        chain = chains.as_chain(model, "pipeline")
    except UsageError:
        return list(model.children()), None
    return list(chain.layers), tuple(chain.paths)


def fitting(rows: list[Row]) -> list[Row]:
    """The rows a recommendation may pick: modelled, and fitting where a limit is given."""
    return [r for r in rows if r.step is not None and r.fits is not False]
