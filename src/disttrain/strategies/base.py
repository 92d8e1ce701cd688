"""The strategy interface (how replicas or model shards agree) and the registry by name.

The trainer drives every strategy through the same points of a step:

    model = strategy.prepare_model(model)      # a shard of it, for model parallelism
    optimizer = make_optimizer(model.parameters())
    strategy.setup(model, optimizer)           # replicas made consistent
    if not strategy.is_worker: strategy.serve(); return      # e.g. parameter servers
    epochs, steps = strategy.limits(epochs, steps)           # async: shared work budget
    each step (until steps, or strategy.should_stop()):
               loss = strategy.forward_backward(x, y)
               strategy.after_backward()       # data parallel: average gradients
               optimizer.step(); strategy.after_step(step)   # local SGD: average here
    strategy.finish(); model = strategy.eval_model()         # the whole model on rank 0

Override only the hooks you need (Bagua's pattern). Algorithm state lives in
the strategy and is saved through ``state_dict``; process groups never are.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn
from torch.distributed import ProcessGroup

from disttrain import timeline
from disttrain.comm.errors import UsageError
from disttrain.comm.world import World
from disttrain.config import RunConfig, field_names

__all__ = ["STRATEGIES", "Strategy", "get", "register"]

LossFn = Any  # Callable[[Tensor, Tensor], Tensor]


class Strategy:
    """How data-parallel replicas (or model shards) agree; each hook has a plain default."""

    name: ClassVar[str]
    #: True if gradients are reduced by hooks while backward runs (overlap): under fp16
    #: the trainer then unscales after ``after_backward`` instead of before it.
    communicates_during_backward: bool = False
    #: The settings this strategy reads beyond the always-read ones (``TrainConfig``,
    #: ``DataConfig``): section classes (all their fields) and single field names.
    #: Pre-flight refuses any other setting changed from its default.
    reads_settings: ClassVar[tuple[type[Any] | str, ...]] = ()

    def __init__(self, config: RunConfig, world: World, loss_fn: LossFn) -> None:
        self.config = config
        self.world = world
        self.loss_fn = loss_fn

    @classmethod
    def settings_not_read(cls, config: RunConfig) -> dict[str, str]:
        """Declared settings that ``config``'s other settings make this strategy ignore, each
        with the reason, e.g. ``{"fusion_mb": "with --compression topk:0.01"}``."""
        del config
        return {}

    @classmethod
    def reads(cls, config: RunConfig) -> set[str]:
        """The settings a run of this strategy with ``config`` reads (always-read ones aside)."""
        return field_names(cls.reads_settings) - set(cls.settings_not_read(config))

    @classmethod
    def num_processes(cls, config: RunConfig) -> int:
        """Processes to start on each node (servers included, for parameter servers)."""
        return config.train.workers

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

    @classmethod
    def survives_loss_of(cls, config: RunConfig, rank: int) -> bool:
        """True if the job goes on when process ``rank`` is killed (asynchronous strategies)."""
        del config, rank
        return False

    # --- roles and data sharding -------------------------------------------------
    @property
    def is_worker(self) -> bool:
        """False for processes that do not train (parameter servers): they ``serve()``."""
        return True

    def serve(self) -> dict[str, Any]:
        """Run a non-worker process's role until the job ends; return its figures."""
        raise NotImplementedError(f"{self.name} has no non-worker role")

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
    def prepare_model(self, model: nn.Module) -> nn.Module:
        """The part of ``model`` this process holds (all of it, by default)."""
        return model

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Make the replicas consistent before the first step."""
        self.model = model
        self.optimizer = optimizer

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Compute the loss of this process's batch shard and its gradients; return the loss."""
        with timeline.span("forward"):
            loss = self.loss_fn(self.model(x), y)
        with timeline.span("backward"):
            loss.backward()
        return loss.detach()

    def limits(self, epochs: int, steps: int) -> tuple[int, int]:
        """The most epochs and steps this worker may run, given the run's (called once, before
        the first step). Asynchronous strategies raise them and end with ``should_stop``."""
        return epochs, steps

    def should_stop(self) -> bool:
        """True once the job's work is done, before this worker's own limits (checked per step)."""
        return False

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
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state


STRATEGIES: dict[str, type[Strategy]] = {}


def register(cls: type[Strategy]) -> type[Strategy]:
    """Class decorator: make a strategy available as ``--strategy NAME``."""
    STRATEGIES[cls.name] = cls
    return cls


def get(name: str) -> type[Strategy]:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(
            f"unknown strategy {name!r}; choose one of {', '.join(sorted(STRATEGIES))}"
        ) from None
