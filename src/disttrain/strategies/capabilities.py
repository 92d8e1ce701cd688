"""What some strategies can do and others cannot: small capability classes, one each.

A strategy's runtime class (:class:`~disttrain.strategies.base.Strategy`) lists only the
step and state hooks every strategy has. A capability that only some have is a class
here that the strategy also inherits; the trainer, launcher and pre-flight ask
``isinstance`` / ``issubclass`` (or call the functions below, which give the plain
behaviour for a strategy without it) instead of reading boolean flags or meeting
``NotImplementedError`` defaults.

    class AllReduce(Strategy, Regroups, Grows, Reshards, SendsDuringBackward, ...):

- :class:`Regroups`: live shrink (``--min-workers``): the survivors go on without a lost
  worker; :class:`Grows` also admits a joining one (``--max-workers``).
- :class:`Reshards`: a checkpoint of N workers resumes on M.
- :class:`ShapesCheckpoint`: the strategy says which checkpoint entries are equal on
  every worker, or saves the model's entry itself (ZeRO stage 3's shards).
- :class:`SendsDuringBackward`: gradients are reduced by hooks while backward runs.
- :class:`Accumulates`: ``--accumulate K`` micro-batches a step, communicating on the last.
- :class:`ShardsData`: a global batch is not split over every rank (model parallelism).
- :class:`StepEvents`: the strategy acts when a step begins or is skipped (ps).
- :class:`CountsMemory`: the strategy counts its own memory (ZeRO's gathered layers).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from disttrain.comm.world import World
from disttrain.dataparallel.accumulate import accumulated_forward_backward
from disttrain.dataparallel.fusion import FlatBucket
from disttrain.strategies.state import average_states, peak_rss_bytes, storage_bytes

if TYPE_CHECKING:
    from disttrain.strategies.base import Strategy

__all__ = [
    "Accumulates",
    "CountsMemory",
    "Grows",
    "Regroups",
    "Reshards",
    "SendsDuringBackward",
    "ShapesCheckpoint",
    "ShardsData",
    "StepEvents",
    "before_step",
    "communicates_during_backward",
    "data_shard",
    "load_model_state_dict",
    "memory",
    "model_state_dict",
    "replicated_state",
    "skipped_step",
]


class Regroups(ABC):
    """Live shrink (``--min-workers``, :mod:`disttrain.train.shrink`): the survivors of a
    lost worker regroup and run the interrupted step again."""

    @abstractmethod
    def abandon_step(self) -> None:
        """A peer failed during a step: stop this step's communication (threads, queued
        sends) before the process group is dropped."""

    @abstractmethod
    def regroup(self, world: World) -> None:
        """Rebuild what depends on the process group for ``world`` (the new group), between
        steps, on every member, before the interrupted step runs again."""


class Grows(Regroups, ABC):
    """Live grow (``--max-workers``, :mod:`disttrain.train.grow`): :meth:`regroup` also takes
    a group of more workers, a joiner receiving rank 0's replica."""


class Reshards:
    """A checkpoint written by N workers resumes on M (pre-flight refuses another worker
    count for a strategy without this: stages or slices depend on the number of ranks)."""

    @classmethod
    def reshard(
        cls, read: Callable[[int], dict[str, Any]], old_world: int, rank: int, world: int
    ) -> dict[str, Any]:
        """Worker ``rank``'s state among ``world`` workers from a checkpoint of ``old_world``.

        ``read(j)`` loads old worker j's state: the trainer's per-worker dict (``model``,
        ``optimizer``, ``strategy`` (the runtime's ``state_dict``), ``scaler``, ``rng``,
        ``step``). The default suits per-worker replicas (local SGD, gossip): every new
        worker starts from the average of all old workers' states (:func:`average_states`).
        """
        del rank, world
        return average_states([read(j) for j in range(old_world)])


class ShapesCheckpoint:
    """The strategy shapes its checkpoint entries (the defaults: none shared, the whole
    model's ``state_dict``)."""

    model: torch.nn.Module

    def replicated_state(self) -> set[str]:
        """Paths of this worker's checkpoint state (``/model/<name>``, ``/optimizer``, ...)
        equal on every worker of the layout's ``worker_group``: each writes 1/N of them."""
        return set()

    def model_state_dict(self) -> dict[str, Any]:
        """The model's entry of this worker's checkpoint."""
        return self.model.state_dict()

    def load_model_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the model's entry of :meth:`model_state_dict` (after ``load_state_dict``)."""
        self.model.load_state_dict(state)


class SendsDuringBackward(ABC):
    """Gradients are reduced by hooks while backward runs (overlap): under fp16 the
    trainer then unscales after ``after_backward`` instead of before it."""

    #: False while the strategy sends nothing during backward (a compressor that sends
    #: one payload after it): set by the strategy in ``setup``.
    communicates_during_backward: bool = True

    @abstractmethod
    def check_before_send(self, check: Callable[[FlatBucket], None]) -> bool:
        """Have ``check`` run on each gradient bucket just before it is sent during
        backward; False if none is sent then (the trainer checks after backward)."""


