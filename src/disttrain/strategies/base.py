"""The strategy interface: its runtime hooks, its descriptor, and the registry by name.

The trainer drives every strategy's runtime through the same points of a step:

    model = strategy.prepare_model(model, x)   # a shard of it, for model parallelism
    optimizer = make_optimizer(model.parameters())
    strategy.setup(model, optimizer)           # replicas made consistent
    each step:  before_step(strategy, step)    # capabilities.StepEvents (zero, ps, ...)
                loss = strategy.forward_backward(x, y)
                strategy.after_backward()      # data parallel: average gradients
                optimizer.step(); strategy.after_step(step)  # local SGD: average here
    strategy.finish(); model = strategy.eval_model()         # the whole model on rank 0

Override only the hooks you need (Bagua's pattern). Algorithm state lives in the
strategy and is saved through ``state_dict``; process groups never are.

A strategy registers a descriptor (:class:`StrategyKind`) of four parts, in its one file:

- the **runtime**: a :class:`Strategy` subclass, the hooks above and nothing else;
- its **settings**: a :class:`~disttrain.strategies.settings.StrategySettings` subclass
  (what it reads, its defaults, its pre-flight checks);
- its **cost**: the dotted name of a :class:`~disttrain.strategies.cost.base.StrategyCost`
  subclass in :mod:`disttrain.strategies.cost`, imported by the lab only
  (:meth:`StrategyKind.cost_model`), never by a worker;
- its **capabilities**: the classes of :mod:`disttrain.strategies.capabilities` its
  runtime also inherits (regroups, reshards, checkpoint-shaped state, ...), and its
  ``layout`` (:mod:`disttrain.strategies.layout`: who trains, who serves).

    @register(settings=ZeroSettings, cost="disttrain.strategies.cost.zero:ZeroCost")
    class Zero(Strategy, Reshards, SendsDuringBackward, ...):
        name = "zero"

A new strategy is one new file in this package (found by itself), or a plug-in module
named in ``$DISTTRAIN_PLUGINS``; a plug-in subclass registered with a bare ``@register``
keeps the parts of the strategy it extends.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, ClassVar, overload

import torch
from torch import nn

from disttrain import timeline
from disttrain.batch import call_model
from disttrain.comm.world import World
from disttrain.config import RunConfig
from disttrain.registry import Registry
from disttrain.strategies.layout import Layout
from disttrain.strategies.settings import StrategySettings
from disttrain.strategies.state import average_states, peak_rss_bytes, storage_bytes

if TYPE_CHECKING:
    from disttrain.strategies.cost.base import StrategyCost

__all__ = [
    "STRATEGIES",
    "Strategy",
    "StrategyKind",
    "average_states",
    "get",
    "peak_rss_bytes",
    "register",
    "storage_bytes",
]

LossFn = Any  # Callable[[Tensor, Tensor], Tensor]


class Strategy:
    """How data-parallel replicas (or model shards) agree: the step and state hooks only.

    Each hook has a plain default; ``self.roles`` is this process's instance of the
    strategy's layout (who trains, who serves)."""

    name: ClassVar[str]

    def __init__(self, config: RunConfig, world: World, loss_fn: LossFn) -> None:
        self.config = config
        self.world = world
        self.loss_fn = loss_fn
        #: how a batch's inputs call the model (:mod:`disttrain.batch`: ``model(**x)``
        #: for a dict); ``dt.distribute(forward=...)`` puts the user's own here
        self.model_call: Callable[[nn.Module, Any], Any] = call_model
        self.roles = get(self.name).layout(self)

    # --- the step ------------------------------------------------------------------
    def prepare_model(self, model: nn.Module, sample: Any) -> nn.Module:
        """The part of ``model`` this process holds (all of it, by default). ``sample``: a
        batch of the data set's inputs (the pipeline's ``--balance time`` times layers on
        it), handed over by the trainer: a strategy never loads data itself (None in a
        script's run, ``dt.distribute``, which has no data yet)."""
        del sample
        return model

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Make the replicas consistent before the first step."""
        self.model = model
        self.optimizer = optimizer

    def forward_backward(self, x: Any, y: Any) -> torch.Tensor:
        """Compute the loss of this process's batch shard and its gradients; return the loss.

        ``x`` is what the model is called with, ``y`` what the loss reads besides the
        output (:mod:`disttrain.batch`: tensors, or dicts of them)."""
        with timeline.span("forward"):
            loss = self.loss_fn(self.model_call(self.model, x), y)
        with timeline.span("backward"):
            loss.backward()
        return loss.detach()

    def after_backward(self) -> None:
        """Gradients are ready: make them what the optimizer should apply."""

    def after_step(self, step: int) -> None:
        """The optimizer has stepped (``step`` counts from 1)."""

    def finish(self) -> None:
        """Training is over on this worker (called on every worker)."""

    def eval_model(self) -> nn.Module | None:
        """The whole trained model on rank 0 (None elsewhere); called on every worker."""
        return self.model if self.world.rank == 0 else None

    # --- reporting and state ---------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Strategy-specific figures for summary.json (rank 0's view)."""
        return {}

    def step_metrics(self) -> dict[str, Any]:
        """Strategy-specific figures merged into each metrics.jsonl step line (rank 0's view)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """The strategy's own state for a checkpoint (error feedback, outer momentum ...)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state


