"""L2: data-parallel strategies, one file each, registered by name."""

from disttrain.strategies import (
    allreduce,  # noqa: F401  (registers itself)
    ps,  # noqa: F401  (registers itself and its settings)
)
from disttrain.strategies.base import STRATEGIES, Strategy, get, register

__all__ = ["STRATEGIES", "Strategy", "get", "register"]