class Accumulates(ABC):
    """Gradient accumulation (``--accumulate K``): a step's batch as K micro-batches whose
    backward passes but the last keep their gradients local (:meth:`no_sync`). The step
    runner calls :meth:`accumulated` instead of ``forward_backward`` when K > 1, so that a
    step without accumulation is the base class's one call (train/step.py)."""

    accumulate: int
    model: torch.nn.Module
    loss_fn: Callable[[Any, Any], torch.Tensor]
    model_call: Callable[[torch.nn.Module, Any], Any]

    @abstractmethod
    def no_sync(self) -> Any:
        """A context inside which backward passes do not communicate."""

    def accumulated(self, x: Any, y: Any) -> torch.Tensor:
        """``forward_backward`` over :attr:`accumulate` micro-batches of (x, y)."""
        return accumulated_forward_backward(
            self.model, self.loss_fn, x, y, self.accumulate, self.no_sync, self.model_call
        )


class ShardsData(ABC):
    """Each global batch is split over fewer shards than ranks (model parallelism: the
    ranks of one stage or slice group share a batch)."""

    @property
    @abstractmethod
    def data_rank(self) -> int:
        """This process's index among the data-parallel shards of each global batch."""

    @property
    @abstractmethod
    def data_world_size(self) -> int:
        """How many shards each global batch is split into."""


class StepEvents(ABC):
    """The strategy acts when a step begins, and on a step every worker skips."""

    @abstractmethod
    def before_step(self, step: int) -> None:
        """Step ``step`` (from 1) begins; nothing of it is computed yet."""

    @abstractmethod
    def skipped_step(self, step: int) -> None:
        """Every worker skips step ``step`` (an fp16 overflow, agreed): no
        ``after_backward``, optimizer step nor ``after_step`` for it."""


class CountsMemory(ABC):
    """The strategy counts the bytes it holds itself (beyond :func:`memory`'s default)."""

    @abstractmethod
    def memory(self) -> dict[str, int]:
        """The figures of :func:`memory`, for this strategy."""


# --- what the trainer calls: the capability, or the plain behaviour ----------------------
def data_shard(strategy: Strategy) -> tuple[int, int]:
    """(this process's shard index, shards per global batch): every rank by default."""
    if isinstance(strategy, ShardsData):
        return strategy.data_rank, strategy.data_world_size
    return strategy.world.rank, strategy.world.world_size


def communicates_during_backward(strategy: Strategy) -> bool:
    return isinstance(strategy, SendsDuringBackward) and strategy.communicates_during_backward


def before_step(strategy: Strategy, step: int) -> None:
    if isinstance(strategy, StepEvents):
        strategy.before_step(step)


def skipped_step(strategy: Strategy, step: int) -> None:
    if isinstance(strategy, StepEvents):
        strategy.skipped_step(step)


def replicated_state(strategy: Strategy) -> set[str]:
    return strategy.replicated_state() if isinstance(strategy, ShapesCheckpoint) else set()


def model_state_dict(strategy: Strategy) -> dict[str, Any]:
    if isinstance(strategy, ShapesCheckpoint):
        return strategy.model_state_dict()
    return strategy.model.state_dict()


def load_model_state_dict(strategy: Strategy, state: dict[str, Any]) -> None:
    if isinstance(strategy, ShapesCheckpoint):
        strategy.load_model_state_dict(state)
    else:
        strategy.model.load_state_dict(state)


def memory(strategy: Strategy) -> dict[str, int]:
    """Bytes this worker holds now (``memory_per_rank`` in summary.json).

    Counted from the tensors, each storage once (a gradient that is a view of a fusion
    bucket counts the bucket): ``parameters`` (the model's and the optimizer's),
    ``gradients`` (their ``.grad``), ``optimizer_state`` (every tensor in the optimizer's
    state), ``gathered_peak`` (parameter bytes gathered at once; 0 unless parameters
    are sharded: :class:`CountsMemory`) and ``peak_rss`` (the process's peak resident
    memory)."""
    if isinstance(strategy, CountsMemory):
        return strategy.memory()
    return replica_memory(strategy.model, strategy.optimizer)


def replica_memory(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """:func:`memory`'s figures for plain tensors: the model, its gradients, the optimizer's."""
    params: list[torch.Tensor] = list(model.parameters())
    params += [p for g in optimizer.param_groups for p in g["params"]]
    state = [t for s in optimizer.state.values() for t in s.values()]
    return {
        "parameters": storage_bytes(params),
        "gradients": storage_bytes([p.grad for p in params if p.grad is not None]),
        "optimizer_state": storage_bytes([t for t in state if isinstance(t, torch.Tensor)]),
        "gathered_peak": 0,
        "peak_rss": peak_rss_bytes(),
    }