@dataclass(frozen=True)
class StrategyKind:
    """What is registered under a strategy's name: its four parts (see the module's text)."""

    name: str
    runtime: type[Strategy]
    settings: type[StrategySettings] = StrategySettings
    #: "module:Class" of its cost part ("" : the plain one, not modelled)
    cost: str = ""
    layout: type[Layout] = Layout
    #: Activations or their gradients cross ranks within a step (model parallelism): a NaN
    #: made on one rank then reaches the others' gradients before backward ends, so
    #: ``--check-finite`` also checks each layer's output in forward.
    shares_activations: bool = False

    def build(self, config: RunConfig, world: World, loss_fn: LossFn) -> Strategy:
        """This process's runtime of the strategy."""
        return self.runtime(config, world, loss_fn)

    def cost_model(self) -> StrategyCost:
        """Its cost part, imported now (the lab's; a worker never calls this)."""
        path = self.cost or "disttrain.strategies.cost.base:StrategyCost"
        module, _, cls = path.partition(":")
        built: StrategyCost = getattr(importlib.import_module(module), cls)(self.name)
        return built

    def defaults_for(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """Its settings part's defaults (``config.choice_defaults`` asks every registry)."""
        return self.settings.defaults_for(settings)


#: Every strategy by name (``--strategy NAME``); an unknown name is a UsageError.
STRATEGIES: Registry[StrategyKind] = Registry("strategy", flag="--strategy")
#: The kind each registered runtime class was registered as (a plug-in's base's parts).
_KINDS: dict[type[Strategy], StrategyKind] = {}


@overload
def register(runtime: type[Strategy], /) -> type[Strategy]: ...


@overload
def register(
    *,
    settings: type[StrategySettings] | None = None,
    cost: str | None = None,
    layout: type[Layout] | None = None,
    shares_activations: bool | None = None,
) -> Callable[[type[Strategy]], type[Strategy]]: ...


def register(runtime: type[Strategy] | None = None, /, **parts: Any) -> Any:
    """Class decorator: make a strategy available as ``--strategy NAME``, with its parts
    (``settings=``, ``cost=``, ``layout=``, ``shares_activations=``); a part not given is
    the registered base class's (a plug-in extending a strategy), else the plain one."""

    def add(cls: type[Strategy]) -> type[Strategy]:
        base = next((_KINDS[b] for b in cls.__mro__[1:] if b in _KINDS), None)
        given = {k: v for k, v in parts.items() if v is not None}
        kind = StrategyKind(cls.name, cls, **given)
        if base is not None:  # every part not given is the base's (a field added later too)
            own = {"name", "runtime", *given}
            kept = {f.name: getattr(base, f.name) for f in fields(base) if f.name not in own}
            kind = replace(kind, **kept)
        STRATEGIES.add(cls.name, kind)
        _KINDS[cls] = kind
        return cls

    return add(runtime) if runtime is not None else add


def get(name: str) -> StrategyKind:
    """The strategy registered as ``name`` (UsageError listing the choices if none)."""
    return STRATEGIES.get(name)
