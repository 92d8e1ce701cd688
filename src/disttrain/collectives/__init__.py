"""L1: allreduce algorithms over point-to-point, one file each, registered by name."""

from disttrain.collectives import native  # noqa: F401  (registers itself)
from disttrain.collectives.base import ALGORITHMS, AllReduceAlgorithm, Cost, all_reduce, get

__all__ = ["ALGORITHMS", "AllReduceAlgorithm", "Cost", "all_reduce", "get"]
