"""``dt.distribute(model, optimizer, strategy=..., **settings)``: every strategy in a script.

    run = dt.distribute(model, optimizer, strategy="diloco", period=50)
    if run.serves:                        # parameter-server processes
        run.serve(); return
    for epoch in range(run.epoch, epochs):
        for batch in run.loader(dataset, batch_size=64, shuffle=True, epoch=epoch):
            loss = run.step(batch, loss_fn)
    model = run.finish()                  # the whole trained model on rank 0, None elsewhere

A run is the engine that ``disttrain train``'s loop steps
(:class:`~disttrain.train.engine.Engine`), with a script's data. ``run.step`` is
:class:`~disttrain.train.step.StepRunner`'s step: zero_grad, forward under the
precision's autocast, backward (fp16: the loss scaled), the finite check, the strategy's
communication, the agreed fp16 skip, the optimizer step and the strategy's after-step
(local SGD's average), in that order. The data-parallel family also lets a script keep
its own forward and ``optimizer.step()``: ``run.backward(loss)`` (the strategy's hooks
run from the optimizer's step pre- and post-hooks).
"""

from __future__ import annotations

import atexit
import weakref
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import IterableDataset

from disttrain import strategies
from disttrain.api.loader import OVER, Position, Stream, agreed, rank_loader_for
from disttrain.api.settings import run_config
from disttrain.comm import world as world_mod
from disttrain.comm.errors import UsageError
from disttrain.data.torchloader import is_stateful
from disttrain.dataparallel.states import allgather_states
from disttrain.strategies.capabilities import data_shard
from disttrain.train.engine import Engine, Forward

__all__ = ["DistributedRun", "distribute"]


def distribute(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    strategy: str | type[strategies.Strategy] | strategies.StrategyKind = "allreduce",
    *,
    forward: Forward | None = None,
    **settings: Any,
) -> DistributedRun:
    """``model`` and ``optimizer`` trained by ``strategy`` over the job's processes.

    ``strategy``: a registered name, or a strategy object: a ``Strategy`` class (one not
    registered yet is registered as ``@register`` would) or what the registry holds.
    ``settings`` are the strategy's own under their flag names with underscores
    (``zero_stage=3``); one it does not read is refused, as on the command line.
    ``optimizer=None``: the trainer's default (``--optimizer``, ``lr``, or the
    strategy's own default). The process group is the launcher's (``torchrun``,
    ``disttrain run``, Ray, Slurm), or one process alone."""
    if not isinstance(model, nn.Module):
        raise UsageError(f"dt.distribute: model must be an nn.Module, got {type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise UsageError(
            f"dt.distribute: optimizer must be a torch.optim.Optimizer (or None), "
            f"got {type(optimizer).__name__}"
        )
    size = dist.get_world_size() if dist.is_initialized() else _env_size()
    cfg = run_config(_strategy_name(strategy), settings, optimizer is not None, size)
    # pre-flight's own check (the batch splits, stages and mesh fit the model): every rank
    # checks alike, so every rank refuses or none does
    strategies.get(cfg.train.strategy).settings.validate_config(cfg, model)
    return DistributedRun(cfg, model, optimizer, forward)


def _strategy_name(strategy: object) -> str:
    """The registered name ``strategy`` stands for; a Strategy class not registered yet is
    registered now (every process of a script runs this line alike)."""
    if isinstance(strategy, str):
        return strategy
    if isinstance(strategy, strategies.StrategyKind):
        return strategy.name
    if isinstance(strategy, type) and issubclass(strategy, strategies.Strategy):
        name = getattr(strategy, "name", None)
        if not isinstance(name, str) or not name:
            raise UsageError(
                f"dt.distribute: strategy class {strategy.__name__} has no `name` "
                f"(a class attribute: the name it is registered and reported under)"
            )
        held = strategies.STRATEGIES.names()
        if name in held and strategies.get(name).runtime is not strategy:
            raise UsageError(
                f"dt.distribute: strategy class {strategy.__name__} is named {name!r}, "
                f"which another strategy is registered as: give it a name of its own"
            )
        if name not in held:
            strategies.register(strategy)
        return name
    raise UsageError(
        "dt.distribute: strategy must be a registered name or a Strategy class, "
        f"got {type(strategy).__name__}"
    )


def _env_size() -> int:
    import os

    return int(os.environ.get("WORLD_SIZE", "1"))


_EXIT_REGISTERED = [False]


