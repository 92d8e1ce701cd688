"""Horovod's helpers over the collectives: parameters, optimizer state and Python objects.

``broadcast_object`` and ``allgather_object`` pickle, as Horovod's API promises (it uses
cloudpickle; plain pickle here, so lambdas and closures do not travel). Unpickling
runs code chosen by the sender: use them only among trusted ranks, over a trusted
network. ``hvd.elastic.TorchState`` keeps its plain values (those it syncs with
``broadcast_object``) in torchrun's store with :func:`object_bytes` for a restarted round.
Nothing else in this package pickles: parameters and optimizer state travel
as tensors, and the state's layout as JSON (:mod:`disttrain.dataparallel.broadcast`).
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from typing import Any

import torch

from disttrain.dataparallel import broadcast as dt_broadcast
from disttrain.dataparallel.fusion import flatten, unflatten
from disttrain.horovod import engine
from disttrain.horovod.ops import allgather, allgather_async, broadcast_, synchronize
from disttrain.horovod.process_sets import ProcessSet, global_process_set

__all__ = [
    "allgather_object",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
]


def broadcast_parameters(params: Any, root_rank: int) -> None:
    """Overwrite ``params`` with root's: a ``state_dict()`` (by sorted key) or a list of
    tensors or of ``(name, tensor)``. One flat broadcast per dtype (few messages)."""
    if isinstance(params, Mapping):
        tensors = [t for _, t in sorted(params.items(), key=lambda kv: kv[0])]
    elif isinstance(params, list):
        tensors = [p[1] if isinstance(p, tuple) else p for p in params]
    else:
        raise ValueError(f"invalid params of type: {type(params)}")
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for dtype, same in by_dtype.items():
        flat = flatten([t.detach() for t in same])
        broadcast_(flat, root_rank, name=f"parameters.{dtype}")
        with torch.no_grad():
            for t, value in zip(same, unflatten(flat, same), strict=True):
                t.copy_(value)


def broadcast_optimizer_state(
    optimizer: torch.optim.Optimizer, root_rank: int, model: Any = None
) -> None:
    """Give every rank root's optimizer state and hyper-parameters (lr, momentum, ...).

    The engine of disttrain's own ``broadcast_optimizer_state`` (tensors, JSON layout): a
    rank whose state is still empty gets root's layout. Unlike Horovod, no step with zero
    gradients is taken to create state first: where root has none, none is sent.
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    engine.current()
    dt_broadcast.broadcast_optimizer_state(optimizer, root_rank)


def object_bytes(obj: Any) -> bytes:
    """``obj`` as ``broadcast_object`` sends it (pickled: for trusted ranks only)."""
    return pickle.dumps(obj)


def object_from_bytes(data: bytes) -> Any:
    """The object :func:`object_bytes` made (unpickling runs the sender's choice of code)."""
    return pickle.loads(data)


def _to_bytes_tensor(obj: Any) -> torch.Tensor:
    return torch.frombuffer(bytearray(object_bytes(obj)), dtype=torch.uint8)


def broadcast_object(
    obj: Any,
    root_rank: int = 0,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """Root's ``obj`` on every member (pickled: trusted ranks only); root gets ``obj`` itself."""
    name = name or type(obj).__name__
    mine = engine.current().rank == root_rank
    payload = _to_bytes_tensor(obj) if mine else torch.empty(0, dtype=torch.uint8)
    length = torch.tensor([payload.numel()], dtype=torch.int64)
    broadcast_(length, root_rank, name=f"{name}.sz", process_set=process_set)
    if not mine:
        payload = torch.empty(int(length), dtype=torch.uint8)
    broadcast_(payload, root_rank, name=f"{name}.t", process_set=process_set)
    return obj if mine else object_from_bytes(payload.numpy().tobytes())


def allgather_object(obj: Any, name: str | None = None) -> list[Any]:
    """Every rank's ``obj``, in rank order (pickled: trusted ranks only)."""
    name = name or type(obj).__name__
    payload = _to_bytes_tensor(obj)
    sizes = synchronize(allgather_async(torch.tensor([payload.numel()]), name=f"{name}.sz"))
    data = allgather(payload, name=f"{name}.t")
    out, at = [], 0
    for n in sizes.tolist():
        out.append(object_from_bytes(data[at : at + n].numpy().tobytes()))
        at += n
    return out
