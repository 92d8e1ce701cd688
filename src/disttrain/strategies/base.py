"""The strategy interface (how replicas or model shards agree) and the registry by name.

The trainer drives every strategy through the same points of a step:

    model = strategy.prepare_model(model, x)   # a shard of it, for model parallelism
    optimizer = make_optimizer(model.parameters())
    strategy.setup(model, optimizer)           # replicas made consistent
    each step:  strategy.before_step(step)
                loss = strategy.forward_backward(x, y)
                strategy.after_backward()      # data parallel: average gradients
                optimizer.step(); strategy.after_step(step)  # local SGD: average here
                (or, for a step every worker skips on an fp16 overflow, instead of
                after_backward and what follows: strategy.skipped_step(step))
    strategy.finish(); model = strategy.eval_model()         # the whole model on rank 0

Override only the hooks you need (Bagua's pattern). Algorithm state lives in
the strategy and is saved through ``state_dict``; process groups never are.

Everything else about a strategy is declared on its class, in its own file:

- ``layout``: who trains, who serves, which ranks may be lost
  (:mod:`disttrain.strategies.layout`; the default: every process trains).
  ``strategy.roles`` is this process's instance of it.
- ``main_setting``: the setting a spec's positional value sets in ``compare`` and
  ``advise`` (``allreduce:ring`` is ``--algorithm ring``; grammar in
  :mod:`disttrain.strategies.spec`).
- ``predict``: its step time in the α–β cost model (:mod:`disttrain.costing`),
  ``cost_settings`` the spec settings that formula reads, ``advise_specs`` the rows
  ``disttrain advise`` ranks by default, ``assumptions`` the cost-model-only keys.
- ``predict_memory``: the bytes a worker holds (the default: a whole replica), the
  formula of what ``memory`` counts; ``memory_specs`` the rows ``advise`` lists for
  their memory alone (strategies without a step-time formula: pipeline, tensor).

A new strategy is one new file in this package (found by itself), or a plug-in
module named in ``$DISTTRAIN_PLUGINS``, whose class is decorated with ``@register``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn
from torch.distributed import ProcessGroup

from disttrain import collectives, timeline
from disttrain.comm.errors import UsageError
from disttrain.comm.world import World
from disttrain.config import RunConfig, field_names
from disttrain.costing import (
    Memory,
    Network,
    NotModelled,
    Prediction,
    Rates,
    Workload,
    worker_memory,
)
from disttrain.dataparallel.fusion import FlatBucket
from disttrain.registry import Registry
from disttrain.strategies.layout import Layout

if TYPE_CHECKING:
    from disttrain.strategies.runspec import RunSpec

__all__ = [
    "STRATEGIES",
    "Strategy",
    "average_states",
    "get",
    "peak_rss_bytes",
    "register",
    "storage_bytes",
]

LossFn = Any  # Callable[[Tensor, Tensor], Tensor]


class Strategy:
    """How data-parallel replicas (or model shards) agree; each hook has a plain default."""

    name: ClassVar[str]
    #: Who trains, who serves, which ranks may be lost (``roles`` is this process's).
    layout: ClassVar[type[Layout]] = Layout
    #: The setting a spec's positional value sets (``localsgd:16`` -> period); None: none.
    main_setting: ClassVar[str | None] = None
    #: The spec settings ``predict`` and ``predict_memory`` read; any other in an ``advise``
    #: spec is refused.
    cost_settings: ClassVar[tuple[str, ...]] = ()
    #: Cost-model-only spec keys (``advise``): name -> what it states.
    assumptions: ClassVar[dict[str, str]] = {}
    #: Why ``predict`` cannot model this strategy (the default ``predict`` says it).
    not_modelled: ClassVar[str] = "it has no cost formula (no predict method)"
    #: True if gradients are reduced by hooks while backward runs (overlap): under fp16
    #: the trainer then unscales after ``after_backward`` instead of before it.
    communicates_during_backward: bool = False
    #: True if activations or their gradients cross ranks within a step (model
    #: parallelism): a NaN made on one rank then reaches the others' gradients before
    #: backward ends, so ``--check-finite`` also checks each layer's output in forward.
    shares_activations: ClassVar[bool] = False
    #: The settings this strategy reads beyond the always-read ones (``TrainConfig``,
    #: ``DataConfig``): section classes (all their fields) and single field names.
    #: Pre-flight refuses any other setting changed from its default.
    reads_settings: ClassVar[tuple[type[Any] | str, ...]] = ()
    #: Defaults of its own for settings it reads (``{"optimizer": "adam"}``); a given flag
    #: or TOML key wins (``config.choice_defaults``).
    setting_defaults: ClassVar[dict[str, Any]] = {}

    @classmethod
    def defaults_for(cls, settings: Mapping[str, Any]) -> dict[str, Any]:
        """Its defaults given the run's settings so far (a mode of its own may want its
        own: ps softsync's ``staleness_lr``); :attr:`setting_defaults` unless overridden."""
        return dict(cls.setting_defaults)

    def __init__(self, config: RunConfig, world: World, loss_fn: LossFn) -> None:
        self.config = config
        self.world = world
        self.loss_fn = loss_fn
        self.roles = self.layout(self)

    @classmethod
    def settings_not_read(cls, config: RunConfig) -> dict[str, str]:
        """Declared settings that ``config``'s other settings make this strategy ignore, each
        with the reason, e.g. ``{"fusion_mb": "with --compression topk:0.01"}``."""
        del config
        return {}

    @classmethod
    def reads(cls, config: RunConfig) -> set[str]:
        """The settings a run of this strategy with ``config`` reads (always-read ones aside):
        its own, and the chosen algorithm's when it reads ``--algorithm``."""
        names = field_names(cls.reads_settings) - set(cls.settings_not_read(config))
        if "algorithm" in names and config.train.algorithm in collectives.ALGORITHMS:
            names |= set(collectives.get(config.train.algorithm).reads_settings)
        return names

    @classmethod
    def validate_config(cls, config: RunConfig, model: nn.Module) -> None:
        """Raise UsageError for settings this strategy cannot run; called before any process starts.

        By default each worker gets 1/world of every global batch, so the batch
        must split evenly. Strategies whose ranks share one batch override this.
        """
        del model
        world = config.train.world_size
        if config.train.batch_size % world:
            raise UsageError(
                f"--batch-size {config.train.batch_size} is not divisible by the {world} "
                f"workers: use a multiple of {world}"
            )

    # --- data sharding ------------------------------------------------------------
    @property
    def data_rank(self) -> int:
        """This process's index among the data-parallel shards of each global batch."""
        return self.world.rank

    @property
    def data_world_size(self) -> int:
        """How many shards each global batch is split into."""
        return self.world.world_size

    @property
    def worker_group(self) -> ProcessGroup | None:
        """The group of all worker processes (None: the whole world)."""
        return None

    # --- the step ------------------------------------------------------------------
    def prepare_model(self, model: nn.Module, sample: torch.Tensor) -> nn.Module:
        """The part of ``model`` this process holds (all of it, by default). ``sample``: a
        batch of the data set's inputs (the pipeline's ``--balance time`` times layers on
        it), handed over by the trainer: a strategy never loads data itself."""
        return model

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Make the replicas consistent before the first step."""
        self.model = model
        self.optimizer = optimizer

    def before_step(self, step: int) -> None:
        """Step ``step`` (from 1) begins; nothing of it is computed yet."""

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Compute the loss of this process's batch shard and its gradients; return the loss."""
        with timeline.span("forward"):
            loss = self.loss_fn(self.model(x), y)
        with timeline.span("backward"):
            loss.backward()
        return loss.detach()

    def after_backward(self) -> None:
        """Gradients are ready: make them what the optimizer should apply."""

    def check_before_send(self, check: Callable[[FlatBucket], None]) -> bool:
        """Have ``check`` run on each gradient bucket just before it is sent during backward;
        False if this strategy sends none then (the trainer checks after backward)."""
        del check
        return False

    def after_step(self, step: int) -> None:
        """The optimizer has stepped (``step`` counts from 1)."""

    def skipped_step(self, step: int) -> None:
        """Every worker skips step ``step`` (an fp16 overflow, agreed): no ``after_backward``,
        optimizer step nor ``after_step`` for it."""

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

    def memory(self) -> dict[str, int]:
        """Bytes this worker holds now (``memory_per_rank`` in summary.json).

        Counted from the tensors, each storage once (a gradient that is a view of a
        fusion bucket counts the bucket): ``parameters`` (the model's and the
        optimizer's), ``gradients`` (their ``.grad``), ``optimizer_state`` (every
        tensor in the optimizer's state), ``gathered_peak`` (parameter bytes gathered
        at once; 0 unless parameters are sharded) and ``peak_rss`` (the process's peak
        resident memory). The default fits every strategy that holds plain tensors.
        """
        params: list[torch.Tensor] = list(self.model.parameters())
        params += [p for g in self.optimizer.param_groups for p in g["params"]]
        state = [t for s in self.optimizer.state.values() for t in s.values()]
        return {
            "parameters": storage_bytes(params),
            "gradients": storage_bytes([p.grad for p in params if p.grad is not None]),
            "optimizer_state": storage_bytes([t for t in state if isinstance(t, torch.Tensor)]),
            "gathered_peak": 0,
            "peak_rss": peak_rss_bytes(),
        }

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state

    def replicated_state(self) -> set[str]:
        """Paths of this worker's checkpoint state (the trainer's per-worker dict:
        ``/model/<name>``, ``/optimizer``, ...) that are equal on every worker of
        :attr:`worker_group`: each worker writes 1/N of them (none by default)."""
        return set()

    def model_state_dict(self) -> dict[str, Any]:
        """The model's entry of this worker's checkpoint (default: its whole ``state_dict``;
        a strategy whose parameters live elsewhere between steps saves them itself)."""
        return self.model.state_dict()

    def load_model_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the model's entry of :meth:`model_state_dict` (after ``load_state_dict``)."""
        self.model.load_state_dict(state)

    @classmethod
    def check_resume(cls, config: RunConfig, model: nn.Module, state: dict[str, Any]) -> None:
        """Raise UsageError if a checkpoint whose worker 0 saved ``state`` cannot resume a
        run of ``config`` (pre-flight, before any process starts); by default any can."""
        del config, model, state

    #: True if the survivors of a lost worker go on without it (``--min-workers``, live
    #: shrink: :mod:`disttrain.train.shrink`): the strategy then implements ``regroup``.
    shrinks: ClassVar[bool] = False
    #: True if a worker may join the running job (``--max-workers``, live grow:
    #: :mod:`disttrain.train.grow`): ``regroup`` then also takes a group of more workers.
    grows: ClassVar[bool] = False

    def abandon_step(self) -> None:
        """A peer failed during a step: stop this step's communication (threads, queued
        sends) before the process group is dropped (``shrinks`` strategies only)."""

    def regroup(self, world: World) -> None:
        """The job lost workers during a step: rebuild what depends on the process group
        for ``world`` (the survivors' new group). Called between steps on every survivor,
        before the interrupted step is run again; only when ``shrinks`` is True."""
        raise NotImplementedError(f"{self.name} does not go on without a lost worker")

    #: True if a checkpoint written by N workers resumes on M (through ``reshard``);
    #: False: pre-flight refuses another worker count (exit 2), as for a model split
    #: into stages or shards whose layout depends on the number of ranks.
    reshards: ClassVar[bool] = False

    @classmethod
    def reshard(
        cls, read: Callable[[int], dict[str, Any]], old_world: int, rank: int, world: int
    ) -> dict[str, Any]:
        """Worker ``rank``'s state among ``world`` workers from a checkpoint of ``old_world``.

        ``read(j)`` loads old worker j's state: the trainer's per-worker dict (``model``,
        ``optimizer``, ``strategy`` (this class's ``state_dict``), ``scaler``, ``rng``,
        ``step``). Called only when ``reshards`` is True. The default suits per-worker
        replicas (local SGD, gossip): every new worker starts from the average of all
        old workers' states (:func:`average_states`).
        """
        del rank, world
        return average_states([read(j) for j in range(old_world)])

    # --- the cost model (``disttrain advise``) ------------------------------------
    @classmethod
    def advise_specs(cls) -> list[str]:
        """The specs ``disttrain advise`` ranks when none are named (none: not modelled)."""
        return []

    @classmethod
    def predict(
        cls, spec: RunSpec, work: Workload, nodes: int, network: Network, calibration: Rates
    ) -> Prediction:
        """The predicted step of ``spec`` on ``nodes`` ranks; NotModelled if not modelled."""
        del spec, work, nodes, network, calibration
        raise NotModelled(f"{cls.name} is not modelled: {cls.not_modelled}")

    @classmethod
    def memory_specs(cls) -> list[str]:
        """Specs ``disttrain advise`` lists for their memory alone (no step-time formula)."""
        return []

    @classmethod
    def predict_memory(cls, spec: RunSpec, work: Workload, nodes: int, model: nn.Module) -> Memory:
        """The bytes the fullest of ``nodes`` workers holds training ``model`` (its layers;
        ``work.params`` parameters in all), the figures :meth:`memory` counts; ValueError
        if ``spec`` cannot run so. The default: every worker a whole replica, 4Ψ
        parameters + 4Ψ gradients + the optimizer's state (Adam 8Ψ: 16Ψ in all)."""
        del spec, nodes, model
        return worker_memory(work, work.params)


