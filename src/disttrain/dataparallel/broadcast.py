"""Make replicas equal: broadcast parameters and optimizer state from one rank (Horovod's API).

Nothing is pickled: tensors travel as flat buffers of their own dtype, and the
optimizer state's layout (which tensors, which shapes, which plain numbers)
travels as JSON bytes in a uint8 tensor.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from disttrain.collectives.checks import check_call, checks_everywhere
from disttrain.comm.meter import record_send
from disttrain.comm.p2p import global_rank
from disttrain.dataparallel.fusion import flatten, unflatten

__all__ = [
    "broadcast_json",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "broadcast_tensors",
]


def broadcast_tensors(
    tensors: list[torch.Tensor], src: int = 0, group: ProcessGroup | None = None
) -> None:
    """Copy ``tensors`` from group rank ``src`` to all ranks: a flat message per dtype, metered."""
    n = dist.get_world_size(group)
    if n == 1 or not tensors:
        return
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    me = dist.get_rank(group)
    for same in by_dtype.values():
        flat = flatten([t.detach() for t in same])
        if checks_everywhere():  # --check-collectives: the same call on every rank?
            check_call(f"broadcast/{flat.dtype}", flat.numel(), group)
        dist.broadcast(flat, src=global_rank(group, src), group=group)
        if me == src:
            # gloo broadcasts from the root to each rank in turn
            for peer in range(n):
                if peer != src:
                    nbytes = flat.numel() * flat.element_size()
                    record_send(global_rank(group, peer), nbytes, 1, True)
        else:
            with torch.no_grad():
                for t, v in zip(same, unflatten(flat, same), strict=True):
                    t.copy_(v)


def broadcast_parameters(
    params: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
    root_rank: int = 0,
    group: ProcessGroup | None = None,
) -> None:
    """Overwrite ``params`` (a ``state_dict()`` or ``named_parameters()``) with root's values."""
    items = list(params.items()) if isinstance(params, Mapping) else list(params)
    broadcast_tensors([t for _, t in sorted(items, key=lambda kv: kv[0])], root_rank, group)


def _bytes_tensor(payload: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else torch.empty(0)


def _describe(value: Any) -> dict[str, Any]:
    if torch.is_tensor(value):
        return {"tensor": str(value.dtype).removeprefix("torch."), "shape": list(value.shape)}
    return {"value": value}


def broadcast_json(obj: Any, root: int = 0, group: ProcessGroup | None = None) -> Any:
    """Root's JSON-able ``obj`` on every rank (as JSON bytes in a uint8 tensor: no pickle)."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return json.loads(json.dumps(obj))  # the copy every rank gets
    me = dist.get_rank(group)
    # nccl broadcasts device tensors only
    device = torch.device("cuda") if dist.get_backend(group) == "nccl" else torch.device("cpu")
    payload = json.dumps(obj).encode() if me == root else b""
    length = torch.tensor([len(payload)], dtype=torch.int64, device=device)
    dist.broadcast(length, src=global_rank(group, root), group=group)
    if me == root:
        data = _bytes_tensor(payload).to(device)
    else:
        data = torch.empty(int(length), dtype=torch.uint8, device=device)
    dist.broadcast(data, src=global_rank(group, root), group=group)
    return json.loads(bytes(data.cpu().tolist()).decode())


def _plain(value: Any) -> bool:
    """A hyper-parameter JSON carries as it is: a number, flag, string or None, or a tuple or
    list of them (Adam's ``betas``)."""
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (int, float, bool, str))


def _as_local(value: Any, local: Any) -> Any:
    """``value`` from JSON in the type this rank's optimizer holds (a tuple came as a list)."""
    return tuple(value) if isinstance(local, tuple) and isinstance(value, list) else value


def broadcast_optimizer_state(
    optimizer: torch.optim.Optimizer, root_rank: int = 0, group: ProcessGroup | None = None
) -> None:
    """Give every rank root's optimizer state (momentum buffers, Adam moments, step, lr...).

    Ranks whose state is still empty (buffers are created lazily on the first
    step) receive root's layout and allocate it before the tensors arrive.
    """
    if dist.get_world_size(group) == 1:
        return
    me = dist.get_rank(group)
    sd = optimizer.state_dict()
    layout: dict[str, Any] = {"state": {}, "groups": []}
    if me == root_rank:
        for idx, entry in sd["state"].items():
            layout["state"][str(idx)] = {
                k: _describe(v)
                for k, v in entry.items()
                if torch.is_tensor(v) or isinstance(v, (int, float, bool))
            }
        for g in sd["param_groups"]:
            layout["groups"].append({k: v for k, v in g.items() if k != "params" and _plain(v)})
    layout = broadcast_json(layout, root_rank, group)
    state: dict[int, dict[str, Any]] = {}
    tensors: list[torch.Tensor] = []
    for idx, entry in sorted(layout["state"].items(), key=lambda kv: int(kv[0])):
        mine = sd["state"].get(int(idx), {})
        out: dict[str, Any] = {}
        for k, spec in sorted(entry.items()):
            if "tensor" in spec:
                t = mine.get(k) if me == root_rank else None
                if t is None:
                    t = torch.empty(spec["shape"], dtype=getattr(torch, spec["tensor"]))
                out[k] = t
                tensors.append(t)
            else:
                out[k] = spec["value"]
        state[int(idx)] = out
    broadcast_tensors(tensors, root_rank, group)
    if me != root_rank:
        groups = [
            {**g, **{k: _as_local(v, g.get(k)) for k, v in hyper.items()}}
            for g, hyper in zip(sd["param_groups"], layout["groups"], strict=True)
        ]
        optimizer.load_state_dict({"state": state, "param_groups": groups})
