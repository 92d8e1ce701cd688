"""L1: allreduce algorithms over point-to-point, one file each, registered by name.

Every module of this package but the helpers below is an algorithm file and is
imported here, in name order (alltoall, butterfly, ..., tree: the order of
``ALGORITHMS``). Plug-ins named in ``$DISTTRAIN_PLUGINS`` register theirs when loaded
(:func:`disttrain.registry.load_plugins`).
Adding an algorithm is adding a file (docs/collectives.md, "Adding an algorithm").
"""

from disttrain.collectives.base import (
    ALGORITHMS,
    OPS,
    Algorithm,
    AlgorithmKind,
    AllReduceAlgorithm,
    Chooses,
    Cost,
    CostTerms,
    Op,
    Path,
    Starts,
    all_gather,
    all_reduce,
    always_starts,
    build,
    by_size,
    chooses,
    get,
    length_check_enabled,
    reduce_scatter,
    register,
    resolve,
    runs,
    set_length_check,
    start,
)
from disttrain.registry import import_submodules

#: Modules of this package that are not allreduce algorithms (adasum: Horovod's reduction,
#: not a sum; disttrain.horovod imports it when asked for).
HELPERS = ("adasum", "base", "checks", "chunks", "costs", "folding", "paths", "scratch", "shmseg")

__all__ = [
    "ALGORITHMS",
    "HELPERS",
    "OPS",
    "Algorithm",
    "AlgorithmKind",
    "AllReduceAlgorithm",
    "Chooses",
    "Cost",
    "CostTerms",
    "Op",
    "Path",
    "Starts",
    "all_gather",
    "all_reduce",
    "always_starts",
    "build",
    "by_size",
    "check_collectives",
    "chooses",
    "get",
    "length_check_enabled",
    "reduce_scatter",
    "register",
    "resolve",
    "runs",
    "set_length_check",
    "start",
]

import_submodules(__name__, skip=HELPERS)


def check_collectives(enabled: bool) -> None:
    """``--check-collectives``: the algorithms' length check and the checks everywhere else
    (broadcasts, native buckets) on or off together; the trainer and a script's run
    (``dt.distribute``) both set it here."""
    from disttrain.collectives.checks import set_checks_everywhere

    set_length_check(enabled)
    set_checks_everywhere(enabled)
