"""L1: allreduce algorithms over point-to-point, one file each, registered by name."""

# Importing each module registers its algorithm (in this order in ALGORITHMS).
from disttrain.collectives import (  # noqa: F401
    alltoall,
    butterfly,
    halving_doubling,
    native,
    ring,
    roundrobin,
    star,
    tree,
)
from disttrain.collectives.base import (
    ALGORITHMS,
    AllReduceAlgorithm,
    Cost,
    all_reduce,
    get,
    length_check_enabled,
    set_length_check,
)

__all__ = [
    "ALGORITHMS",
    "AllReduceAlgorithm",
    "Cost",
    "all_reduce",
    "get",
    "length_check_enabled",
    "set_length_check",
]
