"""Every rank's state (a nested dict of tensors and plain values) on every rank, unpickled.

``run.state_dict()`` must be complete on the rank that saves it (rank 0): each rank's
own part (its shard, its optimizer state, its error feedback) travels to the others.
The structure goes as JSON (dicts keep their key types: an optimizer's state is keyed
by int), the tensors as tensors: nothing is pickled (docs/reliability.md). Each rank
broadcasts its part in turn, so this is an all-gather: a checkpoint's cost, not a
step's.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from disttrain.dataparallel.broadcast import broadcast_json, broadcast_tensors

__all__ = ["allgather_states"]


def _encode(value: Any, tensors: list[torch.Tensor]) -> Any:
    """``value`` as JSON, its tensors replaced by their place in ``tensors``."""
    if isinstance(value, torch.Tensor):
        tensors.append(value.detach().cpu().contiguous())
        return {"t": len(tensors) - 1, "dtype": str(value.dtype)[6:], "shape": list(value.shape)}
    if isinstance(value, dict):
        return {"d": [[_encode(k, tensors), _encode(v, tensors)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return {"l" if isinstance(value, list) else "u": [_encode(v, tensors) for v in value]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"v": value}
    raise TypeError(f"a state holds a {type(value).__name__}, which is not sent (no pickle)")


def _decode(spec: Any, tensors: list[torch.Tensor]) -> Any:
    if "t" in spec:
        return tensors[spec["t"]]
    if "d" in spec:
        return {_decode(k, tensors): _decode(v, tensors) for k, v in spec["d"]}
    if "l" in spec:
        return [_decode(v, tensors) for v in spec["l"]]
    if "u" in spec:
        return tuple(_decode(v, tensors) for v in spec["u"])
    return spec["v"]


def _empty_like(spec: Any, out: list[torch.Tensor]) -> None:
    """The tensors a spec names, allocated in order, for the broadcast to fill."""
    if "t" in spec:
        out.append(torch.empty(spec["shape"], dtype=getattr(torch, spec["dtype"])))
    for key in ("d", "l", "u"):
        for item in spec.get(key, ()):
            for part in item if key == "d" else (item,):
                _empty_like(part, out)


def allgather_states(state: dict[str, Any], group: ProcessGroup | None = None) -> list[Any]:
    """Every rank's ``state`` of ``group``, by rank, on every rank (tensors on the CPU)."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return [state]
    me = dist.get_rank(group)
    states = []
    for root in range(dist.get_world_size(group)):
        tensors: list[torch.Tensor] = []
        spec = _encode(state, tensors) if me == root else None
        spec = broadcast_json(spec, root, group)
        if me != root:
            tensors = []
            _empty_like(spec, tensors)
        broadcast_tensors(tensors, root, group)
        states.append(state if me == root else _decode(spec, tensors))
    return states