def storage_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views of one buffer count it once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        if storage.nbytes():
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def peak_rss_bytes() -> int:
    """This process's peak resident set size (``getrusage``: KiB on Linux, bytes on macOS)."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def average_states(states: list[Any]) -> Any:
    """The element-wise mean of equally shaped state trees: floating-point tensors and
    floats are averaged; every other value (integer tensors such as an RNG state,
    step counters, strings) is the first tree's. Equal values (replicas of synchronous
    data parallelism) are kept as they are, without rounding."""
    first = states[0]
    if isinstance(first, torch.Tensor):
        if first.is_floating_point() and not all(torch.equal(first, s) for s in states[1:]):
            return torch.stack([s.to(first.dtype) for s in states]).mean(dim=0)
        return first.clone()
    if isinstance(first, dict):
        return {k: average_states([s[k] for s in states]) for k in first}
    if isinstance(first, (list, tuple)):
        items = [average_states([s[i] for s in states]) for i in range(len(first))]
        return type(first)(items)
    if isinstance(first, float) and any(s != first for s in states[1:]):
        return sum(states) / len(states)
    return first


#: Every strategy by name (``--strategy NAME``); an unknown name is a UsageError.
STRATEGIES: Registry[type[Strategy]] = Registry("strategy", flag="--strategy")


def register(cls: type[Strategy]) -> type[Strategy]:
    """Class decorator: make a strategy available as ``--strategy NAME``."""
    STRATEGIES.add(cls.name, cls)
    return cls


def get(name: str) -> type[Strategy]:
    """The strategy class registered as ``name`` (UsageError listing the choices if none)."""
    return STRATEGIES.get(name)
