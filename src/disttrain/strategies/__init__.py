"""L2: data-parallel strategies, one file each, registered by name."""

import disttrain.strategies.hybrid  # noqa: F401  (registers itself)
import disttrain.strategies.pipeline  # noqa: F401  (registers itself)
import disttrain.strategies.tensor  # noqa: F401  (registers itself)
from disttrain.strategies import allreduce  # noqa: F401  (registers itself)
from disttrain.strategies.base import STRATEGIES, Strategy, get, register

__all__ = ["STRATEGIES", "Strategy", "get", "register"]
