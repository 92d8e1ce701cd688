"""Horovod's process sets: collectives among a subset of the ranks, each on a group of its own.

Adding and removing a set is collective: every rank calls it, in the same order (as
torch's ``new_group``, and as Horovod asks). ``root_rank`` arguments stay global ranks.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import torch.distributed as dist
from torch.distributed import ProcessGroup

from disttrain.comm.forming import new_group
from disttrain.comm.world import group_timeout
from disttrain.horovod import engine

__all__ = [
    "ProcessSet",
    "add_process_set",
    "global_process_set",
    "remove_process_set",
    "resolve",
]


class ProcessSet:
    """A set of global ranks (kept sorted); ``process_set_id`` is None until registered."""

    def __init__(self, ranks_or_comm: Iterable[int] | Any) -> None:
        ranks = list(ranks_or_comm)
        if not all(isinstance(r, int) for r in ranks):
            raise ValueError("ProcessSet takes an iterable of int ranks (mpi4py is not supported)")
        self.ranks: list[int] | None = sorted(ranks)
        self.process_set_id: int | None = None
        self.mpi_comm = None

    def size(self) -> int | None:
        return None if self.process_set_id is None or self.ranks is None else len(self.ranks)

    def rank(self) -> int | None:
        """This process's rank within the set (None while unregistered)."""
        if self.process_set_id is None or self.ranks is None:
            return None
        me = engine.current().rank
        if me not in self.ranks:
            raise ValueError(f"rank {me} is not a member of {self}")
        return self.ranks.index(me)

    def included(self) -> bool | None:
        return None if self.ranks is None else engine.current().rank in self.ranks

    def __str__(self) -> str:
        pid, ranks = self.process_set_id, self.ranks
        return f"ProcessSet(process_set_id={pid}, ranks={ranks}, mpi_comm=None)"

    __repr__ = __str__


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0
#: registered sets other than the global one: id -> (set, its group; None off the set)
_sets: dict[int, tuple[ProcessSet, ProcessGroup | None]] = {}


def start(size: int) -> None:
    """At ``init``: the global set holds every rank; no other set is registered."""
    global_process_set.ranks = list(range(size))
    global_process_set.process_set_id = 0
    _sets.clear()


def stop() -> None:
    """At ``shutdown``: every set but the global one is forgotten (their groups dropped)."""
    for ps, _ in _sets.values():
        ps.process_set_id = None
    _sets.clear()


def add_process_set(process_set: ProcessSet | Iterable[int]) -> ProcessSet:
    """Register a set on every rank (collective: same sets, same order on every rank)."""
    eng = engine.current()
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS", "1") not in ("1", "true", "True"):
        raise ValueError("Set HOROVOD_DYNAMIC_PROCESS_SETS=1 to add process sets after init")
    ranks = ps.ranks or []
    size = dist.get_world_size(eng.group)
    if not ranks or any(r < 0 or r >= size for r in ranks) or len(set(ranks)) != len(ranks):
        raise ValueError(f"a process set needs distinct ranks in 0..{size - 1}, got {ranks}")
    if ranks == global_process_set.ranks or any(s.ranks == ranks for s, _ in _sets.values()):
        raise ValueError(f"Attempted to add a duplicate process set: {ps}")
    # every rank creates every group (torch's rule); a non-member's handle is not a group
    group = new_group(ranks, timeout=group_timeout())
    ps.process_set_id = max(_sets, default=0) + 1
    _sets[ps.process_set_id] = (ps, group if eng.rank in ranks else None)
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Forget a set (collective); False for the global set or one not registered."""
    engine.current()
    pid = process_set.process_set_id
    if not pid or pid not in _sets:
        return False
    del _sets[pid]
    process_set.process_set_id = None
    return True


def resolve(process_set: ProcessSet) -> tuple[ProcessGroup, list[int]]:
    """(group, member ranks) of a set this rank may call collectives on; else ValueError."""
    eng = engine.current()
    if process_set.process_set_id == 0:
        return eng.group, list(global_process_set.ranks or [])
    pid = process_set.process_set_id
    if pid is None or pid not in _sets:
        raise ValueError(f"{process_set} is not registered: use hvd.add_process_set first")
    ps, group = _sets[pid]
    if group is None:
        raise ValueError(f"rank {eng.rank} is not a member of {ps}")
    return group, list(ps.ranks or [])
