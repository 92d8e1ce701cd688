"""Horovod's collective calls on the job's process group: tensors and plain Python numbers.

    avg = dt.allreduce(loss, average=True)        # a tensor: a new tensor, the mean
    acc = dt.allreduce(0.93, average=True)        # a Python number: a Python float
    every = dt.allgather(t)                       # concatenated along dim 0 (sizes may differ)
    w = dt.broadcast(t, root_rank=0)              # rank 0's tensor on every rank

As in Horovod, the input is not changed (``allreduce_``/``broadcast_`` change it in
place). Numbers travel as float64 tensors; nothing is pickled. ``join()`` blocks until
every rank has called it and returns the rank that called it last (by the hosts'
clocks); for uneven inputs *with* gradient allreduces, ``with opt.join():`` of
:class:`~disttrain.DistributedOptimizer` answers the other ranks' collectives.
"""

from __future__ import annotations

import itertools
from typing import Any, overload

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from disttrain.comm import world

__all__ = ["allgather", "allreduce", "allreduce_", "broadcast", "broadcast_", "join"]

_OPS = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}


def _device() -> torch.device:
    return world.current().device


@overload
def allreduce(value: torch.Tensor, average: bool = ..., op: str = ...) -> torch.Tensor: ...
@overload
def allreduce(value: float, average: bool = ..., op: str = ...) -> float: ...
def allreduce(value: Any, average: bool = True, op: str = "sum") -> Any:
    """The sum (``average``: the mean) of ``value`` over all ranks; ``op`` sum, min or max.

    A tensor gives a new tensor of its dtype (an integer tensor's mean is a float one);
    a Python number gives a float.
    """
    if isinstance(value, torch.Tensor):
        out = value.detach().clone()
        if average and not out.is_floating_point():
            out = out.double()
        return allreduce_(out, average, op)
    out = allreduce_(
        torch.tensor([float(value)], dtype=torch.float64, device=_device()), average, op
    )
    return float(out.item())


def allreduce_(tensor: torch.Tensor, average: bool = True, op: str = "sum") -> torch.Tensor:
    """:func:`allreduce` in place; returns ``tensor``."""
    if op not in _OPS:
        raise ValueError(f"op must be one of {', '.join(_OPS)}, got {op!r}")
    world.current()
    dist.all_reduce(tensor, op=_OPS[op])
    if average and op == "sum":
        tensor.div_(dist.get_world_size())
    return tensor


def allgather(tensor: torch.Tensor, group: ProcessGroup | None = None) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along dim 0, in rank order (first dims may differ);
    ``group``: among its ranks only (default: all)."""
    world.current()
    n = dist.get_world_size(group)
    t = tensor.detach().contiguous()
    if t.dim() == 0:
        t = t.reshape(1)
    rows = torch.tensor([t.shape[0]], dtype=torch.int64, device=t.device)
    sizes = [torch.zeros_like(rows) for _ in range(n)]
    dist.all_gather(sizes, rows, group=group)
    longest = max(int(s) for s in sizes)
    padded = torch.zeros((longest, *t.shape[1:]), dtype=t.dtype, device=t.device)
    padded[: t.shape[0]] = t
    parts = [torch.empty_like(padded) for _ in range(n)]
    dist.all_gather(parts, padded, group=group)
    return torch.cat([p[: int(s)] for p, s in zip(parts, sizes, strict=True)])


def broadcast(tensor: torch.Tensor, root_rank: int = 0) -> torch.Tensor:
    """A copy of rank ``root_rank``'s ``tensor`` on every rank (same shape on every rank)."""
    return broadcast_(tensor.detach().clone(), root_rank)


def broadcast_(tensor: torch.Tensor, root_rank: int = 0) -> torch.Tensor:
    """:func:`broadcast` in place; returns ``tensor``."""
    world.current()
    dist.broadcast(tensor, src=root_rank)
    return tensor


#: each join() call's number, the same on every rank (every rank calls join() alike)
_JOINS = itertools.count()


def join() -> int:
    """Wait until every rank has called ``join()``; return the rank that called it last.

    Arrivals are counted in the group's store (an atomic add): the rank whose add returns
    the group's size came last. Not by clocks: two hosts' clocks differ by more than the
    gaps between arrivals."""
    world.current()
    store = dist.distributed_c10d._get_default_store()  # the group's own, prefixed
    key = f"disttrain/join/{next(_JOINS)}"
    if store.add(key, 1) == dist.get_world_size():
        store.set(f"{key}/last", str(dist.get_rank()))
    dist.barrier()  # everyone has arrived, so the last has written its rank
    return int(store.get(f"{key}/last"))
