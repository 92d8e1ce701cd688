"""L0: the world (init, ranks, timeouts, typed errors), point-to-point and the byte meter."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from disttrain.comm.errors import CollectiveMismatch, DisttrainError, PeerFailure, UsageError
from disttrain.comm.meter import Meter, meter, record_send

#: world.py imports torch: its names load on first use (PEP 562), so the command line,
#: which needs only the errors at first, starts without torch (and Ctrl-C there is ours)
_WORLD = ("World", "current", "init", "local_rank", "rank", "shutdown", "size")


def __getattr__(name: str) -> Any:
    if name not in _WORLD:
        raise AttributeError(f"module 'disttrain.comm' has no attribute {name!r}")
    from disttrain.comm import world

    return getattr(world, name)


if TYPE_CHECKING:
    from disttrain.comm.world import World, current, init, local_rank, rank, shutdown, size

__all__ = [
    "CollectiveMismatch",
    "DisttrainError",
    "Meter",
    "PeerFailure",
    "UsageError",
    "World",
    "current",
    "init",
    "local_rank",
    "meter",
    "rank",
    "record_send",
    "shutdown",
    "size",
]
