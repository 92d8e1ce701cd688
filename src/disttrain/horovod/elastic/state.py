"""Horovod's ``hvd.elastic.TorchState``: a training state committed in memory, rolled back
on a recoverable error and synced from rank 0 when :func:`disttrain.horovod.elastic.run`
(re)starts the training function.

Every keyword (``model`` and ``optimizer`` too) becomes an attribute. A module, an
optimizer, a learning-rate scheduler and an :class:`ElasticSampler` are kept by their
``state_dict`` (a handler each, as Horovod's); any other value is kept as it is. Setting
a handled attribute to a new object commits that object at once (Horovod's rule).

Why not ``dt.elastic.State`` (:mod:`disttrain.elastic`): that one writes every commit to
disk for a job that restarts, and keeps JSON values only; Horovod's commits stay in memory
and its values are any Python object (synced by ``broadcast_object``, which pickles).
A commit here therefore lives in memory, with one exception: under
``torchrun --max-restarts N`` (N >= 1), where a lost worker restarts every worker, rank 0
also keeps each commit in torchrun's store (which outlives its restart rounds), and
:func:`disttrain.horovod.elastic.run` of a restarted round starts from it: the job goes on
from its last commit, as Horovod's survivors do (docs/horovod.md).
"""

from __future__ import annotations

import copy
import io
import itertools
import os
import struct
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

from disttrain.horovod import basics
from disttrain.horovod.elastic.sampler import ElasticSampler
from disttrain.horovod.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
    object_bytes,
    object_from_bytes,
)

__all__ = ["TorchState"]

#: TorchStates made in this process, in order: the same count in every restart round, so
#: the n-th state of a restarted round finds the n-th state's commit
_made = itertools.count()


class _Handler:
    """One object kept by its ``state_dict``: ``save`` snapshots it, ``restore`` loads the
    snapshot (a copy: ``load_state_dict`` may keep the tensors it is given, and later steps
    must not move the snapshot), ``sync`` takes rank 0's."""

    def __init__(self, value: Any) -> None:
        self.value = value
        # a plain copy, even for a sampler: making the state must not be a collective
        self.saved: Any = copy.deepcopy(value.state_dict())

    def snapshot(self) -> Any:
        return copy.deepcopy(self.value.state_dict())

    def save(self) -> None:
        self.saved = self.snapshot()

    def restore(self) -> None:
        self.value.load_state_dict(copy.deepcopy(self.saved))

    def sync(self) -> None:
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), 0))

    def set_value(self, value: Any) -> None:
        self.value = value
        self.save()


class _Model(_Handler):
    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)  # tensors, no pickle


class _Optimizer(_Handler):
    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


class _Sampler(_Handler):
    def snapshot(self) -> Any:
        # record_indices keeps each rank's own indices: the commit holds every rank's
        state = copy.deepcopy(self.value.state_dict())
        if basics.is_initialized() and basics.size() > 1:
            mine = sorted(self.value.processed_indices)
            state["processed_indices"] = set().union(*allgather_object(mine, name="sampler"))
        return state


def _handler(value: Any) -> _Handler | None:
    kinds: list[tuple[type, type[_Handler]]] = [
        (torch.nn.Module, _Model),
        (torch.optim.Optimizer, _Optimizer),
        (torch.optim.lr_scheduler.LRScheduler, _Handler),
        (ElasticSampler, _Sampler),
    ]
    for kind, handler in kinds:
        if isinstance(value, kind):
            return handler(value)
    return None


