"""Horovod's ``hvd.elastic``: ``run``, ``TorchState``, ``ElasticSampler``.

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for state.batch, (x, y) in enumerate(loader):   # loader over state.sampler
                ...
                state.sampler.record_batch(state.batch, batch_size)
                if state.batch % 10 == 0:
                    state.commit()
            state.sampler.set_epoch(state.epoch + 1)
            state.batch = 0
            state.commit()

    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)
    train(state)

What holds, and how (docs/horovod.md): :func:`run` syncs the state from rank 0 and calls
the function; a ``HorovodInternalError`` raised in it (a mismatched collective, one
raised by the script) rolls the state back to its last commit, runs the reset callbacks,
syncs and calls it again, in the same processes and the same world, as Horovod does when
no worker was lost. A lost worker cannot be reset around in memory on gloo under torchrun
(its process group is gone; the world of a round is fixed): the sync after the error
fails, the process exits and ``torchrun --max-restarts`` starts the whole round again;
there, ``run`` starts from the job's last commit, which rank 0 kept in torchrun's store
(see :mod:`disttrain.horovod.elastic.state`), as Horovod's survivors go on from theirs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from disttrain.horovod.elastic.sampler import ElasticSampler
from disttrain.horovod.elastic.state import TorchState
from disttrain.horovod.exceptions import HorovodInternalError, HostsUpdatedInterrupt

__all__ = ["ElasticSampler", "TorchState", "run"]

R = TypeVar("R")


def run(func: Callable[..., R]) -> Callable[..., R]:
    """Decorate ``func(state, *args, **kwargs)``: sync ``state`` from rank 0, call it, and
    on a recoverable error roll back, reset and call it again (see the module doc)."""

    @functools.wraps(func)
    def wrapper(state: Any, *args: Any, **kwargs: Any) -> R:
        skip_sync = False
        # a round torchrun restarted goes on from the job's last commit (rank 0 loads it,
        # the sync below hands it to all, and every rank's snapshot becomes that commit)
        resumed = isinstance(state, TorchState) and state.resume()
        while True:
            if not skip_sync:
                # outside the try, unlike Horovod: a sync that fails means the group is
                # broken (a peer died); retrying it would wait forever, exiting lets
                # torchrun restart the round
                state.sync()
                if resumed:
                    state.save()
                    resumed = False
            try:
                return func(state, *args, **kwargs)
            except HorovodInternalError:
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as exc:
                skip_sync = exc.skip_sync
            _reset()
            state.on_reset()

    return wrapper


def _reset() -> None:
    """Horovod shuts down and joins again to take in the new world. Here the world of a
    round never changes and the engine goes on after a HorovodInternalError (every rank
    of the call got it), so the process group is kept as it is."""
