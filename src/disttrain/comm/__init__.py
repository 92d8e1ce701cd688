"""L0: the world (init, ranks, timeouts, typed errors), point-to-point and the byte meter."""

from disttrain.comm.errors import CollectiveMismatch, DisttrainError, PeerFailure, UsageError
from disttrain.comm.meter import Meter, meter, record_send
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
