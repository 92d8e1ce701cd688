"""L6: ``dt.elastic.State``: training state that a restarted job resumes, Horovod's
``hvd.elastic.State`` on disttrain's checkpoints.

    import disttrain as dt
    dt.init()
    state = dt.elastic.State(model, optimizer, root="state", epoch=0, batch=0)
    state.restore()                     # a restarted worker: the last commit
    state.sync()                        # every rank from rank 0's state
    for epoch in range(state.epoch, epochs):
        ...                             # train; state.batch = i as you go
        state.epoch = epoch + 1
        state.commit()                  # a restart resumes here

What is kept: the model's and the optimizer's ``state_dict`` and the extra values named
when the state is made (numbers, strings, booleans, lists and dicts of them), read and
set as attributes. :meth:`State.commit` snapshots them in memory and writes them as one
disttrain checkpoint (:mod:`disttrain.checkpoint`: rank 0's part, committed atomically;
every rank waits for it, so a crash mid-commit leaves the previous commit whole).
:meth:`State.restore` rolls back to the last commit: this process's snapshot if it made
one, else the newest commit on disk, which is how a worker started again by
``torchrun --max-restarts`` (or ``disttrain train --max-restarts``) finds it.

The machinery: when a worker dies, torch's elastic agent restarts every worker of the
job, and each resumes from the last commit; the worker count may differ after the
restart (the replicas of data parallelism are equal: rank 0's part is every rank's).
Workers leaving or joining *without* a restart, as Horovod's survivors roll back in
memory, need live membership changes: ``disttrain train --min-workers`` and
``--max-workers``/``--join`` have them (live shrink and grow, :mod:`disttrain.train.shrink`,
:mod:`disttrain.train.grow`), this API not yet (issue 20).

Checkpoints belong to one run: a fresh job refuses a ``root`` that holds commits; the
run's id is kept in the job's store (torchrun's, which outlives restart rounds), so a
restarted worker resumes its own job's run, and a job whose first round was refused is
refused again after its restart rather than continuing the other run.
"""

from __future__ import annotations

import copy
import os
import uuid
from typing import Any

import torch
import torch.distributed as dist

from disttrain import checkpoint
from disttrain.comm.errors import UsageError
from disttrain.dataparallel.broadcast import (
    broadcast_json,
    broadcast_optimizer_state,
    broadcast_parameters,
)

__all__ = ["State"]

#: Attributes of the object itself; any other attribute is an extra value of the state.
_OWN = ("model", "optimizer", "root", "commits", "_run", "_extras", "_snapshot")


class State:
    """A model, its optimizer and named extra values, committed together (see module doc)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        root: str = "elastic-state",
        **extras: Any,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.root = root
        self._extras: dict[str, Any] = dict(extras)
        self._snapshot: dict[str, Any] | None = None
        self.commits = 0  # commits of this run, also the step number of the newest one
        self._run = self._claim()

    # --- extras as attributes --------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        extras = self.__dict__.get("_extras", {})
        if name in extras:
            return extras[name]
        raise AttributeError(f"elastic state has no value {name!r}; name it when making it")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _OWN:
            object.__setattr__(self, name, value)
        elif name in self._extras:
            self._extras[name] = value
        else:
            raise AttributeError(f"elastic state has no value {name!r}; name it when making it")

    # --- the run ---------------------------------------------------------------------
    def _claim(self) -> str:
        """This run's id. A fresh job draws one (refusing a root with commits) and records it
        in the job's store, which outlives a restart round; a restarted worker reads it back
        there, so it continues its own job's run and never one a refused start found."""
        restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
        store = _job_store()
        key = f"disttrain/elastic-state-run/{os.path.abspath(self.root)}"
        if restarted and store is not None and store.check([key]):
            return store.get(key).decode()
        if checkpoint.runs(self.root):
            raise UsageError(
                f"dt.elastic.State: {self.root} holds another run's commits; choose another "
                "root or delete its checkpoints folder"
            )
        if store is None:  # one process, no group
            return uuid.uuid4().hex
        if _rank() == 0:
            store.set(key, uuid.uuid4().hex)
        return store.get(key).decode()  # the others wait for rank 0's

    # --- commit, restore, sync -------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"model": self.model.state_dict(), "extras": self._extras}
        if self.optimizer is not None:
            state["optimizer"] = self.optimizer.state_dict()
        return state

    def commit(self) -> None:
        """Snapshot the state in memory and on disk (collective: every rank calls it)."""
        self._snapshot = copy.deepcopy(self._state())
        self.commits += 1
        world = _world()
        if _rank() == 0:
            checkpoint.save(self.root, self.commits, 0, world, self._snapshot, run=self._run)()
            checkpoint.commit(self.root, self.commits, run=self._run, world_size=world)
        if world > 1:
            dist.barrier()  # no rank goes on before the commit is durable

    def restore(self) -> bool:
        """Roll back to the last commit (this process's, else the newest on disk); whether
        there was one."""
        state = self._snapshot
        if state is None:
            step = checkpoint.latest(self.root, self._run)
            if step is None:
                return False
            state = checkpoint.load(self.root, 0, None, step, self._run)
            self.commits = step
        self.model.load_state_dict(state["model"])
        if self.optimizer is not None and "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])
        self._extras.update(copy.deepcopy(state["extras"]))
        # the optimizer may now hold ``state``'s own tensors (load_state_dict keeps a tensor
        # of the right dtype and device): the snapshot must be a copy its steps cannot move
        self._snapshot = copy.deepcopy(state)
        return True

    def sync(self) -> None:
        """Give every rank rank 0's model, optimizer state and extra values."""
        if _world() == 1:
            return
        broadcast_parameters(self.model.state_dict(), 0)
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, 0)
        self._extras.update(broadcast_json(self._extras, 0))
        self.commits = int(broadcast_json(self.commits, 0))


def _job_store() -> dist.Store | None:
    """The store under the process group's prefixes: torchrun's agent store, one per job."""
    if _world() == 1:
        return None
    store = dist.distributed_c10d._get_default_store()
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