class TorchState:
    """``TorchState(model=None, optimizer=None, **kwargs)``: see the module doc."""

    _handlers: dict[str, _Handler]
    _reset_callbacks: list[Callable[[], None]]
    _saved: dict[str, Any]  # the values without a handler, as last committed
    _key: str  # its commit's key in torchrun's store (see resume)

    def __init__(
        self,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        **kwargs: Any,
    ) -> None:
        values = {**kwargs, "model": model, "optimizer": optimizer}
        handlers = {k: h for k, v in values.items() if (h := _handler(v)) is not None}
        object.__setattr__(self, "_handlers", handlers)
        object.__setattr__(self, "_reset_callbacks", [])
        # the other values, as last committed (a copy: in-place changes are not commits)
        plain = {k: v for k, v in values.items() if k not in handlers}
        object.__setattr__(self, "_saved", copy.deepcopy(plain))
        object.__setattr__(self, "_key", f"disttrain/horovod/commit/{next(_made)}")
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._handlers:
            self._handlers[name].set_value(value)
        object.__setattr__(self, name, value)

    # --- Horovod's State -------------------------------------------------------------
    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], None]]) -> None:
        """Call ``callbacks`` after every reset (before the state is synced again)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def reset(self) -> None:
        """Hook for subclasses: runs at a reset, before the callbacks (Horovod's)."""

    def commit(self) -> None:
        """Snapshot the state in memory (collective when it holds an ElasticSampler)."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Nothing to check: the world of a torchrun round never changes; a lost or new
        worker restarts the round instead, so no HostsUpdatedInterrupt is ever raised."""

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        saved = {k: getattr(self, k) for k in self._saved}
        object.__setattr__(self, "_saved", copy.deepcopy(saved))
        store = _restart_store()
        if store is not None and basics.rank() == 0:
            # rank 0's commit holds what every rank needs (the sampler's indices are joined)
            store.set(self._key, self._commit_bytes())  # type: ignore[arg-type]  # bytes too

    def _commit_bytes(self) -> bytes:
        """The last commit as one value (one write: a crash leaves the previous one whole):
        the handled objects' state dicts by ``torch.save`` (read back with
        ``weights_only=True``: tensors and plain containers only), then the plain values
        as ``broadcast_object`` sends them (pickled, as Horovod's API promises)."""
        buffer = io.BytesIO()
        torch.save({k: h.saved for k, h in self._handlers.items()}, buffer)
        handled = buffer.getvalue()
        return struct.pack("<Q", len(handled)) + handled + object_bytes(self._saved)

    def resume(self) -> bool:
        """In a round torchrun restarted, whether the job has a commit (kept by :meth:`save`
        in torchrun's store: every rank sees the same answer); rank 0 loads it, and
        :meth:`sync` then gives it to every rank."""
        store = _restart_store()
        restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
        if store is None or not restarted or not store.check([self._key]):
            return False
        if basics.rank() != 0:
            return True
        data = store.get(self._key)
        (n,) = struct.unpack_from("<Q", data)
        handled = torch.load(io.BytesIO(data[8 : 8 + n]), weights_only=True)
        for name, saved in handled.items():
            self._handlers[name].saved = saved
        # pickled, as broadcast_object's: the job's own store, trusted as its peers are
        object.__setattr__(self, "_saved", object_from_bytes(data[8 + n :]))
        self.restore()
        return True

    def restore(self) -> None:
        """Roll back to the last commit."""
        for handler in self._handlers.values():
            handler.restore()
        self._set_saved()

    def sync(self) -> None:
        """Every rank takes rank 0's state: its handled objects as they are now and its
        other values as last committed (Horovod's rule; uncommitted ones are dropped)."""
        for handler in self._handlers.values():
            handler.sync()
        if self._saved:
            object.__setattr__(self, "_saved", broadcast_object(self._saved, 0, name="state"))
            self._set_saved()

    def _set_saved(self) -> None:
        for name, value in copy.deepcopy(self._saved).items():
            object.__setattr__(self, name, value)


def _restart_store() -> dist.Store | None:
    """torchrun's own store, where a restart may come (``--max-restarts`` of 1 or more): it
    outlives the job's rounds. None otherwise: commits stay in memory, as Horovod's."""
    if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) < 1:
        return None
    if not (basics.is_initialized() and basics.size() > 1):
        return None
    store = dist.distributed_c10d._get_default_store()
    while isinstance(store, dist.PrefixStore):  # the round's and the group's prefixes
        store = store.underlying_store
    return store