def _leave_at_exit(run: DistributedRun) -> None:
    """At the script's exit, the run lets go of its strategy (whose sub-groups would
    otherwise outlive ``destroy_process_group``: gloo's threads then die in the
    interpreter's teardown, SIGABRT, "terminate called without an active exception"),
    then the process group is left (``dt.shutdown``; a group the script formed itself is
    left to it). Held weakly: a script may build many runs."""
    ref = weakref.ref(run)

    def release() -> None:
        alive = ref()
        if alive is not None:
            alive.release()

    world_mod.at_shutdown(release)
    if not _EXIT_REGISTERED[0]:
        atexit.register(world_mod.shutdown)
        _EXIT_REGISTERED[0] = True


class DistributedRun(Engine):
    """One process's part of a script's run (built by :func:`distribute`): the engine
    ``disttrain train`` steps (:class:`~disttrain.train.engine.Engine`), with the data."""

    def __init__(
        self,
        cfg: Any,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        forward: Forward | None,
    ) -> None:
        super().__init__(cfg, model, optimizer, forward)
        self.position = Position()
        self._kept: tuple[Any, Any] | None = None  # a loader with persistent workers
        self._stream: Stream | None = None  # a stateful stream's loader, for state_dict
        _leave_at_exit(self)

    @property
    def epoch(self) -> int:
        """The epoch to go on with: 0, or a loaded state's (``for e in range(run.epoch, E)``)."""
        return self.position.epoch

    def _stepped(self) -> None:
        self.position.batches += 1

    # --- data ---------------------------------------------------------------------------
    def loader(
        self,
        dataset: Any,
        batch_size: int | None = None,
        shuffle: bool | None = None,
        epoch: int = 0,
        **dataloader_kwargs: Any,
    ) -> Any:
        """torch's DataLoader of this rank's share of each global batch of ``batch_size``
        (default: the run's ``batch_size``); every DataLoader keyword passes through.

        A stream with ``state_dict`` / ``load_state_dict`` is read by torchdata's
        ``StatefulDataLoader``, and a loaded state's epoch goes on where it was saved.
        On a process that serves (a parameter server) it serves until the workers are
        done and yields nothing, so that one loop is every process's script."""
        if self.serves:
            self._serve_once()
            return []
        rank, shards = data_shard(self.strategy)
        workers = int(dataloader_kwargs.get("num_workers", 0))
        skip = self.position.start(dataset, epoch, shards, workers)
        self._stream = None
        if skip is OVER:  # the saved epoch's stream had ended: nothing left of it
            self._stream = Stream(None, rank, workers, over=True)  # and a state says so again
            return []
        b = batch_size if batch_size is not None else self.tc.batch_size
        key = (id(dataset), b, shuffle, sorted(dataloader_kwargs.items(), key=str))
        if self._kept is not None and self._kept[0] == key:  # persistent workers stay up
            self._kept[1].batch_sampler.set_epoch(epoch, skip)
            return self._kept[1]
        loader = rank_loader_for(
            dataset, b, rank, shards, self.tc.seed, epoch, skip,
            shuffle=shuffle, **dataloader_kwargs,
        )  # fmt: skip
        if isinstance(dataset, IterableDataset) and is_stateful(dataset):
            self._stream = Stream(loader, rank, workers)  # its place goes into run.state_dict()
            return self._stream.batches(self.world.rank, self.roles.worker_group)
        if isinstance(dataset, IterableDataset):  # its ranks agree, and deal its uneven end
            return agreed(loader, self.world.rank, self.roles.worker_group, shard=rank)
        if dataloader_kwargs.get("persistent_workers"):  # the next epoch's reuses it
            self._kept = (key, loader)
        return loader

    # --- the state -----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The engine's state (every worker's part and the step) and the data's position,
        on every worker (a collective: every worker calls it). A stateful stream's place
        is every rank's loader state, by rank (``"stream"``), gathered as the engine's
        parts are: plain values, nothing pickled."""
        state = {**super().state_dict(), "position": self.position.state_dict()}
        if self._stream is not None:  # every rank has one: the script's loop is the same
            mine = self._stream.state()  # checked here, before the collective
            ranks = allgather_states(mine, self.roles.worker_group)
            state["stream"] = {"epoch": self.position.epoch, "ranks": ranks}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from ``state``; the next ``run.loader`` of its epoch continues it."""
        super().load_state_dict(state)
        self.position.load_state_dict(state["position"], state.get("stream"))
