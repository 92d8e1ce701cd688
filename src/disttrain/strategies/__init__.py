"""L3: data-parallel strategies, one file each, registered by name."""

from disttrain.strategies import (  # noqa: F401  (register themselves)
    allreduce,
    decentralized,
    hybrid,
    localsgd,
    pipeline,
    ps,
    tensor,
)
from disttrain.strategies.base import STRATEGIES, Strategy, get, register

__all__ = ["STRATEGIES", "Strategy", "get", "register"]
